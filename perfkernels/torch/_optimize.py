"""optimize(model): whole-model optimisation on torch's own graph capture.

The model is converted as :func:`convert` converts it, its forward captured with
``torch.export`` (non-strict: torch's tracer runs the model's Python), and every group of
embedding-bag lookups whose outputs meet in DLRM's concatenation or dot interaction is replaced by
one fused op (:mod:`._fused_ops`) that writes the interaction's output directly.  The rest of the
captured graph runs as captured (ATen ops), its parameters read from the model at every call.
See docs/optimize.md.
"""
from __future__ import annotations

import inspect
import logging
import operator
import types
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from perfkernels.families.interaction._interaction import pair_lists

from . import _convert, _fused_ops
from ._collection import KeyedJaggedTensor, KeyedTensor
from ._embedding import Embedding
from ._embedding_bag import EmbeddingBag
from ._quantized import QuantizedEmbeddingBag
from ._quantized_embedding import QuantizedEmbedding

log = logging.getLogger("perfkernels.torch")

#: at most this many captures (input signatures) per model; others run the unfused modules
MAX_CAPTURES = 8
#: the captures of at most this many states of a model (its module tree, attributes and
#: hooks) are kept: train() / eval() flips find theirs again
MAX_STATES = 4
#: a model that changes to a state not seen before more often than this runs its own forward
MAX_CHANGES = 16

_aten = torch.ops.aten


# --------------------------------------------------------------------------- pytree of the KJT

def _register_pytrees() -> None:
    """perfkernels' KeyedJaggedTensor / KeyedTensor as pytree nodes, so torch.export takes and
    returns them (their tensors are the leaves, the keys the context)."""
    def kjt_flatten(k):
        return [k._values, k._weights, k._lengths, k._offsets], k._keys

    def kjt_unflatten(children, keys):
        values, weights, lengths, offsets = children
        kjt = KeyedJaggedTensor.__new__(KeyedJaggedTensor)
        kjt._keys, kjt._values, kjt._weights = list(keys), values, weights
        kjt._lengths, kjt._offsets = lengths, offsets
        return kjt

    def kt_flatten(k):
        return [k._values], (tuple(k._keys), tuple(k._length_per_key))

    def kt_unflatten(children, context):
        return KeyedTensor(list(context[0]), list(context[1]), children[0])

    for cls, flat, unflat in ((KeyedJaggedTensor, kjt_flatten, kjt_unflatten),
                              (KeyedTensor, kt_flatten, kt_unflatten)):
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_pytree_node(
                cls, flat, unflat, serialized_type_name=f"perfkernels.torch.{cls.__name__}",
                flatten_with_keys_fn=lambda k, f=flat: (
                    [(pytree.SequenceKey(i), c) for i, c in enumerate(f(k)[0])], f(k)[1]))


_register_pytrees()


# --------------------------------------------------------------------------- the report

@dataclass
class OptimizationReport:
    """What :func:`optimize` did: ``conversion`` (:func:`convert`'s report), ``fused`` as
    (capture, group, what), ``not_fused`` as (capture, node, reason), ``captures`` as
    (signature, outcome).

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> class TwoTables(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.EmbeddingBag(100, 4), torch.nn.EmbeddingBag(50, 4)
    ...     def forward(self, ia, oa, ib, ob):
    ...         return torch.cat([self.a(ia, oa), self.b(ib, ob)], 1)
    >>> inputs = (torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([3]), torch.tensor([0]))
    >>> model = TwoTables()
    >>> fast = pkt.optimize(model, inputs)      # both lookups and the cat: one fused op
    >>> torch.testing.assert_close(fast(*inputs), model(*inputs))
    >>> len(pkt.last_optimize_report().fused)
    1
    """
    conversion: Optional[_convert.ConversionReport] = None
    fused: list = field(default_factory=list)
    not_fused: list = field(default_factory=list)
    captures: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"perfkernels.torch.optimize: {len(self.captures)} capture(s), fused "
                 f"{len(self.fused)} group(s), left {len(self.not_fused)} lookup(s) or pattern(s)"]
        lines += [f"  capture {i}: {sig}: {outcome}" for i, (sig, outcome)
                  in enumerate(self.captures)]
        lines += [f"  fused [{c}] {g}: {what}" for c, g, what in self.fused]
        lines += [f"  not fused [{c}] {n}: {why}" for c, n, why in self.not_fused]
        if self.conversion is not None:
            lines.append("  " + str(self.conversion).replace("\n", "\n  "))
        return "\n".join(lines)


_last_report: Optional[OptimizationReport] = None


def last_optimize_report() -> Optional[OptimizationReport]:
    """The report of the latest :func:`optimize` (updated by its captures), or None.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> class TwoTables(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.EmbeddingBag(100, 4), torch.nn.EmbeddingBag(50, 4)
    ...     def forward(self, ia, oa, ib, ob):
    ...         return torch.cat([self.a(ia, oa), self.b(ib, ob)], 1)
    >>> inputs = (torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([3]), torch.tensor([0]))
    >>> model = TwoTables()
    >>> fast = pkt.optimize(model, inputs)      # both lookups and the cat: one fused op
    >>> torch.testing.assert_close(fast(*inputs), model(*inputs))
    >>> len(pkt.last_optimize_report().fused)
    1
    """
    return _last_report


# --------------------------------------------------------------------------- graph matching

_LOOKUP_OPS = {torch.ops.perfkernels.embedding_bag.default: "ours",
               torch.ops.perfkernels.embedding_bag_inference.default: "ours",
               torch.ops.perfkernels.embedding_bag_quantized.default: "packed",
               _aten.embedding_bag.padding_idx: "aten", _aten.embedding_bag.default: "aten",
               _aten._embedding_bag.default: "aten"}


#: ops whose registered gradient is dense whatever the module's ``sparse``
_DENSE_GRAD_OPS = {torch.ops.perfkernels.embedding_bag.default,
                   torch.ops.perfkernels.embedding.default,
                   torch.ops.perfkernels.embedding_bag_collection.default,
                   torch.ops.perfkernels.embedding_collection.default}


#: lookups without autograd (what a capture without a gradient to record holds)
_INFERENCE_OPS = {getattr(torch.ops.perfkernels, name).default for name in (
    "embedding_bag_inference", "embedding_inference", "embedding_collection_inference",
    "embedding_bag_collection_inference", "embedding_bags_interaction_inference",
    "embedding_bag_collection_packed")}


#: lookups never fused yet, and why (reported)
_UNFUSED_LOOKUPS = {
    _aten.embedding_renorm_.default: "max_norm renormalises the table in place",
}


@dataclass
class _Lookup:
    node: Any            # the op node
    out: Any             # the node of the pooled rows
    weight: Any          # the weight's placeholder
    indices: Any
    offsets: Any
    include_last: bool
    mean: int
    padding_idx: int
    bits: int = 0        # 8 / 4 / 2: a packed table
    dim: int = 0         # its columns


