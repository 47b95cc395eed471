"""MLPerf's DLRM-v2 (Criteo 1TB, multi-hot, DCNv2) on perfkernels' tables, at any size.

The model of the MLPerf reference: 26 tables of D = 128 with the rows of
:data:`perfkernels.datasets.DLRM_V2_ROWS` divided by ``--scale`` (1: full size, 204M rows), bags of
:data:`~perfkernels.datasets.DLRM_V2_BAG_SIZES` IDs (214 lookups a pair); a bottom MLP
13-512-256-128; a low-rank cross network (3 layers, rank 512) on the concatenation of the bottom MLP's output and
the 26 pooled rows (27 x 128 = 3456 columns); a top MLP 1024-1024-512-256-1.

The tables never exist in float32: each is built block by block from a seeded initialiser
(TorchRec's uniform(-sqrt(1/rows), sqrt(1/rows))) in the format ``--bits`` asks for:

``--bits 4`` / ``8`` / ``float16`` / ``float32``
    every table in that format;
``--bits 4:big,8:small``
    the six big tables (a million rows and more at full size) in 4-bit rows, the others in 8-bit.

With ``--tables-dir DIR`` the tables are table files there (built on the first run, mapped by
every later one, shared between processes). The model is written as a TorchRec user writes it:
``forward(dense, features)``, the sparse features a ``KeyedJaggedTensor`` looked up by a
:class:`perfkernels.torch.EmbeddingBagCollection` over the 26 tables (one call for all of them),
the pooled rows concatenated with the bottom MLP's output into the cross network's input;
:func:`perfkernels.torch.optimize` makes the lookups and that concatenation one op.  Inputs are
:class:`perfkernels.datasets.CriteoLike` samples (power-law IDs, MLPerf's multi-hot bags,
100-700 pairs a sample).

The dense part (bottom MLP, cross network, top MLP) is torch's, run as ``--dense``: ``eager``
(float32), ``compiled`` (float32, ``torch.compile`` by Inductor with freezing:
:func:`perfkernels.torch.compile_frozen`) or ``int8`` (torchao's PT2E flow with the x86 Inductor
quantizer, calibrated on ``--calibration`` batches and compiled with freezing:
:func:`perfkernels.torch.quantize_dense`; torchao is imported only then), or a list of them, each
run at each of ``--threads`` (e.g. ``1,2``), reporting pairs/s, p50/p99 per sample and the
lookups' time.

With TorchRec installed, ``--check-torchrec`` builds TorchRec's ``DLRM_DCN`` with the same
weights (its float tables: our tables dequantized, so only where float32 tables fit) and checks
that the predictions agree.

    python examples/dlrm_v2.py --scale 64 --bits 4:big,8:small --samples 20
    python examples/dlrm_v2.py --scale 256 --samples 12 --threads 1,2 --dense eager,compiled,int8
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

import perfkernels as pk
from perfkernels import datasets, tables
from perfkernels.torch import KeyedJaggedTensor

DIM = 128
BOTTOM = (512, 256, DIM)
TOP = (1024, 1024, 512, 256, 1)
CROSS_LAYERS, CROSS_RANK = 3, 512
#: full-size rows from which a table counts as big for ``--bits 4:big,8:small``
BIG_ROWS = 1_000_000


def table_formats(spec: str, full_rows: Sequence[int]) -> list:
    """Each table's format from ``--bits``: one format for all, or ``A:big,B:small``."""
    if ":" not in spec:
        return [tables.table_format(int(spec) if spec.isdigit() else spec)] * len(full_rows)
    parts = dict(p.split(":")[::-1] for p in spec.split(","))
    if set(parts) != {"big", "small"}:
        raise ValueError(f"--bits with ':' must name big and small, e.g. 4:big,8:small; got "
                         f"{spec!r}")
    big, small = (tables.table_format(int(parts[k]) if parts[k].isdigit() else parts[k])
                  for k in ("big", "small"))
    return [big if r >= BIG_ROWS else small for r in full_rows]


