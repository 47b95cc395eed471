/* perfkernels: how to read the history (written by `python -m perfkernels history`). */
(function ($) {
    var RATIO = /PyTorch's time/, PARITY = {yaxis: {from: 1, to: 1}, color: "#222", lineWidth: 1};
    function benchmarkOf(placeholder) {
        var box = $(placeholder).closest('.benchmark-plot[id^="summarygrid-"]');
        if (box.length) return box.attr("id").slice("summarygrid-".length);
        if ($(placeholder).is("#main-graph, #overview"))
            return decodeURIComponent(window.location.hash.slice(1)).split("?")[0];
        return null;
    }
    function yRange(data) {
        var lo = Infinity, hi = -Infinity;
        $.each(data, function (i, series) {
            $.each(series.data || series, function (j, p) {
                if (p && p[1] !== null && isFinite(p[1])) { lo = Math.min(lo, p[1]); hi = Math.max(hi, p[1]); }
            });
        });
        return [lo, hi];
    }
    var plot = $.plot;
    $.plot = function (placeholder, data, options) {
        var name = benchmarkOf(placeholder), json = $.asv && $.asv.main_json;
        var bm = name && json && json.benchmarks[name];
        options = options || {};
        if (bm && RATIO.test(bm.unit || "")) {
            options.grid = options.grid || {};
            options.grid.markings = (options.grid.markings || []).concat([PARITY]);
            options.yaxis = options.yaxis || {};
            var r = yRange(data), y = options.yaxis;      // keep the parity line in view
            if (Math.max(y.max == null ? r[1] : y.max, r[1]) < 1.1) y.max = 1.1;
            if (Math.min(y.min == null ? r[0] : y.min, r[0]) > 0.9) y.min = 0.9;
            if (isFinite(r[0]) && isFinite(r[1])) {        // and no point on the frame's edge
                var lo = y.min == null ? r[0] : Math.min(y.min, r[0]);
                var hi = y.max == null ? r[1] : Math.max(y.max, r[1]);
                var pad = 0.05 * Math.max(hi - lo, 0.1);
                y.min = Math.max(0, Math.min(lo, r[0] - pad));
                y.max = Math.max(hi, r[1] + pad);
            }
        }
        var headline = bm && /^headline\./.test(name);
        if (headline && $(placeholder).closest('.benchmark-plot[id^="summarygrid-"]').length) {
            options.series = options.series || {};        // a single commit's point shows too
            options.series.points = {show: true, radius: 2, lineWidth: 1};
            options.yaxis = options.yaxis || {};          // and not on the frame's top edge
            options.yaxis.max = Math.max(options.yaxis.max == null ? 0 : options.yaxis.max,
                                         yRange(data)[1] * 1.15);
            var box = $(placeholder).parent();
            if (!box.find(".pk-reading").length) {
                box.css("position", "relative").append(
                    $('<div class="pk-reading" style="position: absolute; right: 8px; bottom: 6px; '
                      + 'font-size: 11px; color: #333; background: rgba(255,255,255,0.8)">')
                    .text((RATIO.test(bm.unit) ? "our time / PyTorch's, 1 = parity: " : "")
                          + "lower is better"
                          + (window.PK_SUMMARY_SOURCES && window.PK_SUMMARY_SOURCES[name]
                             ? "; " + window.PK_SUMMARY_SOURCES[name] : "")));
            }
        }
        if (headline && $(placeholder).is("#main-graph")) {
            options.series = options.series || {};        // a lone point as a filled dot
            options.series.points = $.extend({}, options.series.points,
                                             {show: true, radius: 4, fill: true, fillColor: false});
        }
        if (headline && $(placeholder).is("#main-graph") && options.yaxis
                && !/lower is better/.test(options.yaxis.axisLabel || "")) {
            options.yaxis.axisLabel = (options.yaxis.axisLabel || "") + " (lower is better)";
        }
        if (bm && $(placeholder).is("#main-graph") && options.xaxis && options.xaxis.mode !== "time") {
            var revs = [];
            $.each(data, function (i, series) {
                $.each(series.data || series, function (j, p) { if (p && revs.indexOf(p[0]) < 0) revs.push(p[0]); });
            });
            revs.sort(function (a, b) { return a - b; });
            var step = Math.max(1, Math.ceil(revs.length / 8));
            options.xaxis.ticks = revs.filter(function (v, i) { return i % step === 0; });
            options.xaxis.tickFormatter = function (v) {
                var hash = json.revision_to_hash[Math.round(v)];
                return hash ? hash.slice(0, 8) : "";
            };
            options.xaxis.axisLabel = "commit";
        }
        return plot.call(this, placeholder, data, options);
    };
    $.extend($.plot, plot);
})(jQuery);