def _lookup_of(node, weights: dict) -> tuple[Optional[_Lookup], Optional[str]]:
    """A plain lookup (or None with the reason it cannot be fused) for a node producing pooled
    rows: ours (perfkernels::embedding_bag) or torch's (aten embedding_bag, its output 0)."""
    src = node
    if node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0:
        src = node.args[0]
    kind = _LOOKUP_OPS.get(src.target) if src.op == "call_function" else None
    if kind is None or (kind != "aten" and src is not node) or (kind == "aten" and src is node):
        return None, None
    a = list(src.args)
    bits = dim = 0
    if kind == "packed":
        weight, indices, offsets, psw, mode, last, pad, bits, dim = (a + [None] * 9)[:9]
    elif kind == "ours":
        weight, indices, offsets, psw, mode, last, pad = (a + [None] * 7)[:7]
        kw = src.kwargs
        mode = kw.get("mode", mode)
    else:
        names = ["weight", "indices", "offsets", "scale_grad_by_freq", "mode", "sparse", "psw",
                 "include_last_offset", "padding_idx"]
        vals = dict(zip(names, a))
        vals.update(src.kwargs)
        weight, indices, offsets = vals["weight"], vals["indices"], vals.get("offsets")
        if vals.get("scale_grad_by_freq"):
            return None, "scale_grad_by_freq"
        mode = {0: "sum", 1: "mean", 2: "max"}.get(vals.get("mode", 0), "?")
        psw, last, pad = vals.get("psw"), vals.get("include_last_offset", False), \
            vals.get("padding_idx")
        if pad is not None and pad < 0:
            pad = None
    if psw is not None:
        return None, "per_sample_weights (not fused yet)"
    if mode not in ("sum", "mean"):
        return None, f"mode {mode!r}"
    if offsets is None or weight not in weights:
        return None, "2-D indices or a table that is not a parameter of the model"
    w = weights[weight]
    if bits:
        if w.dim() != 2 or w.dtype is not torch.uint8:
            return None, "a packed table that is not a uint8 matrix"
    elif w.dim() != 2 or w.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None, f"table dtype {w.dtype}"
    rows = w.shape[0]
    return _Lookup(src, node, weight, indices, offsets, bool(last), int(mode == "mean"),
                   -1 if pad is None else int(pad) % rows, int(bits or 0),
                   int(dim) if bits else int(w.shape[1])), None


def _is_transpose_12(node, of) -> bool:
    return (node.op == "call_function" and node.target is _aten.transpose.int
            and node.args[0] is of and sorted(int(x) % 3 for x in node.args[1:3]) == [1, 2])


#: ops evaluated at capture time when every input is a constant (the pair lists' sources)
_CONSTANT_OPS = {_aten.lift_fresh_copy.default, _aten.detach_.default, _aten.detach.default,
                 _aten.clone.default, _aten.alias.default, _aten.select.int, _aten.unbind.int,
                 _aten._to_copy.default, _aten.to.dtype, _aten.tril_indices.default,
                 _aten.triu_indices.default, operator.getitem}


def _constant_value(node, consts: dict, _depth: int = 0):
    """The value of a node computed from constants only (lifted tensors, buffers, and the ops of
    _CONSTANT_OPS on them: DLRM's ``torch.tensor([...])``, ``torch.tril_indices``, TorchRec's
    ``triu_indices`` buffer rows), or None."""
    if not hasattr(node, "op"):
        return node
    if node in consts:
        return consts[node]
    if node.op != "call_function" or node.target not in _CONSTANT_OPS or _depth > 8:
        return None
    args = []
    for a in node.args:
        if hasattr(a, "op"):
            v = _constant_value(a, consts, _depth + 1)
            if v is None:
                return None
            args.append(v)
        elif isinstance(a, (list, tuple)) and any(hasattr(x, "op") for x in a):
            return None
        else:
            args.append(a)
    kwargs = {k: v for k, v in node.kwargs.items() if k not in ("device", "pin_memory")}
    if any(hasattr(v, "op") for v in kwargs.values()):
        return None
    try:
        if node.target in (_aten.detach_.default,):
            return args[0]
        return node.target(*args, **kwargs)
    except Exception:   # noqa: BLE001 - not a constant we can evaluate
        return None


def _pairs_of(li: Tensor, lj: Tensor, n: int) -> Optional[tuple[str, bool]]:
    """Which model's pair order (li, lj) is: ("dlrm" | "torchrec", self_interaction), or None."""
    li, lj = li.reshape(-1).tolist(), lj.reshape(-1).tolist()
    for pairs in ("dlrm", "torchrec"):
        for itself in (False, True):
            a, b = pair_lists(n, pairs, itself)
            if a.tolist() == li and b.tolist() == lj:
                return pairs, itself
    return None


def _is_full_slice(node) -> bool:
    """``x[:]`` on dim 0 (what export writes for the ``:`` of ``Z[:, li, lj]``)."""
    if node.op != "call_function" or node.target is not _aten.slice.Tensor:
        return False
    a = list(node.args) + [0, None, None, 1][len(node.args) - 1:]
    dim, start, end, step = a[1], a[2], a[3], a[4]
    return (dim == 0 and start in (0, None) and step in (1, None)
            and (end is None or (isinstance(end, int) and end >= 2 ** 62)))


def _skip_full_slices_down(node):
    """The node's only user past any full slices (or the node when it has other users)."""
    while len(node.users) == 1 and _is_full_slice(next(iter(node.users))):
        node = next(iter(node.users))
    return node


def _skip_full_slices_up(node):
    while _is_full_slice(node):
        node = node.args[0]
    return node


def _single_user(node, target=None):
    users = list(node.users)
    if len(users) != 1:
        return None
    return users[0] if target is None or users[0].target is target else None


def _uses(node) -> list:
    """The node's users but export's metadata assertions on it."""
    assert_op = getattr(_aten, "_assert_tensor_metadata", None)
    return [u for u in node.users
            if assert_op is None or u.target is not assert_op.default]


def _identity_recat(node):
    """``x`` for ``cat([split(x, sizes, 1)[0], ..., [k-1]], 1)`` (TorchRec's KeyedTensor to_dict
    and back, in key order), else the node."""
    if node.op != "call_function" or node.target is not _aten.cat.default:
        return node
    pieces, base = node.args[0], None
    for i, p in enumerate(pieces):
        if p.op != "call_function" or p.target is not operator.getitem or p.args[1] != i:
            return node
        split = p.args[0]
        if split.target not in (_aten.split_with_sizes.default, _aten.split.Tensor):
            return node
        if (split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)) not in (1, -1):
            return node
        if base is None:
            base = split
        elif split is not base:
            return node
    if base is None or len([u for u in base.users]) != len(pieces):
        return node
    sizes = base.args[1]
    if not isinstance(sizes, (list, tuple)) or len(sizes) != len(pieces):
        return node
    return base.args[0]


# --------------------------------------------------------------------------- one capture

#: casts a model may write after a lookup (``.float()``): no-ops on our float32 pooled rows
_CASTS = {_aten.to.dtype, _aten._to_copy.default}


def _through_float_cast(node, lookups: dict):
    """The lookup behind ``lookup(...).float()``, or the node itself: a cast of float32 pooled
    rows to float32 (a no-op), or of a 16-bit table's pooled rows to float32 (what a converted
    float16 / bfloat16 table answers: float32 sums, which the fused op writes directly, as the
    module's eager kernel does; under a capture a table with a gradient runs torch's function,
    whose 16-bit result the module then casts)."""
    if node.op == "call_function" and node.target in _CASTS and node.args:
        source = _through_float_cast(node.args[0], lookups)    # (a cast of a cast)
        if source in lookups:
            dtype = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
            val = node.args[0].meta.get("val")
            if dtype is torch.float32 and val is not None and val.dtype in _POOLED_DTYPES \
                    and not node.kwargs.get("memory_format"):
                return source
    return node