def build_or_map_tables(rows: Sequence[int], fmts: Sequence, seed: int,
                        tables_dir: Optional[str], progress: Optional[bool] = None,
                        load: bool = True) -> list:
    """The 26 tables as NumPy arrays: built in memory, or table files in ``tables_dir`` (built
    once, then mapped read-only; ``load=False``: only build the missing files)."""
    sources = {f"t{i}": tables.SeededInit(r, DIM, seed=seed + i, dist="uniform")
               for i, r in enumerate(rows)}
    if tables_dir is None:
        built = tables.build_tables(sources, dict(zip(sources, fmts)), progress=progress)
        return [built[n] for n in sources]
    os.makedirs(tables_dir, exist_ok=True)
    out = []
    for (name, src), fmt in zip(sources.items(), fmts):
        path = table_path(tables_dir, len(out), src.rows, fmt, seed)
        if not os.path.exists(path):
            tables.build_table_file(path, src, fmt, progress=progress)
        if not load:
            out.append(path)
            continue
        # populate: map every page now (0.4 s for the full-size tables in the page cache), so
        # that no answer pays a page fault for a row it touches first
        out.append(tables.load_table(path, fmt=fmt, rows=src.rows, dim=DIM, populate=True))
    return out


def mlp(sizes: Sequence[int], in_features: int, last_relu: bool = True) -> nn.Sequential:
    layers: list = []
    for i, n in enumerate(sizes):
        layers.append(nn.Linear(in_features, n))
        if last_relu or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        in_features = n
    return nn.Sequential(*layers)


class LowRankCrossNet(nn.Module):
    """DCNv2's low-rank cross layers: ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``."""

    def __init__(self, width: int, layers: int, rank: int) -> None:
        super().__init__()
        self.V = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(torch.empty(rank, width)))
                                  for _ in range(layers))
        self.W = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(torch.empty(width, rank)))
                                  for _ in range(layers))
        self.b = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for V, W, b in zip(self.V, self.W, self.b):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, V), W) + b) + x
        return x


def table_path(tables_dir: str, i: int, rows: int, fmt, seed: int) -> str:
    """Where table ``i`` of ``rows`` rows in format ``fmt`` lives in ``tables_dir``."""
    return os.path.join(tables_dir, f"t{i}_{rows}x{DIM}_{fmt}_seed{seed + i}.pkt")


def collection_of(tabs: Sequence[np.ndarray], fmts: Sequence, keys: Sequence[str]):
    """An :class:`perfkernels.torch.EmbeddingBagCollection` over NumPy tables in memory (used in
    place), table ``t<i>`` read by feature ``keys[i]``."""
    from perfkernels.torch import EmbeddingBagCollection
    names = [f"t{i}" for i in range(len(tabs))]
    return EmbeddingBagCollection.from_tables(
        dict(zip(names, tabs)), feature_names={n: [k] for n, k in zip(names, keys)},
        bits={n: f for n, f in zip(names, fmts) if isinstance(f, int)},
        dims={n: DIM for n, f in zip(names, fmts) if isinstance(f, int)})


def build_or_map_collection(rows: Sequence[int], fmts: Sequence, seed: int,
                            tables_dir: Optional[str], keys: Sequence[str],
                            progress: Optional[bool] = None):
    """The 26 tables as a :class:`perfkernels.torch.EmbeddingBagCollection` (table ``t<i>``
    read by feature ``keys[i]``): built in memory (:meth:`~perfkernels.torch.
    EmbeddingBagCollection.from_tables`), or table files in ``tables_dir``, built once, then
    mapped by every later run and shared between processes (:meth:`~perfkernels.torch.
    EmbeddingBagCollection.from_files`, every page mapped at load so that no answer pays a page
    fault)."""
    from perfkernels.torch import EmbeddingBagCollection
    if tables_dir is None:
        return collection_of(build_or_map_tables(rows, fmts, seed, None, progress=progress),
                             fmts, keys)
    names = [f"t{i}" for i in range(len(rows))]
    features = {n: [k] for n, k in zip(names, keys)}
    build_or_map_tables(rows, fmts, seed, tables_dir, progress=progress, load=False)
    files = {n: table_path(tables_dir, i, r, f, seed)
             for i, (n, r, f) in enumerate(zip(names, rows, fmts))}
    return EmbeddingBagCollection.from_files(files, feature_names=features, populate=True)


def _weight(bag) -> torch.Tensor:
    """A table module's table: its packed rows (8/4/2-bit) or its float weight."""
    return bag.packed_weight if getattr(bag, "bits", None) else bag.weight.detach()


