"""Command line: ``python -m perfkernels info | bench | check | history | docs``.

info   print the build, the CPU features and the chosen ISA level (show_runtime), the
       transparent-huge-page mode and whether a placed test table really got huge pages
bench  time every kernel family on its default workload, for every ISA level this CPU runs,
       side by side with NumPy and PyTorch (when installed), single-threaded; prints GB/s and ratios.
       ``--family dlrm``: the DLRM example end to end, stock PyTorch against perfkernels.torch
       .convert(), both at PyTorch's default thread count (``--model rm1|rm2|rm3``: the
       embedding-heavy model classes instead of the Criteo-shaped one); ``--latency``: serving
       latency of the reference DLRM, p50 / p99 per batch size (``--threads 1,2``: per count).
       ``--scaling``: the thread-scaling view instead (ours at 1, 2, ... threads, PyTorch at 1
       thread and at its default).  ``--cap-isa avx2``: both sides held to AVX2, as on a CPU
       that has nothing above it
check  run small inputs of every kernel on every ISA level and compare with perfkernels.reference
history  asv performance history: time HEAD (--current) or the last N commits at every ISA level of
         this CPU, or publish the committed results (--publish-only); from a checkout
docs   build the documentation site (Sphinx, warnings as errors) from a checkout's docs/, check
       that every public name is documented and every internal link resolves, and print where
       it is (needs pip install ".[docs]")
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

from . import _registry


def _progress(done: int, total: int, label: str, start: float) -> None:
    if not sys.stderr.isatty() and done not in (0, total):
        return
    width = 28
    filled = int(width * done / max(total, 1))
    elapsed = time.perf_counter() - start
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                     f"{elapsed:5.1f}s {label[:40]:<40}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _fmt_gbs(v: float | None) -> str:
    return "-" if v is None else f"{v:7.2f}"


def _fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:6.2f}x"


def _fmt_time(t: float) -> str:
    return f"{t * 1e6:9.1f} us" if t < 1e-3 else f"{t * 1e3:9.3f} ms"


def run_bench(families: list[str] | None, quick: bool, isas: list[str] | None, gpu: bool,
              repeat: int) -> list[dict]:
    import perfkernels as pk
    from perfkernels import benchsuite

    benchsuite.torch_or_none()  # PyTorch baselines on one thread, ours too (main sets it)
    chosen = families or benchsuite.families()
    if gpu:
        chosen = ["cuda"]
    elif "cuda" in chosen and not families:
        chosen = [f for f in chosen if f != "cuda"]
    levels = isas or list(pk.available_isas())
    cases = []
    for fam in chosen:
        cases.extend(benchsuite.load_cases(fam, quick))
    if not cases:
        print("no benchmark cases" + (" (no GPU available)" if gpu else ""))
        return []
    min_time = 0.01 if quick else 0.05
    rows = []
    total = sum((1 if c.ours_gpu else len(levels)) + len(c.baselines) for c in cases)
    done, start = 0, time.perf_counter()
    _progress(0, total, "", start)
    for case in cases:
        # ours on every level and the baselines, sampled in turn (interleaved_times), so the
        # ratios compare runs taken side by side under the same machine conditions
        _progress(done, total, case.name, start)
        fns = {}
        if case.ours_gpu:
            fns["ours:gpu"] = case.ours
        else:
            for level in levels:
                fns["ours:" + level] = case.ours
        for name, fn in case.baselines.items():
            fns["base:" + name] = fn

        def context(key):
            kind, name = key.split(":", 1)
            return pk.use_isa(name) if kind == "ours" and name != "gpu" else contextlib.nullcontext()

        times = benchsuite.interleaved_times(fns, repeat=repeat, min_time=min_time, context=context)
        row = {"case": case, "ours": {}, "base": {}}
        for key, t in times.items():
            kind, name = key.split(":", 1)
            row["ours" if kind == "ours" else "base"][name] = t
        done += len(fns)
        rows.append(row)
    _progress(total, total, "done", start)
    return rows


#: baselines of the scaling view, by preference; each runs on PyTorch's threads
TORCH_THREADED_BASELINES = ("torch", "torch loop", "fbgemm")


def run_scaling(families: list[str] | None, quick: bool, counts: list[int], repeat: int) -> list[dict]:
    """The cases marked ``scaling``: ours at every thread count in ``counts`` and PyTorch at one
    thread and at its default (all the cores it sees), all sampled in turn (interleaved)."""
    import perfkernels as pk
    from perfkernels import benchsuite

    torch = benchsuite.torch_or_none()
    torch_default = None
    if torch is not None:
        torch_default = max(counts)
    cases = [c for fam in (families or benchsuite.families()) if fam != "cuda"
             for c in benchsuite.load_scaling_cases(fam, quick)]
    rows = []
    start = time.perf_counter()
    for i, case in enumerate(cases):
        _progress(i, len(cases), case.name, start)
        fns = {f"ours:{n}": case.ours for n in counts}
        # the baseline runs on PyTorch's intra-op threads (FBGEMM's CPU TBE included)
        base = next((b for b in TORCH_THREADED_BASELINES if b in case.baselines), None)
        if base is not None:
            fns["torch:1"] = case.baselines[base]
            fns[f"torch:{torch_default}"] = case.baselines[base]

        @contextlib.contextmanager
        def context(key):
            kind, n = key.split(":")
            if kind == "ours":
                old = pk.get_num_threads()
                pk.set_num_threads(int(n))
                try:
                    yield
                finally:
                    pk.set_num_threads(old)
            else:
                old = torch.get_num_threads()
                torch.set_num_threads(int(n))
                try:
                    yield
                finally:
                    torch.set_num_threads(old)

        times = benchsuite.interleaved_times(fns, repeat=repeat, min_time=0.05 if not quick else 0.01,
                                             context=context)
        rows.append({"case": case, "times": times, "counts": counts, "torch_default": torch_default,
                     "base": base})
    _progress(len(cases), len(cases), "done", start)
    return rows


def print_scaling(rows: list[dict]) -> None:
    if not rows:
        print("no scaling cases")
        return
    counts = rows[0]["counts"]
    td = rows[0]["torch_default"]
    width = max(len(r["case"].name) for r in rows) + 2
    head = (f"{'case':<{width}}" + "".join(f"{f'{n} thr':>11}" for n in counts)
            + "".join(f"{f'x{n}/1':>8}" for n in counts[1:])
            + (f"{'base 1':>11}{f'base {td}':>11}{'vs base 1':>11}{f'vs base {td}':>12}  base"
               if td else ""))
    print("\nThread scaling: time per call; x n/1 = our 1-thread time / our n-thread time; "
          "vs base = the baseline's time / ours (1 vs 1 thread, and at PyTorch's default thread "
          "count vs ours at the same count); base = the baseline (PyTorch, or FBGEMM's CPU TBE "
          "on PyTorch's threads)")
    print(head)
    print("-" * len(head))
    for r in rows:
        t = r["times"]
        ours = [t[f"ours:{n}"] for n in counts]
        line = f"{r['case'].name:<{width}}" + "".join(f"{_fmt_time(x):>11}" for x in ours)
        line += "".join(f"{ours[0] / x:7.2f}x" for x in ours[1:])
        if td and f"torch:{td}" in t:
            line += (f"{_fmt_time(t['torch:1']):>11}{_fmt_time(t[f'torch:{td}']):>11}"
                     f"{_fmt_ratio(t['torch:1'] / ours[0]):>11}"
                     f"{_fmt_ratio(t[f'torch:{td}'] / t[f'ours:{td}']):>12}  {r['base']}")
        print(line)


def print_table(rows: list[dict], copy_gbs: float | None) -> None:
    if not rows:
        return
    order = _registry.NAMES + ("gpu",)  # the CPU levels lowest first, then the CUDA variant
    levels = sorted({lv for r in rows for lv in r["ours"]}, key=order.index)
    bases = sorted({b for r in rows for b in r["base"]})
    width = max(len(r["case"].name) for r in rows) + 2
    col = {b: max(9, len(b) + 2) for b in bases}
    head = (f"{'case':<{width}}" + "".join(f"{lv:>9}" for lv in levels)
            + "".join(f"{b:>{col[b]}}" for b in bases)
            + f"{'best time':>14}" + "".join(f"{'vs ' + b:>{col[b] + 4}}" for b in bases)
            + ("  % copy" if copy_gbs else ""))
    print("\nGB/s of the bytes each kernel must touch (single thread; median of repetitions taken in turn)")
    print(head)
    print("-" * len(head))
    family = None
    for r in rows:
        case = r["case"]
        if case.family != family:
            family = case.family
            print(f"[{family}]")
        gbs = {k: case.nbytes / t / 1e9 for k, t in r["ours"].items()}
        best = min(r["ours"].values())
        line = f"{case.name:<{width}}" + "".join(f"{_fmt_gbs(gbs.get(lv)):>9}" for lv in levels)
        line += "".join(f"{_fmt_gbs(case.nbytes / r['base'][b] / 1e9 if b in r['base'] else None):>{col[b]}}"
                        for b in bases)
        line += f"{_fmt_time(best):>14}"
        line += "".join(f"{_fmt_ratio(r['base'][b] / best if b in r['base'] else None):>{col[b] + 4}}"
                        for b in bases)
        if copy_gbs:
            line += f"  {100 * case.nbytes / best / 1e9 / copy_gbs:5.0f}%"
        print(line)
    if copy_gbs:
        print(f"\ncopy bandwidth (np.copyto of 64 MiB, read + write): {copy_gbs:.2f} GB/s")
    print("ratios: the baseline's time / our best ISA's time (higher is better for us)")


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'perfkernels[bench]'")
    names = [r["case"].name for r in rows]
    bases = sorted({b for r in rows for b in r["base"]})
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    y = np.arange(len(rows))
    h = 0.8 / max(len(bases), 1)
    for i, b in enumerate(bases):
        vals = [r["base"][b] / min(r["ours"].values()) if b in r["base"] else 0 for r in rows]
        ax.barh(y + i * h, vals, height=h, label=f"speed-up vs {b}")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(y + h * (len(bases) - 1) / 2, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("baseline time / perfkernels time (log scale)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart saved to {path}")


def cmd_check(args) -> int:
    import perfkernels as pk
    from perfkernels import _selfcheck

    failures = 0
    for check in _selfcheck.checks(args.family):
        for level in pk.available_isas():
            with pk.use_isa(level):
                got = check.run()
            ok, detail = _selfcheck.compare(check, got)
            failures += not ok
            print(f"{'ok' if ok else 'FAIL':<5} {check.family:<10} {check.name:<34} {level:<7} {detail}")
    print("all checks passed" if not failures else f"{failures} check(s) FAILED")
    return 1 if failures else 0


#: How PyTorch is held to an ISA level: ATen's kernel dispatch and FBGEMM's JIT (which serves
#: torch's embedding bags and quantized ops) each read one variable, once, when first used.
TORCH_CAP_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}}


def cap_isa(level: str) -> str:
    """Hold both sides of the bench to ``level``, as on a CPU with nothing above it: PyTorch
    through :data:`TORCH_CAP_ENV` (set here, before torch is imported) and perfkernels through
    :func:`perfkernels.use_isa` (entered by the caller).  Returns the line that says so.

    The cores stay this CPU's, so this stands in for an AVX2-only CPU's instruction mix, not for
    its microarchitecture (an AMD Zen 1 has 128-bit vector units, a Zen 4 or a Xeon 256/512-bit
    ones)."""
    if "torch" in sys.modules:
        raise SystemExit("error: --cap-isa must take effect before PyTorch is imported")
    os.environ.update(TORCH_CAP_ENV[level])
    settings = ", ".join(f"{k}={v}" for k, v in TORCH_CAP_ENV[level].items())
    return f"both sides held to {level}: perfkernels at {level}, PyTorch with {settings}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfkernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print the build, CPU features and chosen ISA level")
    b = sub.add_parser("bench", help="benchmark against NumPy and PyTorch")
    b.add_argument("--quick", action="store_true", help="small shapes, a few seconds per family")
    b.add_argument("--family", action="append", help="only this family (repeatable)")
    b.add_argument("--isa", action="append", help="only this ISA level (repeatable)")
    b.add_argument("--gpu", action="store_true", help="the CUDA variant (needs a GPU and CuPy)")
    b.add_argument("--repeat", type=int, default=7, help="timed samples per measurement (median)")
    b.add_argument("--plot", metavar="FILE.png", help="save a chart of the speed-ups")
    b.add_argument("--model", choices=["criteo", "rm1", "rm2", "rm3"], default="criteo",
                   help="with --family dlrm: the model class (examples/dlrm.py --model)")
    b.add_argument("--latency", action="store_true",
                   help="with --family dlrm: serving latency of the reference DLRM, p50 / p99 "
                        "per batch size (examples/dlrm.py --latency; --threads: thread counts)")
    b.add_argument("--scaling", action="store_true",
                   help="thread-scaling view: ours at 1, 2, ... threads beside PyTorch")
    b.add_argument("--threads", metavar="N,M,...",
                   help="thread counts of the scaling view (default: 1 up to the cores this "
                        "process may use)")
    b.add_argument("--cap-isa", choices=sorted(TORCH_CAP_ENV),
                   help="hold PyTorch and perfkernels to this ISA level, as on a CPU that has "
                        "nothing above it (e.g. an AVX2-only AMD EPYC measured on an AVX-512 CPU)")
    c = sub.add_parser("check", help="compare every ISA path with the NumPy references on small inputs")
    c.add_argument("--family", action="append", choices=_registry.FAMILY_NAMES,
                   help="only this family (repeatable)")
    from . import _history
    _history.add_parser(sub)
    from . import _docs
    _docs.add_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "info":
        import perfkernels
        from perfkernels import _placement
        perfkernels.show_runtime()
        print("\n".join(_placement.info_lines()))
        return 0
    if args.command == "check":
        return cmd_check(args)
    if args.command == "history":
        return _history.cmd_history(args)
    if args.command == "docs":
        return _docs.cmd_docs(args)

    stack = contextlib.ExitStack()
    if args.cap_isa:
        import perfkernels
        if args.isa and set(args.isa) != {args.cap_isa}:
            raise SystemExit(f"error: --isa {' '.join(args.isa)} contradicts --cap-isa {args.cap_isa}")
        args.isa = [args.cap_isa]
        print(cap_isa(args.cap_isa))
        stack.enter_context(perfkernels.use_isa(args.cap_isa))
    with stack:
        return _bench(args)


def _parallel_check(n: str) -> int:
    from perfkernels import _parallel
    return _parallel.check_num_threads(int(n), "--threads")


def _bench(args) -> int:
    """The ``bench`` subcommand."""
    if args.family and "dlrm" in args.family:
        # end to end with PyTorch at its default thread count, so before OMP_NUM_THREADS below
        from perfkernels.benchsuite import dlrm
        if args.latency:
            try:
                threads = ([_parallel_check(n) for n in args.threads.split(",")]
                           if args.threads else None)
            except ValueError as exc:
                raise SystemExit(f"--threads {args.threads!r}: {exc}")
            dlrm.run(args.quick, args.plot, args.model, latency=True, threads=threads)
        else:
            dlrm.run(args.quick, args.plot, args.model)
        args.family = [f for f in args.family if f != "dlrm"]
        if not args.family:
            return 0

    import perfkernels
    from perfkernels import _parallel, benchsuite
    repeat = max(1, args.repeat if not args.quick else min(args.repeat, 3))
    if args.scaling:
        try:
            counts = ([_parallel.check_num_threads(int(n), "--threads") for n in args.threads.split(",")]
                      if args.threads else list(range(1, _parallel.available_cores() + 1)))
        except ValueError as exc:
            raise SystemExit(f"--threads {args.threads!r}: {exc}")
        print(f"perfkernels {perfkernels.__version__}: active ISA {perfkernels.active_isa()}, "
              f"thread counts: {', '.join(map(str, counts))}")
        print_scaling(run_scaling(args.family, args.quick, counts, repeat))
        return 0
    if os.environ.get("OMP_NUM_THREADS") is None:
        os.environ["OMP_NUM_THREADS"] = "1"
    perfkernels.set_num_threads(1)   # this view compares kernels thread for thread
    print(f"perfkernels {perfkernels.__version__}: active ISA {perfkernels.active_isa()}, "
          f"levels timed: {', '.join(args.isa or perfkernels.available_isas())}")
    copy_gbs = None if args.gpu else benchsuite.copy_bandwidth(repeat=3 if args.quick else 5)
    rows = run_bench(args.family, args.quick, args.isa, args.gpu, repeat)
    print_table(rows, copy_gbs)
    if args.plot and rows:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