#: dtypes of pooled rows that a cast to float32 may be folded into a fused op for
_POOLED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _drop_orphan_assertions(graph, lookups_of: set) -> None:
    """Remove export's metadata assertions (``_assert_tensor_metadata``) on values a fused op
    replaced, and on casts of them: they are a fused lookup's last users and would keep it
    running beside the fused op."""
    assert_op = getattr(_aten, "_assert_tensor_metadata", None)
    if assert_op is None or not lookups_of:
        return
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not assert_op.default:
            continue
        src = node.args[0]
        base = src.args[0] if (src.op == "call_function" and src.target in _CASTS
                               and src.args) else src
        if base in lookups_of or src in lookups_of:
            graph.erase_node(node)


def _lean_graph(graph) -> None:
    """What an eager run of the rewritten graph need not pay for, one Python op call each:
    a constant's fresh copy detached in place and never read (the pair lists a fused op took
    over), and the per-feature rows of one tensor taken one ``select`` at a time (``indices[k]``
    for 26 features: one ``unbind`` and list items instead)."""
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is _aten.detach_.default
                and not node.users and node.args[0].op == "call_function"
                and node.args[0].target is _aten.lift_fresh_copy.default
                and len(node.args[0].users) == 1):
            fresh = node.args[0]
            graph.erase_node(node)
            graph.erase_node(fresh)
    rows: dict = {}
    for node in graph.nodes:
        if (node.op == "call_function" and node.target is _aten.select.int
                and len(node.args) == 3 and not node.kwargs and node.args[1] == 0
                and isinstance(node.args[2], int)):
            rows.setdefault(node.args[0], []).append(node)
    for src, selects in rows.items():
        if len(selects) < 4:
            continue
        with graph.inserting_after(src):
            parts = graph.call_function(_aten.unbind.int, (src, 0))
        if "val" in src.meta:
            parts.meta["val"] = list(src.meta["val"].unbind(0))
        for sel in selects:
            with graph.inserting_before(sel):
                item = graph.call_function(operator.getitem, (parts, sel.args[2]))
            item.meta.update(sel.meta)
            sel.replace_all_uses_with(item)
            graph.erase_node(sel)