class DLRMv2(nn.Module):
    """The model, written as the MLPerf reference and TorchRec's ``DLRM_DCN`` are: ``forward(
    dense, features)`` with the sparse features a ``KeyedJaggedTensor``, looked up by an
    :class:`perfkernels.torch.EmbeddingBagCollection` (``sparse``), whose pooled rows and the
    bottom MLP's output are concatenated into the cross network's input.  ``optimize(model)``
    turns the lookups and that concatenation into one op that writes each table's pooled rows
    into their columns of the cross network's input."""

    def __init__(self, sparse, dense: int = 13) -> None:
        super().__init__()
        self.sparse = sparse
        self.keys = [f for cfg in sparse.embedding_bag_configs() for f in cfg.feature_names]
        self.bottom = mlp(BOTTOM, dense)
        self.cross = LowRankCrossNet((len(self.keys) + 1) * DIM, CROSS_LAYERS, CROSS_RANK)
        self.top = mlp(TOP, (len(self.keys) + 1) * DIM, last_relu=False)
        self.lookup_s = 0.0
        self.dense_kind = "eager"
        self._bottom, self._over = self.bottom, nn.Sequential(self.cross, self.top)
        #: ``"ours"``: the collection; ``"torch"``: torch's own bag op per table
        self.lookups = "ours"

    @property
    def tables(self) -> list:
        """Each table as a NumPy array over the collection's memory (packed uint8 rows, or
        float rows), in feature order."""
        out = []
        for bag in self.sparse.embedding_bags.values():
            w = _weight(bag)
            if w.dtype == torch.bfloat16:
                import ml_dtypes
                out.append(w.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
            else:
                out.append(w.numpy())
        return out

    @property
    def bits(self) -> list:
        """Each table's bits (8/4/2), or None for a float table."""
        return [getattr(b, "bits", None) for b in self.sparse.embedding_bags.values()]

    @property
    def dims(self) -> list:
        return [b.embedding_dim for b in self.sparse.embedding_bags.values()]

    def forward(self, dense: torch.Tensor, features) -> torch.Tensor:
        """Logits ``[B, 1]`` of dense features ``[B, 13]`` and sparse ``features`` (a
        KeyedJaggedTensor, ours or TorchRec's)."""
        x = self.bottom(dense)
        pooled = self.sparse(features).values()
        c = torch.cat([x.unsqueeze(1), pooled.view(x.shape[0], -1, DIM)], 1)
        return self.top(self.cross(c.flatten(1)))

    def set_dense(self, kind: str, calibration: Sequence = ()) -> None:
        """Run the dense part (bottom MLP; cross network + top MLP) as ``kind``: ``"eager"``
        (float32 eager), ``"compiled"`` (float32, ``torch.compile`` by Inductor with freezing) or
        ``"int8"`` (torchao's PT2E flow with the x86 Inductor quantizer, compiled with freezing;
        its scales calibrated on ``calibration``, ``(dense, values, lengths)`` batches)."""
        from perfkernels.torch import compile_frozen, quantize_dense
        over = nn.Sequential(self.cross, self.top).eval()
        if kind == "eager":
            self._bottom, self._over = self.bottom, over
        elif kind == "compiled":
            self._bottom, self._over = compile_frozen(self.bottom.eval()), compile_frozen(over)
        elif kind == "int8":
            if not calibration:
                raise ValueError("set_dense('int8') needs calibration batches")
            self._bottom = self.bottom
            with torch.no_grad():
                xs = [self.interaction_input(*c) for c in calibration]
            self._bottom = quantize_dense(self.bottom, (calibration[0][0],),
                                          calibration=[(c[0],) for c in calibration])
            self._over = quantize_dense(over, (xs[0],), calibration=[(x,) for x in xs])
        else:
            raise ValueError(f"dense must be eager, compiled or int8; got {kind!r}")
        self.dense_kind = kind

    def interaction_input(self, dense: torch.Tensor, values: torch.Tensor,
                          lengths: torch.Tensor) -> torch.Tensor:
        """``[B, 27 * 128]``: the bottom MLP's output (the current dense part's), then each
        table's pooled rows (the current lookups', timed into ``lookup_s``)."""
        x = self._bottom(dense)
        t = time.perf_counter()
        if self.lookups == "torch":
            parts = self.torch_lookups(values, lengths)
        else:
            parts = [self.sparse(KeyedJaggedTensor(self.keys, values, lengths=lengths)).values()]
        self.lookup_s += time.perf_counter() - t
        return torch.cat([x] + parts, 1)          # one copy of the pooled rows, either way

    def run_sample(self, dense: torch.Tensor, values: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
        """Logits of one sample through the current dense part and lookups (what the timing
        runs; ``forward`` is the model as a user writes it)."""
        return self._over(self.interaction_input(dense, values, lengths))

    def torch_lookups(self, values: torch.Tensor, lengths: torch.Tensor) -> list:
        """The same lookups as a user writes them with torch alone: per table, torch's own bag
        op on the same table tensors (``torch.ops.quantized.embedding_bag_{byte,4bit,2bit}_
        rowwise_offsets`` for packed rows, ``F.embedding_bag`` for float rows): each table's
        pooled rows ``[B, 128]``, in order."""
        ops = {8: torch.ops.quantized.embedding_bag_byte_rowwise_offsets,
               4: torch.ops.quantized.embedding_bag_4bit_rowwise_offsets,
               2: torch.ops.quantized.embedding_bag_2bit_rowwise_offsets}
        bags = list(self.sparse.embedding_bags.values())
        batch = lengths.numel() // len(bags)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        out = []
        for i, bag in enumerate(bags):
            offs = offsets[i * batch:(i + 1) * batch + 1]
            ids = values[int(offs[0]):int(offs[-1])]
            offs = offs - offs[0]
            w, bits = _weight(bag), getattr(bag, "bits", None)
            if bits:
                out.append(ops[bits](w, ids, offs, mode=0, include_last_offset=True))
            else:
                out.append(nn.functional.embedding_bag(ids, w, offs[:-1], mode="sum").float())
        return out


def torchrec_twin(model: DLRMv2, keys: Sequence[str]):
    """TorchRec's ``DLRM_DCN`` with ``model``'s weights: float32 tables (the packed ones
    dequantized), the same MLPs and cross layers."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM_DCN
    configs = [EmbeddingBagConfig(num_embeddings=t.shape[0], embedding_dim=DIM, name=f"t{i}",
                                  feature_names=[keys[i]])
               for i, t in enumerate(model.tables)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    twin = DLRM_DCN(ebc, dense_in_features=model.bottom[0].in_features,
                    dense_arch_layer_sizes=list(BOTTOM), over_arch_layer_sizes=list(TOP),
                    dcn_num_layers=CROSS_LAYERS, dcn_low_rank_dim=CROSS_RANK)
    with torch.no_grad():
        for i, (t, bits) in enumerate(zip(model.tables, model.bits)):
            w = (pk.dequantize_rowwise(t, bits, dim=DIM) if bits else
                 np.asarray(t).astype(np.float32))
            ebc.embedding_bags[f"t{i}"].weight.copy_(torch.from_numpy(w))
        ours = [m for m in model.bottom if isinstance(m, nn.Linear)]
        theirs = [m for m in twin.dense_arch.model.modules() if isinstance(m, nn.Linear)]
        ours += [m for m in model.top if isinstance(m, nn.Linear)]
        theirs += [m for m in twin.over_arch.model.modules() if isinstance(m, nn.Linear)]
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)
        cn = twin.inter_arch.crossnet
        for i in range(CROSS_LAYERS):
            cn.V_kernels[i].copy_(model.cross.V[i])
            cn.W_kernels[i].copy_(model.cross.W[i])
            cn.bias[i].copy_(model.cross.b[i])
    return twin.eval()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=64,
                   help="divide the row counts by this (1: full size, 204M rows)")
    p.add_argument("--bits", default="4:big,8:small",
                   help="4, 8, 2, float16, float32, or A:big,B:small")
    p.add_argument("--samples", type=int, default=20, help="MLPerf-style samples to run")
    p.add_argument("--exponent", type=float, default=1.05, help="the IDs' power law")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tables-dir", default=None, help="keep the tables as files here")
    p.add_argument("--threads", default=None,
                   help="threads (perfkernels' and torch's), or a list to run each: 1,2")
    p.add_argument("--dense", default="eager",
                   help="the dense part, one or a list of: eager (float32), compiled (float32, "
                        "torch.compile with freezing), int8 (torchao's PT2E, compiled)")
    p.add_argument("--torch-bags", action="store_true",
                   help="also run each dense part with torch's own bag op per table for the "
                        "lookups (same tables, same dense part), interleaved with ours")
    p.add_argument("--calibration", type=int, default=4,
                   help="batches of 256 pairs that calibrate the int8 dense part")
    p.add_argument("--check-torchrec", action="store_true",
                   help="compare with TorchRec's DLRM_DCN (float32 tables: small --scale only)")
    return p.parse_args(argv)


_EVICT = np.zeros(64 << 18, np.float32)       # 64 MiB: more than any CPU's last-level cache


def _evict_caches() -> None:
    """Write one float of every cache line of a 64 MiB buffer (pushes the tables' rows out)."""
    _EVICT[::16] += 1.0


def time_samples(model: DLRMv2, gen: datasets.CriteoLike, count: int,
                 parts: Optional[dict] = None) -> dict:
    """Run ``count`` MLPerf-style samples (warm-up batches first) through each dense part of
    ``parts`` (``{name: (bottom, over)}``, from :meth:`DLRMv2.set_dense`; default: the current
    one; each ``(bottom, over, lookups)``), the parts taking turns on each sample (interleaved, so that a load on the machine falls
    on all alike).  ``{name: result}``, per part: pairs/s, p50/p99 ms a sample, the lookups'
    time and the logits."""
    parts = parts or {model.dense_kind: (model._bottom, model._over, model.lookups)}
    stats = {k: {"lat": [], "lookup": 0.0, "preds": []} for k in parts}
    pairs = 0
    with torch.inference_mode():
        # warm-up: a server's steady state, not its first calls (compiled parts compile, and
        # the output pools of both routes hold blocks for batches across the samples' sizes)
        for size in (128, 256, 384, 512, 640, 768):
            warm = gen.batch(size, index=10 ** 6 + size)
            for bottom, over, lookups in parts.values():
                model._bottom, model._over, model.lookups = bottom, over, lookups
                model.run_sample(*(torch.from_numpy(a)
                                   for a in (warm.dense, warm.values, warm.lengths)))
        order = list(parts.items())
        for i, sample in enumerate(gen.samples(count)):
            dense = torch.from_numpy(sample.dense)
            values, lengths = torch.from_numpy(sample.values), torch.from_numpy(sample.lengths)
            # each part comes first in turn, and starts from caches that hold none of the
            # sample's rows (as a server's next sample finds them), so that no part runs on the
            # rows another part just brought in
            turn = i % len(order)
            for k, (bottom, over, lookups) in order[turn:] + order[:turn]:
                _evict_caches()
                model._bottom, model._over, model.lookups = bottom, over, lookups
                model.lookup_s = 0.0
                t = time.perf_counter()
                logits = model.run_sample(dense, values, lengths)
                stats[k]["lat"].append(time.perf_counter() - t)
                stats[k]["lookup"] += model.lookup_s
                stats[k]["preds"].append((sample, logits))
            pairs += sample.batch_size
    out = {}
    for k, st in stats.items():
        lat, total = st["lat"], sum(st["lat"])
        out[k] = dict(pairs=pairs, pairs_per_s=pairs / total if total else 0.0,
                      p50_ms=1e3 * float(np.percentile(lat, 50)) if lat else 0.0,
                      p99_ms=1e3 * float(np.percentile(lat, 99)) if lat else 0.0,
                      lookup_ms=1e3 * st["lookup"] / max(len(lat), 1),
                      lookup_share=st["lookup"] / total if total else 0.0, preds=st["preds"])
    return out


def _speedups(runs: list) -> None:
    """Per run with our lookups, ``vs_torch_bags`` (its pairs/s over the same dense part's with
    torch's bags, same threads) and ``lookup_vs_torch_bags`` (the lookups' time ratio)."""
    theirs = {(r["dense"], r["threads"]): r for r in runs if r["lookups"] == "torch"}
    for r in runs:
        t = theirs.get((r["dense"], r["threads"]))
        if r["lookups"] == "ours" and t is not None and t["pairs_per_s"] and r["lookup_ms"]:
            r["vs_torch_bags"] = r["pairs_per_s"] / t["pairs_per_s"]
            r["lookup_vs_torch_bags"] = t["lookup_ms"] / r["lookup_ms"]


def run(args: argparse.Namespace) -> dict:
    """Build the model and run it: ``result["runs"]`` has one entry per (dense part, threads)."""
    rows = datasets.dlrm_v2_rows(args.scale)
    fmts = table_formats(args.bits, datasets.DLRM_V2_ROWS)
    torch.manual_seed(args.seed)
    gen = datasets.CriteoLike(rows, exponent=args.exponent, seed=args.seed)
    t = time.perf_counter()
    sparse = build_or_map_collection(rows, fmts, args.seed, args.tables_dir, gen.keys)
    model = DLRMv2(sparse).eval()
    result = {"rows": sum(rows), "table_bytes": sum(t.nbytes for t in model.tables),
              "tables_s": time.perf_counter() - t, "runs": []}
    calib = [gen.batch(256, index=10 ** 6 + 1 + i) for i in range(args.calibration)]
    calib = [tuple(torch.from_numpy(a) for a in (b.dense, b.values, b.lengths)) for b in calib]
    threads = [int(n) for n in str(args.threads).split(",")] if args.threads else [None]
    preds = None
    parts = {}
    for kind in args.dense.split(","):
        model.set_dense(kind, calib)
        parts[kind] = (model._bottom, model._over, "ours")
        if args.torch_bags:
            parts[kind + "+torch-bags"] = (model._bottom, model._over, "torch")
    for n in threads:
        if n:
            pk.set_num_threads(n)
            torch.set_num_threads(n)
        runs = time_samples(model, gen, args.samples, parts)
        for kind, r in runs.items():
            r.update(dense=kind.split("+")[0], lookups="torch" if "+" in kind else "ours",
                     threads=n or torch.get_num_threads())
            if kind == "eager" and preds is None:      # our lookups, eager float32
                preds = r["preds"]
            result["runs"].append(r)
        for r in result["runs"][-len(runs):]:
            if preds is not None and (r["dense"], r["lookups"]) != ("eager", "ours"):
                diffs = [float((b[1] - a[1]).abs().max()) for a, b in zip(preds, r["preds"])]
                r["logit_diff_vs_eager"] = max(diffs)
    _speedups(result["runs"])
    for r in result["runs"]:
        r.pop("preds", None)
    if args.check_torchrec:
        if preds is None:
            raise ValueError("--check-torchrec compares the eager dense part: keep 'eager' in "
                             "--dense")
        twin = torchrec_twin(model, gen.keys)
        diff = scale = 0.0
        with torch.inference_mode():
            for sample, logits in preds:
                theirs = twin(torch.from_numpy(sample.dense), sample.to_kjt(torchrec=True))
                diff = max(diff, float((theirs - logits).abs().max()))
                scale = max(scale, float(logits.abs().max()))
        result["torchrec_max_abs_diff"] = diff
        result["torchrec_rel_diff"] = diff / scale if scale else diff
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    r = run(args)
    print(f"DLRM-v2 at 1/{args.scale:g} size, tables {args.bits}: {r['rows']:,} rows, "
          f"{r['table_bytes'] / 2**30:.2f} GiB, ready in {r['tables_s']:.1f} s")
    for run_ in r["runs"]:
        extra = (f", logits within {run_['logit_diff_vs_eager']:.1e} of eager"
                 if "logit_diff_vs_eager" in run_ else "")
        if "vs_torch_bags" in run_:
            extra += (f"; against torch's bags: {run_['vs_torch_bags']:.2f}x end to end, lookups "
                      f"{run_['lookup_vs_torch_bags']:.2f}x")
        print(f"dense {run_['dense']:>8}, lookups {run_['lookups']:>5}, {run_['threads']} "
              f"thread(s): {run_['pairs']} pairs in "
              f"{args.samples} samples: {run_['pairs_per_s']:,.0f} pairs/s, p50 "
              f"{run_['p50_ms']:.1f} ms, p99 {run_['p99_ms']:.1f} ms a sample; lookups "
              f"{run_['lookup_ms']:.1f} ms a sample ({100 * run_['lookup_share']:.0f}%), the "
              f"dense part the rest{extra}")
    if "torchrec_max_abs_diff" in r:
        print(f"TorchRec DLRM_DCN, same weights: largest logit difference "
              f"{r['torchrec_max_abs_diff']:.2e} ({r['torchrec_rel_diff']:.1e} of the largest "
              f"logit)")
        if r["torchrec_rel_diff"] > 1e-3:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