class _Capture:
    """One captured and rewritten forward, for inputs of one signature."""

    def __init__(self, model: torch.nn.Module, ep, report: OptimizationReport, index: int):
        self.ep = ep
        sig = ep.graph_signature
        gm = ep.graph_module
        self.in_spec = ep.call_spec.in_spec
        self.out_spec = ep.call_spec.out_spec
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # per placeholder: ("state", module, attribute) | ("const", tensor) | ("user", i)
        self.feeds: list = []
        weights: dict = {}
        consts: dict = {}
        user = 0
        for node, spec in zip(placeholders, sig.input_specs):
            kind = spec.kind.name
            if kind in ("PARAMETER", "BUFFER"):
                owner, _, attr = spec.target.rpartition(".")
                module = model.get_submodule(owner)
                # read at every call from the module's own dict (a Parameter replaced by
                # assignment, or loaded in place, is what the next call reads)
                store = module._parameters if kind == "PARAMETER" else module._buffers
                if attr not in store:
                    store = module.__dict__
                self.feeds.append(("state", module, attr, store))
                value = getattr(module, attr)
                weights[node] = value          # a table: a parameter, or a packed buffer
                if kind == "BUFFER":
                    consts[node] = value
            elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
                value = ep.constants[spec.target]
                self.feeds.append(("const", value))
                consts[node] = value
            else:
                self.feeds.append(("user", user))
                user += 1
        self.num_user = user
        self.single_output = self.out_spec == pytree.tree_structure(0)
        self.guard = self._guard(placeholders)
        self.fqn_module = {node: self.feeds[i][1] for i, node in enumerate(placeholders)
                           if self.feeds[i][0] == "state"}
        self._fuse(gm, weights, consts, report, index)
        _drop_orphan_assertions(gm.graph, lookups_of=set(self._fused_lookups))
        _lean_graph(gm.graph)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        self.gm = gm
        self.sparse_grad = self._dense_for_sparse(gm.graph, report, index)
        # lookups that record no gradient (captured under no_grad, or its tables needed none):
        # a call that must record one for such a table takes (or makes) another capture
        self.no_grad_tables = [
            self.fqn_module[t] for node in gm.graph.nodes
            if node.op == "call_function" and node.target in _INFERENCE_OPS
            for t in (node.args[0] if isinstance(node.args[0], (list, tuple))
                      else [node.args[0]]) if t in self.fqn_module]

    def records_no_gradient(self) -> bool:
        """Whether a table the capture looks up without autograd needs a gradient now."""
        return any(m.weight.requires_grad for m in self.no_grad_tables
                   if isinstance(getattr(m, "weight", None), Tensor))

    def _dense_for_sparse(self, graph, report, index) -> bool:
        """Whether a lookup left in the graph reads a table whose module has ``sparse=True``:
        the registered op's gradient is dense (the traced form), where the module gives a COO
        gradient, so calls that record a gradient run the modules instead."""
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in _DENSE_GRAD_OPS:
                continue
            tables = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            if any(getattr(self.fqn_module.get(t), "sparse", False) for t in tables):
                report.not_fused.append((index, node.name, "a table with sparse=True: calls "
                                         "that record a gradient run the modules (COO gradient)"))
                return True
        return False

    # ---- guards: the dims the capture fixed, and the dims it found equal
    def _guard(self, placeholders):
        checks, symbols = [], {}
        user = 0
        for node, feed in zip(placeholders, self.feeds):
            if feed[0] != "user":
                continue
            val = node.meta.get("val")
            if isinstance(val, Tensor):
                dims = []
                for d, size in enumerate(val.shape):
                    if isinstance(size, int):
                        dims.append((d, size))
                    else:
                        name = str(size.node.expr)
                        dims.append((d, symbols.setdefault(name, (user, d))))
                checks.append((user, val.dtype, val.dim(), tuple(dims)))
            user += 1
        self.static_dims = [(i, d, w) for i, _, _, dims in checks for d, w in dims
                            if type(w) is int]
        self.equal_dims = [(i, d) + w for i, _, _, dims in checks for d, w in dims
                           if type(w) is not int and w != (i, d)]
        self.free_dims = [(i, d) for i, _, _, dims in checks for d, w in dims if w == (i, d)]
        return checks

    def matches(self, flat: list) -> bool:
        """Whether inputs of this capture's signature (structure, dtypes, ranks) fit it: the dims
        it fixed, the dims it found equal, and its free dims not 0 or 1 (export assumes so)."""
        if len(flat) != self.num_user:
            return False
        for i, d, want in self.static_dims:
            if flat[i].shape[d] != want:
                return False
        for i, d, j, e in self.equal_dims:
            if flat[i].shape[d] != flat[j].shape[e]:
                return False
        for i, d in self.free_dims:
            if flat[i].shape[d] < 2:
                return False
        return True

    # ---- the rewrite
    def _fuse(self, gm, weights, consts, report, index):
        graph = gm.graph
        self._fused_lookups = []
        lookups = {}
        for node in list(graph.nodes):
            lk, why = _lookup_of(node, weights)
            if lk is not None:
                lookups[node] = lk
            elif why is not None and node.op == "call_function":
                report.not_fused.append((index, node.name, why))
            elif node.op == "call_function" and node.target in _UNFUSED_LOOKUPS:
                report.not_fused.append((index, node.name, _UNFUSED_LOOKUPS[node.target]))
        done = set()
        for node in list(graph.nodes):      # DCN's [B, F + 1, D] first: its pooled rows' own
            if (node.op == "call_function" and node.target is _aten.cat.default  # cat inside
                    and node in graph.nodes):
                self._dcn_cat(graph, node, lookups, report, index, done)
        for node in list(graph.nodes):
            if node.op != "call_function" or node in done or node not in graph.nodes:
                continue
            if node.target is _aten.cat.default:
                (self._dlrm_dot(graph, node, lookups, consts, report, index, done)
                 or self._stacked_dot(graph, node, lookups, consts, report, index, done)
                 or self._torchrec_dot(graph, node, consts, report, index, done)
                 or self._dlrm_cat(graph, node, lookups, report, index, done)
                 or self._lookups_only(graph, node, lookups, report, index, done))
        for node in list(graph.nodes):
            if (node.op == "call_function" and node.target is _aten.stack.default
                    and node not in done):
                self._lookups_only(graph, node, lookups, report, index, done)
        for node, lk in lookups.items():
            if lk.node in graph.nodes and lk.out.users and node not in done:
                report.not_fused.append((index, lk.node.name, "its pooled rows do not go "
                                         "straight into one concatenation or interaction with "
                                         "the other lookups"))

    def _replace(self, graph, at, target, args, report, index, what, done, members):
        self._fused_lookups.extend(m for m in members if m.op == "call_function")
        with graph.inserting_before(at):
            new = graph.call_function(target, args)
        new.meta = dict(at.meta)
        at.replace_all_uses_with(new)
        graph.erase_node(at)
        done.update(members)
        done.add(at)
        report.fused.append((index, new.name, what))
        return True

    def _modules(self, lks):
        mods = []
        for lk in lks:
            m = self.fqn_module.get(lk.weight)
            mods.append(m if isinstance(m, EmbeddingBag) else None)
        return mods

    def _dlrm_dot(self, graph, cat, lookups, consts, report, index, done) -> bool:
        """R = cat([x, index(bmm(T, T^T), [None, li, lj])], 1), T = view(cat([x, e...], 1))."""
        parts, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
        if dim not in (1, -1) or len(parts) < 2:
            return False
        view = _single_user(cat, _aten.view.default) or _single_user(cat, _aten.reshape.default)
        if view is None:
            return False
        x, embs = parts[0], parts[1:]
        users = list(view.users)
        tr = next((u for u in users if _is_transpose_12(u, view)), None)
        bmm = next((u for u in users if u.target is _aten.bmm.default), None)
        if tr is None or bmm is None or len(users) != 2 or bmm.args != (view, tr):
            return False
        idx = _single_user(_skip_full_slices_down(bmm), _aten.index.Tensor)
        if idx is None or len(idx.args[1]) != 3 or idx.args[1][0] is not None:
            return False
        li = _constant_value(idx.args[1][1], consts)
        lj = _constant_value(idx.args[1][2], consts)
        out = _single_user(idx, _aten.cat.default)
        if out is None or list(out.args[0]) != [x, idx] or out.args[1] not in (1, -1):
            return False
        return self._fuse_dot(graph, out, x, embs, idx, li, lj, lookups, report, index, done,
                              [cat])

    def _stacked_dot(self, graph, out, lookups, consts, report, index, done) -> bool:
        """R = cat([x, index(flatten(bmm(T, T^T), 1), [None, p])], 1), T = stack([x, e...], 1),
        p the flat positions i * n + j of the pairs (examples/dlrm.py's interaction)."""
        parts = out.args[0]
        if len(parts) != 2 or (out.args[1] if len(out.args) > 1 else 0) not in (1, -1):
            return False
        x, idx = parts
        if (idx.op != "call_function" or idx.target is not _aten.index.Tensor
                or len(idx.args[1]) != 2 or idx.args[1][0] is not None or len(idx.users) != 1):
            return False
        flat = _skip_full_slices_up(idx.args[0])
        if flat.op != "call_function" or flat.target not in (
                _aten.flatten.using_ints, _aten.view.default, _aten.reshape.default):
            return False
        bmm = flat.args[0]
        if bmm.op != "call_function" or bmm.target is not _aten.bmm.default \
                or len(bmm.users) != 1:
            return False
        st, tr = bmm.args
        if (not _is_transpose_12(tr, st) or st.op != "call_function"
                or st.target is not _aten.stack.default
                or (st.args[1] if len(st.args) > 1 else st.kwargs.get("dim", 0)) != 1
                or len(st.users) != 2 or st.args[0][0] is not x):
            return False
        embs = list(st.args[0][1:])
        n = len(embs) + 1
        flat_pairs = _constant_value(idx.args[1][1], consts)
        if flat_pairs is None:
            report.not_fused.append((index, idx.name, "pairs that are not constants"))
            return False
        flat_pairs = torch.as_tensor(flat_pairs).reshape(-1).long()
        if flat_pairs.numel() and (flat_pairs.min() < 0 or flat_pairs.max() >= n * n):
            return False
        return self._fuse_dot(graph, out, x, embs, idx, flat_pairs // n, flat_pairs % n, lookups,
                              report, index, done, [st])

    def _fuse_dot(self, graph, out, x, embs, idx, li, lj, lookups, report, index, done,
                  also) -> bool:
        """Replace `out` (the dense row and the pairs li, lj of the dot products of
        [x, embs...]) by the fused op, when the pairs are a model's order and embs are plain
        lookups as wide as x."""
        found = None if li is None or lj is None else _pairs_of(li, lj, len(embs) + 1)
        if found is None:
            report.not_fused.append((index, idx.name, "pairs that are not DLRM's or TorchRec's "
                                     "order"))
            return False
        embs = [_through_float_cast(e, lookups) for e in embs]
        lks = [lookups.get(e) for e in embs]
        if any(lk is None for lk in lks):
            report.not_fused.append((index, also[0].name, "a concatenation feeding a dot "
                                     "interaction with inputs that are not plain lookups"))
            return False
        xv = x.meta.get("val")
        if xv is None or xv.dim() != 2 or any(lk.dim != xv.shape[1] for lk in lks):
            report.not_fused.append((index, also[0].name, "the dense and pooled rows differ "
                                     "in D"))
            return False
        if len({lk.include_last for lk in lks}) != 1:
            return False
        pairs, itself = found
        gid = _fused_ops.register_group(self._modules(lks))
        args = (x, [lk.weight for lk in lks], [lk.indices for lk in lks],
                [lk.offsets for lk in lks], lks[0].include_last, "dot", pairs, itself,
                [lk.mean for lk in lks], [lk.padding_idx for lk in lks],
                [lk.bits for lk in lks], [lk.dim for lk in lks], gid)
        return self._replace(graph, out, _fused_ops.embedding_bags_interaction,
                             args, report, index,
                             f"{len(lks)} lookups + dot interaction ({pairs} order, "
                             f"self_interaction={itself})", done, embs + also)

    def _dlrm_cat(self, graph, cat, lookups, report, index, done) -> bool:
        """R = cat([x, e_0, ..., e_{F-1}], 1) with every e a lookup (and x not one)."""
        parts, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
        if dim not in (1, -1) or len(parts) < 2 or parts[0] in lookups:
            return False
        x, embs = parts[0], parts[1:]
        lks = [lookups.get(e) for e in embs]
        if any(lk is None for lk in lks):
            return False
        xv = x.meta.get("val")
        if xv is None or xv.dim() != 2 or xv.dtype is not torch.float32:
            return False
        if len({lk.include_last for lk in lks}) != 1:
            return False
        if any(len(e.users) != 1 for e in embs):
            report.not_fused.append((index, cat.name, "the pooled rows are used elsewhere too"))
            return False
        gid = _fused_ops.register_group(self._modules(lks))
        args = (x, [lk.weight for lk in lks], [lk.indices for lk in lks],
                [lk.offsets for lk in lks], lks[0].include_last, "cat", "dlrm", False,
                [lk.mean for lk in lks], [lk.padding_idx for lk in lks],
                [lk.bits for lk in lks], [lk.dim for lk in lks], gid)
        return self._replace(graph, cat, _fused_ops.embedding_bags_interaction,
                             args, report, index, f"{len(lks)} lookups + concatenation", done,
                             embs)

    def _dcn_cat(self, graph, cat, lookups, report, index, done) -> bool:
        """R = cat([x.unsqueeze(1), S], 1), the cross network's input [B, F + 1, D] (DCN:
        TorchRec's ``InteractionDCNArch``, MLPerf's DLRM-v2), S the F pooled rows seen as
        [B, F, D]: a view of their concatenation (through TorchRec's per-key split and
        concatenation back in order) or of the collection's output, their stack, or each
        ``e.unsqueeze(1)``.  R becomes the fused op's "cat" output [B, (F + 1) * D] seen as
        [B, F + 1, D] (the ``reshape([B, -1])`` after it: a view)."""
        parts, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        if dim not in (1, -2) or len(parts) < 2:
            return False
        flat = _uses(cat)      # only flattened into the cross network's input (not a dot)
        if len(flat) != 1 or flat[0].target not in (
                _aten.view.default, _aten.reshape.default, _aten._unsafe_view.default,
                _aten.flatten.using_ints) or getattr(flat[0].meta.get("val"), "ndim", 0) != 2:
            return False
        un = parts[0]
        if (un.op != "call_function" or un.target is not _aten.unsqueeze.default
                or un.args[1] not in (1, -2) or len(_uses(un)) != 1):
            return False
        x = un.args[0]
        xv = x.meta.get("val")
        if xv is None or xv.dim() != 2 or xv.dtype is not torch.float32:
            return False
        width = xv.shape[1]
        if len(parts) > 2:                   # cat([x.unsqueeze(1), e_0.unsqueeze(1), ...], 1)
            if any(p.op != "call_function" or p.target is not _aten.unsqueeze.default
                   or p.args[1] not in (1, -2) or len(_uses(p)) != 1 for p in parts[1:]):
                return False
            embs, also = [p.args[0] for p in parts[1:]], list(parts[1:])
        else:
            s = parts[1]
            if s.op != "call_function" or len(_uses(s)) != 1:
                return False
            ebc = self._collection_source(s)
            if ebc is not None:
                return self._dcn_collection(graph, cat, x, ebc, width, report, index, done)
            if s.target is _aten.stack.default:
                if (s.args[1] if len(s.args) > 1 else s.kwargs.get("dim", 0)) != 1:
                    return False
                embs, also = list(s.args[0]), [s]
            elif s.target in (_aten.view.default, _aten.reshape.default,
                              _aten._unsafe_view.default):
                src = _identity_recat(s.args[0])
                if (src.op != "call_function" or src.target is not _aten.cat.default
                        or (src.args[1] if len(src.args) > 1 else 0) not in (1, -1)
                        or len(_uses(src)) != 1):
                    return False
                embs, also = list(src.args[0]), [s, src, s.args[0]]
            else:
                return False
        embs = [_through_float_cast(e, lookups) for e in embs]
        lks = [lookups.get(e) for e in embs]
        if any(lk is None for lk in lks):
            return False
        if any(lk.dim != width for lk in lks) or len({lk.include_last for lk in lks}) != 1:
            return False
        if any(len(_uses(e)) != 1 for e in embs):
            report.not_fused.append((index, cat.name, "the pooled rows are used elsewhere too"))
            return False
        gid = _fused_ops.register_group(self._modules(lks))
        args = (x, [lk.weight for lk in lks], [lk.indices for lk in lks],
                [lk.offsets for lk in lks], lks[0].include_last, "cat", "dlrm", False,
                [lk.mean for lk in lks], [lk.padding_idx for lk in lks],
                [lk.bits for lk in lks], [lk.dim for lk in lks], gid)
        with graph.inserting_before(cat):
            fused = graph.call_function(_fused_ops.embedding_bags_interaction, args)
        fused.meta = {}
        return self._replace(graph, cat, _aten.unflatten.int, (fused, 1, [len(lks) + 1, width]),
                             report, index, f"{len(lks)} lookups + DCN concatenation "
                             "[B, F + 1, D]", done, embs + also)

    def _dcn_collection(self, graph, cat, x, ebc, width, report, index, done) -> bool:
        """_dcn_cat's collection form: the collection's F lookups into [B, (F + 1) * D]; a
        collection with packed 8/4/2-bit tables (inference only) the same way."""
        packed = ebc.target is torch.ops.perfkernels.embedding_bag_collection_packed.default
        args = list(ebc.args) + [None] * 11
        if packed:
            (weights, bits, dims, values, offsets, psw, num_keys, features, tables, mean,
             pads) = args[:11]
        else:
            (weights, values, offsets, psw, num_keys, features, tables, mean, pads) = args[:9]
            bits = dims = None
        if psw is not None:
            report.not_fused.append((index, cat.name, "weighted features"))
            return False
        if packed:
            if any(self.fqn_module.get(w) is None or d != width for w, d in zip(weights, dims)):
                return False
        elif any(self.fqn_module.get(w) is None or getattr(self.fqn_module[w], "weight", None)
                 is None or self.fqn_module[w].weight.shape[1] != width for w in weights):
            return False
        mods = []
        for w in weights:
            m = self.fqn_module.get(w)
            mods.append(m if isinstance(m, EmbeddingBag) else None)
        gid = _fused_ops.register_group(mods)
        if packed:
            target = _fused_ops.packed_collection_cat
            args = (x, list(weights), list(bits), list(dims), values, offsets, num_keys,
                    list(features), list(tables), list(mean), list(pads), gid)
        else:
            target = _fused_ops.collection_interaction
            args = (x, list(weights), values, offsets, num_keys, list(features), list(tables),
                    "cat", "dlrm", False, list(mean), list(pads), gid)
        with graph.inserting_before(cat):
            fused = graph.call_function(target, args)
        fused.meta = {}
        return self._replace(graph, cat, _aten.unflatten.int,
                             (fused, 1, [len(features) + 1, width]), report, index,
                             f"collection of {len(features)} features + DCN concatenation "
                             "[B, F + 1, D]", done, [ebc])

    def _lookups_only(self, graph, node, lookups, report, index, done) -> bool:
        """R = cat([e_0, ..., e_{F-1}], 1) or stack([e_0, ...], 1), every e a float32 lookup
        used only there: the fused op's "cat" form with a dense input of no columns (a stack is
        its [B, F, D] view)."""
        parts = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        stack = node.target is _aten.stack.default
        if dim not in ((1,) if stack else (1, -1)) or len(parts) < 2:
            return False
        embs = [_through_float_cast(e, lookups) for e in parts]
        lks = [lookups.get(e) for e in embs]
        if any(lk is None for lk in lks):
            return False
        vals = [e.meta.get("val") for e in embs]
        if any(v is None or v.dim() != 2 or v.dtype is not torch.float32 for v in vals):
            report.not_fused.append((index, node.name, "lookups whose rows are not float32"))
            return False
        if len({lk.include_last for lk in lks}) != 1:
            return False
        if stack and len({lk.dim for lk in lks}) != 1:
            return False
        if any(len(e.users) != 1 or len(p.users) != 1 for e, p in zip(embs, parts)):
            report.not_fused.append((index, node.name, "the pooled rows are used elsewhere too"))
            return False
        gid = _fused_ops.register_group(self._modules(lks))
        with graph.inserting_before(node):
            bags = graph.call_function(_aten.sym_size.int, (lks[0].offsets, 0))
            if lks[0].include_last:
                bags = graph.call_function(operator.sub, (bags, 1))
            dense = graph.call_function(_aten.empty.memory_format, ([bags, 0],),
                                        {"dtype": torch.float32})
        args = (dense, [lk.weight for lk in lks], [lk.indices for lk in lks],
                [lk.offsets for lk in lks], lks[0].include_last, "cat", "dlrm", False,
                [lk.mean for lk in lks], [lk.padding_idx for lk in lks],
                [lk.bits for lk in lks], [lk.dim for lk in lks], gid)
        if not stack:
            return self._replace(graph, node, _fused_ops.embedding_bags_interaction, args,
                                 report, index, f"{len(lks)} lookups + concatenation", done,
                                 embs)
        with graph.inserting_before(node):
            fused = graph.call_function(_fused_ops.embedding_bags_interaction, args)
        fused.meta = {}
        return self._replace(graph, node, _aten.unflatten.int, (fused, 1, [len(lks), lks[0].dim]),
                             report, index, f"{len(lks)} lookups + stack", done, embs)

    def _torchrec_dot(self, graph, cat, consts, report, index, done) -> bool:
        """cat([x, index(bmm(C, C^T), [None, li, lj])], 1), C = cat([x.unsqueeze(1), S], 1),
        S the collection's output [B, F*D] seen as [B, F, D] (through its per-key split and
        concatenation in key order, or directly)."""
        parts = cat.args[0]
        if len(parts) != 2 or (cat.args[1] if len(cat.args) > 1 else 0) not in (1, -1):
            return False
        x, idx = parts
        if idx.op != "call_function" or idx.target is not _aten.index.Tensor:
            return False
        bmm = _skip_full_slices_up(idx.args[0])
        if bmm.target is not _aten.bmm.default or len(idx.args[1]) != 3 \
                or idx.args[1][0] is not None:
            return False
        comb, tr = bmm.args
        if not _is_transpose_12(tr, comb) or comb.target is not _aten.cat.default:
            return False
        cparts = comb.args[0]
        if len(cparts) != 2 or cparts[0].target is not _aten.unsqueeze.default \
                or cparts[0].args[0] is not x:
            return False
        sparse = cparts[1]
        ebc = self._collection_source(sparse)
        if ebc is None:
            return False
        li = _constant_value(idx.args[1][1], consts)
        lj = _constant_value(idx.args[1][2], consts)
        (weights, values, offsets, psw, num_keys, features, tables, mean, pads) = \
            (list(ebc.args) + [None] * 9)[:9]
        found = None if li is None or lj is None else _pairs_of(li, lj, len(features) + 1)
        if found is None or psw is not None:
            report.not_fused.append((index, idx.name, "pairs that are not DLRM's or TorchRec's "
                                     "order, or weighted features"))
            return False
        pairs, itself = found
        mods = []
        for w in weights:
            m = self.fqn_module.get(w)
            mods.append(m if isinstance(m, EmbeddingBag) else None)
        gid = _fused_ops.register_group(mods)
        args = (x, list(weights), values, offsets, num_keys, list(features), list(tables),
                "dot", pairs, itself, list(mean), list(pads), gid)
        return self._replace(graph, cat, _fused_ops.collection_interaction,
                             args, report, index,
                             f"collection of {len(features)} features + dot interaction "
                             f"({pairs} order)", done, [comb])

    @staticmethod
    def _collection_source(node):
        """The embedding_bag_collection node whose [B, F*D] output ``node`` is, seen as
        [B, F, D] (a view / reshape, of its per-key split concatenated back in order)."""
        if node.target not in (_aten.view.default, _aten.reshape.default,
                               _aten._unsafe_view.default):
            return None
        src = node.args[0]
        targets = (torch.ops.perfkernels.embedding_bag_collection.default,
                   torch.ops.perfkernels.embedding_bag_collection_inference.default,
                   torch.ops.perfkernels.embedding_bag_collection_packed.default)
        if src.target in targets:
            return src
        if src.target is not _aten.cat.default:
            return None
        pieces = src.args[0]
        base = None
        for i, p in enumerate(pieces):
            if p.target is not operator.getitem or p.args[1] != i:
                return None
            split = p.args[0]
            if split.target not in (_aten.split_with_sizes.default, _aten.split.Tensor):
                return None
            if base is None:
                base = split
            elif split is not base:
                return None
        if base is None or base.args[0].target not in targets:
            return None
        sizes = base.args[1]
        if len(pieces) != len(sizes) if isinstance(sizes, (list, tuple)) else True:
            return None
        return base.args[0]

    # ---- running it
    def run(self, flat: list):
        feeds = []
        for feed in self.feeds:
            kind = feed[0]
            if kind == "state":
                value = feed[3].get(feed[2])
                feeds.append(value if value is not None else getattr(feed[1], feed[2]))
            elif kind == "const":
                feeds.append(feed[1])
            else:
                feeds.append(flat[feed[1]])
        out = self.gm.forward(*feeds)
        if self.single_output:
            return out[0]
        return pytree.tree_unflatten(list(out), self.out_spec)


# --------------------------------------------------------------------------- the model's side

class _State:
    """What optimize() keeps on the model (a plain object: no parameters, no state_dict keys)."""

    def __init__(self, report: OptimizationReport):
        self.report = report
        self.captures: dict = {}        # structure -> [_Capture]
        self.ordered: list = []         # every capture, in order
        self.failed: set = set()
        self.capturing = False
        self.watch: Optional[_Watch] = None   # the model as the captures saw it
        self.others: list = []          # earlier (watch, captures, ordered, failed), newest last
        self.changes = 0                # how often the model changed to a state not seen before
        self.eager = False              # changed too often: the model's own forward from now

    def add(self, key, cap) -> None:
        self.captures.setdefault(key, []).append(cap)
        self.ordered.append(cap)

    def switch(self, model) -> bool:
        """The model changed: keep the captures of the state it had (up to MAX_STATES of them,
        as model.train() / model.eval() flip between two), and take those of the state it has
        now if it had it before (True), or none (False: it captures again)."""
        if self.watch is not None:
            self.others.append((self.watch, self.captures, self.ordered, self.failed))
        self.captures, self.ordered, self.failed, self.watch = {}, [], set(), None
        for i, (watch, captures, ordered, failed) in enumerate(self.others):
            if watch.unchanged():
                del self.others[i]
                self.watch, self.captures, self.ordered, self.failed = \
                    watch, captures, ordered, failed
                return True
        del self.others[:-(MAX_STATES - 1)]
        return False

    def __deepcopy__(self, memo):
        # a copied model captures again (its graphs would read the original's parameters)
        return _State(self.report)

    def __getstate__(self):
        return {"report": self.report, "captures": {}, "ordered": [], "failed": set(),
                "capturing": False, "watch": None, "others": [], "changes": 0, "eager": False}


# --------------------------------------------------------------------------- what is watched

#: nn.Module's own containers in every module's ``__dict__``: the module tree, parameters and
#: buffers are compared by content (``_Watch.containers``), the hooks by ``_hooked``; the rest
#: (state-dict hooks, ...) never changes what forward computes
_CONTAINERS = frozenset({
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
    "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook", "_forward_hooks",
    "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})
#: what optimize() itself puts on the model
_OWN = frozenset({"forward", "_perfkernels_optimize"})
#: torch modules whose forward reads no plain attribute but these (their other attributes, such
#: as Linear's in_features, only describe them): the rest of them is not compared at each call
_READS = {torch.nn.Linear: ("training",), torch.nn.Sequential: ("training",),
          torch.nn.ModuleList: ("training",), torch.nn.ModuleDict: ("training",),
          torch.nn.Identity: ("training",), torch.nn.Sigmoid: ("training",),
          torch.nn.Tanh: ("training",), torch.nn.ReLU: ("training", "inplace"),
          torch.nn.Dropout: ("training", "p", "inplace")}
#: modules that call no submodule in forward (the tables, torch's and ours)
_LEAVES = frozenset({torch.nn.Linear, torch.nn.Identity, torch.nn.Sigmoid, torch.nn.Tanh,
                     torch.nn.ReLU, torch.nn.Dropout, torch.nn.EmbeddingBag, torch.nn.Embedding,
                     EmbeddingBag, Embedding, QuantizedEmbeddingBag, QuantizedEmbedding})
#: the hook dictionaries of a module's own call
_ROOT_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
               "_backward_pre_hooks")
_call = getattr(operator, "call", None) or (lambda f, x: f(x))
_global_hooks = torch.nn.modules.module
_HandleClass = torch.utils.hooks.RemovableHandle


def _hooked(modules: list) -> bool:
    """Whether a hook would run on a module under the root (its own forward, forward-pre or
    backward hooks, or torch's global module hooks): the captured graph never calls the
    submodules, so such a model runs its own forward.  (The root's hooks run around the
    replaced forward, as on any module.)"""
    g = _global_hooks
    if (g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
            or g._global_backward_pre_hooks):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
               or m._backward_pre_hooks for m in modules[1:])


def _snapshot(value):
    """A value as compared later: a copy of a list, dict or set (so an in-place edit shows),
    the value itself otherwise (compared by identity first, then ==)."""
    return value.copy() if type(value) in (list, dict, set) else value


class _Watch:
    """The model as its captures saw it, compared at every call: each module's identity in the
    tree, its parameters and buffers, its plain attributes (``training``, ``padding_idx``,
    ``mode``, a model's own flags, ...) and whether any module has a hook.  About 50 C-level
    comparisons per module; the hooks cost one integer comparison unless a hook handle was made
    anywhere since the last call (then the hook dictionaries are read again)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules = list(model.modules())
        self.dicts, self.getters, self.values, self.keys = [], [], [], []
        for i, m in enumerate(self.modules):
            d = m.__dict__
            keys = _READS.get(type(m))
            if keys is None or i == 0:
                keys = tuple(k for k in d if k not in _CONTAINERS and (i or k not in _OWN))
            keys = tuple(k for k in keys if k in d) or ("training",)
            getter = operator.itemgetter(*keys)
            self.dicts.append(d)
            self.getters.append(getter)
            self.keys.append(keys)
            got = getter(d)
            self.values.append(tuple(map(_snapshot, got)) if len(keys) > 1
                               else _snapshot(got))
        # a leaf's forward calls no submodule: its _modules is not compared, nor its empty
        # parameter and buffer dictionaries
        self.containers = []
        for m in self.modules:
            leaf = type(m) in _LEAVES
            for c in (m._modules, m._parameters, m._buffers):
                if c or not leaf:
                    self.containers.append(c)
        self.saved = [dict(c) for c in self.containers]
        self.handle_id = _HandleClass.next_id
        self.hooked = _hooked(self.modules)

    def unchanged(self) -> bool:
        """Whether the model is as it was (the hot path: call it at every call)."""
        if self.hooked or _HandleClass.next_id != self.handle_id:
            # a hook was made somewhere (or one was here: a removal changes no counter)
            self.hooked = _hooked(self.modules)
            self.handle_id = _HandleClass.next_id
        try:
            return (list(map(_call, self.getters, self.dicts)) == self.values
                    and self.containers == self.saved)
        except Exception:   # noqa: BLE001 - a key deleted, tensors compared: changed
            return False

    def what_changed(self, model: torch.nn.Module) -> str:
        """Which module and attribute differ (for the report; the slow path)."""
        now = _Watch(model)
        if [id(m) for m in now.modules] != [id(m) for m in self.modules]:
            return "the module tree"
        names = {id(m): n for n, m in model.named_modules()}
        for m, d, keys, old in zip(self.modules, self.dicts, self.keys, self.values):
            for j, k in enumerate(keys):
                was = old[j] if len(keys) > 1 else old
                try:
                    same = k in d and bool(d[k] is was or d[k] == was)
                except Exception:   # noqa: BLE001 - tensors compared
                    same = False
                if not same:
                    name = names.get(id(m))
                    return (f"{name}.{k}" if name else k) if name is not None \
                        else f"{k} of a {type(m).__name__}"
        return f"the parameters or buffers of {len(self.modules)} modules"


def _flatten_into(obj, flat: list, key: list) -> None:
    if isinstance(obj, Tensor):
        flat.append(obj)
        key.append((obj.dtype, obj.dim()))
    elif type(obj) in (list, tuple):
        key.append((type(obj), len(obj)))
        for item in obj:
            if type(item) is Tensor:     # the common leaf, without a call (the hot path)
                flat.append(item)
                key.append((item.dtype, item.dim()))
            else:
                _flatten_into(item, flat, key)
    elif type(obj) is dict:
        key.append(tuple(obj))
        for item in obj.values():
            _flatten_into(item, flat, key)
    else:   # any other pytree node (a KJT, ...) or leaf: as torch's pytree flattens it
        leaves, spec = pytree.tree_flatten(obj)
        key.append(spec)
        for leaf in leaves:
            if isinstance(leaf, Tensor):
                flat.append(leaf)
                key.append((leaf.dtype, leaf.dim()))
            else:
                flat.append(leaf)
                key.append(leaf if type(leaf) in (int, float, bool, str, type(None))
                           else type(leaf))


def _flatten(args, kwargs, training: bool):
    """The inputs' leaves in torch's pytree order, and their signature: structure, dtypes and
    ranks, plain values, and the train / eval mode."""
    flat, key = [], [training]
    _flatten_into(args, flat, key)
    _flatten_into(kwargs, flat, key)
    return flat, tuple(key)


def _dynamic_shapes(args):
    """Every dim of every tensor input: torch.export's Dim.AUTO (it keeps what it may); a
    registered node other than a list, tuple or dict is given as the list of its children."""
    auto = torch.export.Dim.AUTO

    def spec(x):
        if isinstance(x, Tensor):
            return {d: auto for d in range(x.dim())}
        if isinstance(x, (list, tuple)):
            return type(x)(spec(c) for c in x)
        if isinstance(x, dict):
            return {k: spec(v) for k, v in x.items()}
        node = pytree.SUPPORTED_NODES.get(type(x))
        if node is not None:
            return [spec(c) for c in node.flatten_fn(x)[0]]
        return None
    return tuple(spec(a) for a in args)


def _capture(model, state: _State, args, kwargs):
    """Export the model's own forward for these inputs and fuse it; None when it cannot."""
    report = state.report
    index = len(report.captures)
    state.capturing = True
    # the model's own hooks run around each real call, not in the capture's run of forward
    hooks = {name: model.__dict__[name] for name in _ROOT_HOOKS if name in model.__dict__}
    for name, value in hooks.items():
        model.__dict__[name] = type(value)()
    try:
        ep = torch.export.export(model, tuple(args), dict(kwargs), strict=False,
                                 dynamic_shapes=None if kwargs else _dynamic_shapes(args))
        cap = _Capture(model, ep, report, index)
    except Exception as exc:     # noqa: BLE001 - anything export cannot prove runs unfused
        report.captures.append((_describe(args, kwargs), f"not captured, runs unfused: "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
        log.info("optimize: capture failed (%s); this signature runs unfused", exc)
        return None
    finally:
        state.capturing = False
        model.__dict__.update(hooks)
    report.captures.append((_describe(args, kwargs), "captured"))
    return cap


def _describe(args, kwargs) -> str:
    flat, _ = pytree.tree_flatten((args, kwargs))
    shapes = [tuple(t.shape) for t in flat if isinstance(t, Tensor)]
    more = f", ... ({len(shapes)} tensors)" if len(shapes) > 3 else ""
    return ", ".join(str(s) for s in shapes[:3]) + more


def _optimized_forward(self, *args, **kwargs):
    """The optimized model's forward: the fused capture for these inputs' signature (captured at
    the first call with it), or the model's own forward where none applies."""
    state: _State = self.__dict__["_perfkernels_optimize"]
    own = type(self).forward
    if state.capturing or state.eager:
        return own(self, *args, **kwargs)
    flat, key = _flatten(args, kwargs, self.training)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        # traced by torch.compile / torch.export: the first capture that fits (its fused ops
        # stay single ops in their graph); none: the model's own forward
        for cap in state.ordered:
            if cap.matches(flat):
                return cap.run(flat)
        return own(self, *args, **kwargs)
    watch = state.watch
    if watch is None or not watch.unchanged():
        if not _rewatch(self, state):
            return own(self, *args, **kwargs)
        watch = state.watch
    if watch.hooked:
        # a hook on a submodule runs only if the submodules run: the model's own forward
        return own(self, *args, **kwargs)
    caps = state.captures.get(key)
    if caps is not None:
        for cap in caps:
            if cap.matches(flat):
                if torch.is_grad_enabled():
                    if cap.no_grad_tables and cap.records_no_gradient():
                        continue      # made without a gradient to record: another capture
                    if cap.sparse_grad:
                        return own(self, *args, **kwargs)
                return _run(cap, flat, self, args, kwargs)
    count = sum(len(v) for v in state.captures.values())
    if count >= MAX_CAPTURES or key in state.failed:
        return own(self, *args, **kwargs)
    cap = _capture(self, state, args, kwargs)
    # what the capture's run of the forward set on the modules (a lazily made attribute) is
    # part of the model the capture saw
    state.watch = _Watch(self)
    if cap is None or not cap.matches(flat):
        state.failed.add(key)
        return own(self, *args, **kwargs)
    state.add(key, cap)
    if torch.is_grad_enabled() and (
            cap.sparse_grad or (cap.no_grad_tables and cap.records_no_gradient())):
        return own(self, *args, **kwargs)
    return _run(cap, flat, self, args, kwargs)


def _run(cap, flat: list, model, args, kwargs):
    """The capture's answer; where an op of it refuses the input (a fused op's refusal, a
    lookup's RuntimeError for a bad index or 2-D indices with offsets, ...) the model's own
    forward runs, which raises the modules' own error (torch's class and message)."""
    try:
        return cap.run(flat)
    except Exception:   # noqa: BLE001 - the modules' own error (or answer) instead
        pass
    return type(model).forward(model, *args, **kwargs)


def _rewatch(model, state: _State) -> bool:
    """The model changed since its captures were made (or is seen for the first time): take
    the captures of a state it had before, or watch it as it is now with none (the call captures
    again); False when it changed to new states so often that it runs its own forward from now
    on (a forward that edits its own modules at every call)."""
    if state.watch is not None and (state.ordered or state.failed or state.others):
        what = state.watch.what_changed(model)
        if state.switch(model):
            return True
        state.changes += 1
        if state.changes > MAX_CHANGES:
            state.eager = True
            state.report.captures.append((what, "changed again: the model runs its own "
                                          "forward from now on"))
            log.info("optimize: %s changed %d times; running the model's own forward",
                     what, state.changes)
            return False
        state.report.captures.append((what, "changed: captured again"))
        log.info("optimize: %s changed; capturing again", what)
    state.watch = _Watch(model)
    return True


def optimize(model: torch.nn.Module, example_inputs: Any = None, *,
             inplace: bool = False, verbose: bool = False, **convert_options) -> torch.nn.Module:
    """Whole-model optimisation: :func:`convert`, then fused lookups + interaction.

    The model is converted as :func:`convert` converts it (``convert_options`` go there), its
    forward captured with ``torch.export`` (at the first call with each new input signature, or
    now from ``example_inputs``, a tuple of positional arguments), and each group of
    embedding-bag lookups whose outputs meet in facebookresearch DLRM's ``interact_features``
    ("dot", with or without ``arch_interaction_itself``, or "cat"), TorchRec's
    ``InteractionArch``, or a DCN's cross network input (``cat([x.unsqueeze(1), pooled], 1)``
    flattened: TorchRec's ``InteractionDCNArch``, MLPerf's DLRM-v2) is replaced by one fused op
    that writes the interaction's output directly (``[B, F, D]`` is never made).  Everything
    else runs as captured.

    Returns the model (a converted copy unless ``inplace``): its class, attributes, parameters
    and ``state_dict`` keys are the model's; only ``forward`` is replaced on the instance.
    Inputs whose shapes the capture did not cover are captured again (up to
    ``MAX_CAPTURES``), or run the unfused forward; input the fused op refuses runs the
    unfused forward too, which raises torch's own error.  Works under
    ``torch.compile(fullgraph=True)`` (after the first eager call or with ``example_inputs``)
    and ``torch.export``.  :func:`last_optimize_report` says what was fused and why the rest
    was not.

    Examples
    --------
    >>> import torch, perfkernels.torch as pkt
    >>> class TwoTables(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.EmbeddingBag(100, 4), torch.nn.EmbeddingBag(50, 4)
    ...     def forward(self, ia, oa, ib, ob):
    ...         return torch.cat([self.a(ia, oa), self.b(ib, ob)], 1)
    >>> inputs = (torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([3]), torch.tensor([0]))
    >>> model = TwoTables()
    >>> fast = pkt.optimize(model, inputs)      # both lookups and the cat: one fused op
    >>> torch.testing.assert_close(fast(*inputs), model(*inputs))
    >>> len(pkt.last_optimize_report().fused)
    1
    """
    global _last_report
    model = _convert.convert(model, inplace=inplace, **convert_options)
    report = OptimizationReport(conversion=_convert.last_report())
    state = _State(report)
    model.__dict__["_perfkernels_optimize"] = state
    # a function of its own per model class, with the signature of the class's forward (what
    # torch.export and inspect read)
    forward = types.FunctionType(_optimized_forward.__code__, _optimized_forward.__globals__,
                                 "forward")
    forward.__doc__ = _optimized_forward.__doc__
    forward.__signature__ = inspect.signature(type(model).forward)
    model.forward = types.MethodType(forward, model)
    _last_report = report
    state.watch = _Watch(model)
    if example_inputs is not None and not state.watch.hooked:
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        flat, key = _flatten(args, {}, model.training)
        cap = _capture(model, state, args, {})
        state.watch = _Watch(model)
        if cap is not None and cap.matches(flat):
            state.add(key, cap)
    if verbose:
        print(report)
    return model
