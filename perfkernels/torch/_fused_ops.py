"""The fused whole-model ops: many embedding-bag lookups and the feature interaction they feed
(DLRM's concatenation or pairwise dot products) as one registered op each.

    torch.ops.perfkernels.embedding_bags_interaction(dense, weights, indices, offsets, ...)
    torch.ops.perfkernels.collection_interaction(dense, weights, values, offsets, ...)

The first takes one index / offsets tensor per table (facebookresearch DLRM's ``lS_i``, ``lS_o``),
the second TorchRec's KeyedJaggedTensor layout (what :class:`EmbeddingBagCollection` takes).  Both
are native ops (perfkernels' native library defines them and runs the C kernels of
:func:`perfkernels.embedding_bags_interaction`, see docs/optimize.md, so compiled and exported
graphs call them without Python); eager calls without a gradient read the tensors straight from
Python (the ``_tensor_bags`` fast path).  They have fake implementations
(``torch.compile(fullgraph=True)`` and ``torch.export`` keep each one op), and autograd: the dense input's gradient and each table's, as the unfused model computes them
(dense, or a COO tensor for a table with ``sparse=True``, or the table's fused optimizer step).
:func:`perfkernels.torch.optimize` puts them into models.
"""
from __future__ import annotations

import functools
import itertools
import weakref
from typing import Optional

import torch
from torch import Tensor

from perfkernels.families.interaction._interaction import dot_interaction_backward, pair_lists

from . import _bags, _graph, _route, _tensor_bags
from ._bridge import as_numpy, native_index_error


class FusedInputError(RuntimeError):
    """Input a fused op refuses (malformed offsets, ...): nothing was written.  The optimized
    model answers it by running the unfused modules, which raise torch's own error."""


# --------------------------------------------------------------------------- groups of modules

#: group id -> the lookup modules of a fused group (weakly: the model owns them), so that the
#: backward of a fused op applies each table's own gradient rule (dense, sparse COO, or its
#: fused optimizer step)
_GROUPS: dict[int, list] = {}
_next_group = itertools.count(1)


def register_group(modules: list) -> int:
    """A new group id for these lookup modules (one per fused table, in order)."""
    gid = next(_next_group)
    _GROUPS[gid] = [None if m is None else weakref.ref(m) for m in modules]
    return gid


def _group_module(group: int, f: int):
    refs = _GROUPS.get(group)
    if refs is None or f >= len(refs) or refs[f] is None:
        return None
    return refs[f]()


# --------------------------------------------------------------------------- the shared forward

def _widths(dense: Tensor, weights: list, interaction: str, pairs: str, itself: bool,
            dims: Optional[list] = None) -> int:
    if interaction == "cat":
        return dense.shape[1] + sum(d if dims and d else w.shape[1]
                                    for w, d in zip(weights, dims or [0] * len(weights)))
    n = len(weights) + 1
    num_pairs = n * (n - 1) // 2 + (n if itself else 0)
    return dense.shape[1] + num_pairs


_PAIRS: dict = {}


def _pair_arrays(n: int, pairs: str, itself: bool):
    key = (n, pairs, itself)
    found = _PAIRS.get(key)
    if found is None:
        found = _PAIRS[key] = pair_lists(n, pairs, itself)
    return found


def _fast(dense, weights, indices, offsets, include_last, interaction, pairs, itself, mean,
          padding_idx, keep_pooled: bool = False):
    """The kernels read straight from the tensors (C, no NumPy views), or None.
    ``keep_pooled`` (``"dot"``): ``(output, pooled [B, F, D])``."""
    li = lj = None
    if interaction != "cat":
        li, lj = _pair_arrays(len(weights) + 1, pairs, itself)
    return _tensor_bags.interaction_lookup(dense, weights, indices, offsets, include_last,
                                           interaction == "cat", li, lj, mean, padding_idx,
                                           keep_pooled)


# --------------------------------------------------------------------------- per-table inputs

# The ops are defined, with their CPU kernels, by perfkernels' native library (native/ops.cpp,
# loaded by _bags): a compiled or exported graph calls them without Python.  What is registered
# here is what tracing and training need: fake implementations and the autograd formulas.

#: F lookups (``indices[f]`` / ``offsets[f]`` in ``weights[f]``, mode mean where ``mean[f]``,
#: ``padding_idx[f]`` (-1: none); a packed table where ``bits[f]`` is 8/4/2, of ``dims[f]``
#: columns, 0 for a float table) and the interaction with ``dense``: ``"cat"``
#: ``[B, Dd + sum D]``, ``"dot"`` ``[B, D + pairs]`` (pairs ``"dlrm"`` / ``"torchrec"``).
#: ``group``: the id of the modules whose gradient rules backward applies.
embedding_bags_interaction_op = torch.ops.perfkernels.embedding_bags_interaction.default

#: the same op without autograd, for graphs that record no gradient (torch.compile under
#: ``torch.no_grad()``): the dispatcher goes straight to the native kernel
embedding_bags_interaction_inference_op = \
    torch.ops.perfkernels.embedding_bags_interaction_inference.default


def _per_table_fake(dense, weights, indices, offsets, include_last_offset, interaction, pairs,
                    self_interaction, mean, padding_idx, bits, dims, group):
    return dense.new_empty((dense.shape[0], _widths(dense, weights, interaction, pairs,
                                                    self_interaction, dims)),
                           dtype=torch.float32)


torch.library.register_fake("perfkernels::embedding_bags_interaction")(_per_table_fake)
torch.library.register_fake("perfkernels::embedding_bags_interaction_inference")(
    _per_table_fake)

def _refused(exc: RuntimeError) -> RuntimeError:
    """A native fused op's error in an eager call, as what the optimized model answers by running
    its unfused modules: :class:`IndexOutOfRangeError` for an index, else FusedInputError."""
    bad_index = native_index_error(exc)
    if bad_index is not None:
        return bad_index
    return FusedInputError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _call(op, *args):
    """The registered op; in an eager call its errors become what the model refuses."""
    if torch.compiler.is_compiling():
        return op(*args)
    try:
        return op(*args)
    except RuntimeError as exc:
        if isinstance(exc, FusedInputError):
            raise
        raise _refused(exc) from None


def _needs_grad(dense: Tensor, weights: list) -> bool:
    return torch.is_grad_enabled() and (dense.requires_grad
                                        or any(w.requires_grad for w in weights))


def _eager(dense, weights, indices, offsets, include_last_offset, interaction, pairs,
           self_interaction, mean, padding_idx, bits, dims, group):
    """The lookups and the interaction without recording a gradient: the kernels straight from
    the tensors (no dispatcher) where they take them, else the native op's inference twin."""
    if not any(bits):
        out = _fast(dense, weights, indices, offsets, include_last_offset, interaction, pairs,
                    self_interaction, mean, padding_idx)
        if out is not None:
            return out
    return _call(embedding_bags_interaction_inference_op, dense, weights, indices, offsets,
                 include_last_offset, interaction, pairs, self_interaction, mean, padding_idx,
                 bits, dims, group)


_functorch_active = torch._C._are_functorch_transforms_active
_tracing_state = torch._C._get_tracing_state


def _lean_autograd() -> bool:
    """Whether an eager call with a gradient may take the lean autograd functions: not while a
    profiler runs (the registered op, recorded by name), a functorch transform is active or
    ``torch.jit.trace`` records (the registered op and its autograd serve those)."""
    return (not _bags._profiler_enabled() and not _functorch_active()
            and _tracing_state() is None)


def _c_apply(function):
    """``function.apply`` without its Python wrapper (which binds default arguments and unwraps
    functorch's dead wrappers, neither of which applies where no functorch transform is active,
    as callers check): several microseconds a call."""
    return super(torch.autograd.Function, function).apply


def embedding_bags_interaction(dense, weights, indices, offsets, include_last_offset, interaction,
                               pairs, self_interaction, mean, padding_idx, bits, dims, group):
    """What an optimized model's eager graph calls: without a gradient to record (grad mode off,
    or no input requiring one), the kernels straight from the tensors (no dispatcher); with one,
    the same forward under :class:`_BagsInteraction` (a lean autograd function: the backward of
    the registered op's autograd, without torch.library's per-call argument handling); under
    torch.compile / torch.export / torch.jit.trace, and while a profiler runs, the registered op
    (one op in their graphs, recorded by name)."""
    grad = _needs_grad(dense, weights)
    if not _route.capturing():
        args = (include_last_offset, interaction, pairs, self_interaction, mean, padding_idx,
                bits, dims, group)
        if not grad and not _bags._profiler_enabled():
            return _eager(dense, weights, indices, offsets, *args)
        if grad and _lean_autograd():
            return _bags_interaction_apply(dense, indices, offsets, args, *weights)
    if torch._C._get_tracing_state() is not None:
        # torch.jit.trace: the op chosen without the grad mode, which its check changes
        grad = _graph.records_grad_traced(dense, *weights)
    op = embedding_bags_interaction_op if grad else embedding_bags_interaction_inference_op
    return _call(op, dense, weights, indices, offsets, include_last_offset, interaction, pairs,
                 self_interaction, mean, padding_idx, bits, dims, group)


# --------------------------------------------------------------------------- a KJT

def _split_kjt(values: Tensor, offsets: Tensor, num_keys: int, features: list):
    """Per output slot, the feature's values (a view) and offsets rebased to them (B + 1)."""
    batch = (offsets.shape[0] - 1) // max(num_keys, 1)
    host = as_numpy(offsets)
    if (offsets.shape[0] - 1) % max(num_keys, 1):
        raise FusedInputError(f"offsets has {offsets.shape[0]} entries; it needs F * B + 1 for "
                              f"the {num_keys} tables")
    idx, offs = [], []
    for f in features:
        o = offsets[f * batch:(f + 1) * batch + 1]
        start, end = int(host[f * batch]), int(host[(f + 1) * batch])
        if not 0 <= start <= end <= values.shape[0]:
            raise FusedInputError(f"offsets of feature {f} run from {start} to {end}, outside "
                                  f"the {values.shape[0]} values")
        idx.append(values[start:end])
        offs.append(o - start)
    return idx, offs


#: the lookups of a collection (TorchRec's KJT ``values`` / ``offsets``, F * B + 1; output slot
#: i is input feature ``features[i]`` in ``weights[tables[i]]``) and the interaction with
#: ``dense``, as :data:`embedding_bags_interaction_op` (native, like it)
collection_interaction_op = torch.ops.perfkernels.collection_interaction.default


@torch.library.register_fake("perfkernels::collection_interaction")
def _collection_fake(dense, weights, values, offsets, num_keys, features, tables, interaction,
                     pairs, self_interaction, mean, padding_idx, group):
    return dense.new_empty((dense.shape[0], _widths(dense, [weights[t] for t in tables],
                                                    interaction, pairs, self_interaction)),
                           dtype=torch.float32)


def _collection_eager(dense, weights, values, offsets, num_keys, features, tables, interaction,
                      pairs, self_interaction, mean, padding_idx, group):
    """The KJT lookups and the interaction without recording a gradient: the kernels straight
    from the tensors where they take them, else the native op below its autograd kernel."""
    try:
        idx, offs = _split_kjt(values, offsets, num_keys, features)
    except FusedInputError:
        idx = None
    if idx is not None:
        out = _fast(dense, [weights[t] for t in tables], idx, offs, True, interaction, pairs,
                    self_interaction, [mean[t] for t in tables],
                    [padding_idx[t] for t in tables])
        if out is not None:
            return out
    with torch._C._AutoDispatchBelowAutograd():
        return _call(collection_interaction_op, dense, weights, values, offsets, num_keys,
                     features, tables, interaction, pairs, self_interaction, mean, padding_idx,
                     group)


def collection_interaction(dense, weights, values, offsets, num_keys, features, tables,
                           interaction, pairs, self_interaction, mean, padding_idx, group):
    """The KJT form of :func:`embedding_bags_interaction` (the optimized graph's eager call):
    without a gradient to record, the kernels straight from the tensors; with one, the same
    forward under :class:`_CollectionInteraction`; under torch.compile / torch.export / torch.jit.trace and while
    a profiler runs, the registered op."""
    if not _route.capturing():
        args = (num_keys, features, tables, interaction, pairs, self_interaction, mean,
                padding_idx, group)
        grad = _needs_grad(dense, weights)
        if not grad and not _bags._profiler_enabled():
            return _collection_eager(dense, weights, values, offsets, *args)
        if grad and _lean_autograd():
            return _collection_interaction_apply(dense, values, offsets, args, *weights)
    return _call(collection_interaction_op, dense, weights, values, offsets, num_keys, features,
                 tables, interaction, pairs, self_interaction, mean, padding_idx, group)


def packed_collection_cat(dense, weights, bits, dims, values, offsets, num_keys, features,
                          tables, mean, padding_idx, group):
    """``cat([dense, <the collection's pooled rows>], 1)`` for a collection whose tables may be
    packed 8/4/2-bit rows (``bits[t]``, 0 for a float table; inference only, as the packed
    collection op): in an eager call the KJT split per output slot and one fused lookup that
    writes every slot's pooled rows into its columns (with grad on, the gradient of ``dense``
    and of a float table beside the packed ones as :func:`embedding_bags_interaction` gives
    them); under torch.compile / torch.export / torch.jit.trace, the registered packed
    collection op and the concatenation."""
    if not _route.capturing():
        try:
            idx, offs = _split_kjt(values, offsets, num_keys, features)
        except FusedInputError:
            idx = None
        if idx is not None:
            return embedding_bags_interaction(
                dense, [weights[t] for t in tables], idx, offs, True, "cat", "dlrm", False,
                [mean[t] for t in tables], [padding_idx[t] for t in tables],
                [bits[t] for t in tables], [dims[t] for t in tables], group)
    pooled = torch.ops.perfkernels.embedding_bag_collection_packed.default(
        weights, bits, dims, values, offsets, None, num_keys, features, tables, mean,
        padding_idx)
    return torch.cat([dense, pooled], 1)


# --------------------------------------------------------------------------- autograd

def _pooled(weights, indices, offsets, include_last, mean, padding_idx, bits=None,
            dims=None) -> list:
    bits = bits or [0] * len(weights)
    dims = dims or [0] * len(weights)
    return [_bags.lookup(w.detach(), i, o, None, "mean" if m else "sum", include_last,
                         None if p < 0 else p, b, d if b else None)
            for w, i, o, m, p, b, d in zip(weights, indices, offsets, mean, padding_idx, bits,
                                           dims)]


def _interaction_grads(grad: Tensor, dense: Tensor, pooled: list, interaction: str, pairs: str,
                       itself: bool):
    """(d dense, [d pooled_f]) of the interaction: ``"cat"`` slices the output gradient; ``"dot"``
    is :func:`perfkernels.dot_interaction_backward` (per sample, ``(G + G^T) z`` with G the pairs'
    gradients; no stacked ``[B, n, D]`` copy, no ``[B, n, n]`` matrices, outputs from the memory
    pool): each table's gradient is a ``[B, D]`` column slice of one ``[B, F, D]`` result."""
    if grad.dtype is not torch.float32:
        grad = grad.float()
    d = dense.shape[1]
    if interaction == "cat":    # (``pooled``: the tables' widths are enough)
        parts, col = [], d
        for p in pooled:
            width = p if isinstance(p, int) else p.shape[1]
            parts.append(grad[:, col:col + width])
            col += width
        return grad[:, :d], parts
    stacked = isinstance(pooled, Tensor)      # [B, F, D], or F [B, D] tensors
    if dense.dtype is not torch.float32:
        dense = dense.float()
    g_dense, g_pooled = dot_interaction_backward(
        as_numpy(grad if grad.is_contiguous() else grad.contiguous()),
        as_numpy(dense if dense.is_contiguous() else dense.contiguous()),
        as_numpy(pooled) if stacked else [as_numpy(p.contiguous()) for p in pooled],
        pairs=pairs, self_interaction=itself)
    # (unbind: the F column views in one call)
    return torch.from_numpy(g_dense), list(torch.from_numpy(g_pooled).unbind(1))


def _table_grads(grads, weights, indices, offsets, include_last, mean, padding_idx, modules,
                 needs) -> list:
    """Each table's gradient by its module's own rule: its fused optimizer (no gradient), a
    sparse COO gradient (``sparse=True``) or a dense one."""
    out = []
    for f, (g, w, i, o, m, p) in enumerate(zip(grads, weights, indices, offsets, mean,
                                               padding_idx)):
        if not needs or not w.requires_grad or not w.is_floating_point():
            out.append(None)       # (a packed table has no gradient)
            continue
        module = modules[f]
        backward = getattr(module, "weight_backward", None)
        # a fused optimizer's step reads the rows of a column slice where they are
        opt = getattr(module, "fused_optimizer", None)
        fused = opt is not None
        if fused and getattr(backward, "__func__", None) in _FUSED_BACKWARDS:
            # the module's own fused step, queued without a BagBackward (what its
            # weight_backward would do)
            opt.queue(w, module._buffers, g, i, o, bool(m), include_last, None if p < 0 else p)
            out.append(None)
            continue
        b = _bags.BagBackward(g if fused else g.contiguous(), i, o, None,
                              "mean" if m else "sum", include_last, None if p < 0 else p,
                              w.shape[0], w.dtype)
        if backward is not None:
            out.append(backward(b))
        elif getattr(module, "sparse", False):
            out.append(_bags.sparse_weight_grad(b, b.padding_idx))
        else:
            out.append(_bags.dense_weight_grad(b))
    return out


def _fused_backwards() -> tuple:
    from ._embedding import Embedding
    from ._embedding_bag import EmbeddingBag
    return (EmbeddingBag._fused_weight_backward, Embedding._fused_weight_backward)


#: the modules' own fused-optimizer weight backwards (a user's replacement is called as given)
_FUSED_BACKWARDS = _fused_backwards()


def _per_table_setup(ctx, inputs, output):
    (dense, weights, indices, offsets, include_last, interaction, pairs, itself, mean,
     padding_idx, bits, dims, group) = inputs
    ctx.save_for_backward(dense, *weights, *indices, *offsets)
    ctx.num = len(weights)
    ctx.options = (include_last, interaction, pairs, itself, mean, padding_idx, bits, dims,
                   group)


def _per_table_grads(grad, dense, weights, indices, offsets, options, needs_dense: bool,
                     needs_tables: bool, pooled: Optional[Tensor] = None):
    """(d dense or None, [d weights[f] or None]) of the per-table op for the output gradient
    ``grad``; ``options``: the op's arguments after ``offsets``; ``pooled``: the forward's
    pooled rows [B, F, D] of a ``"dot"`` interaction where it kept them (else looked up
    again)."""
    include_last, interaction, pairs, itself, mean, padding_idx, bits, dims, group = options
    if interaction == "cat":    # the gradient's column slices: no lookup needed
        pooled = [d if b else w.shape[1] for w, b, d in zip(weights, bits, dims)]
    elif pooled is None:
        if not any(bits):       # every table's pooled rows in one call, as [B, F, D]
            rows = _fast(dense.new_empty((dense.shape[0], 0), dtype=torch.float32), weights,
                         indices, offsets, include_last, "cat", pairs, itself, mean,
                         padding_idx)
            if rows is not None:
                pooled = rows.view(dense.shape[0], len(weights), -1)
        if pooled is None:
            pooled = _pooled(weights, indices, offsets, include_last, mean, padding_idx, bits,
                             dims)
    g_dense, g_pooled = _interaction_grads(grad, dense, pooled, interaction, pairs, itself)
    modules = [_group_module(group, f) for f in range(len(weights))]
    g_tables = _table_grads(g_pooled, weights, indices, offsets, include_last, mean,
                            padding_idx, modules, needs_tables)
    g_dense = g_dense.to(dense.dtype) if needs_dense else None
    return g_dense, [g if w.requires_grad else None for g, w in zip(g_tables, weights)]


def _per_table_backward(ctx, grad):
    num = ctx.num
    dense, *rest = ctx.saved_tensors
    g_dense, g_tables = _per_table_grads(grad, dense, rest[:num], rest[num:2 * num],
                                         rest[2 * num:], ctx.options, ctx.needs_input_grad[0],
                                         ctx.needs_input_grad[1])
    return (g_dense, g_tables, [None] * num, [None] * num, None, None, None, None, None, None,
            None, None, None)


torch.library.register_autograd("perfkernels::embedding_bags_interaction", _per_table_backward,
                                setup_context=_per_table_setup)


class _BagsInteraction(torch.autograd.Function):
    """The eager form of the registered op's autograd: ``(dense, indices, offsets, options,
    *weights)``, ``options`` the op's arguments after ``offsets``.  The forward runs the no-grad
    route; the backward is the registered op's."""

    @staticmethod
    def forward(ctx, dense, indices, offsets, options, *weights):
        weights = list(weights)
        out = pooled = None
        if options[1] != "cat" and not any(options[6]):
            # the "dot" backward needs the pooled rows: kept from this lookup (the same
            # kernels, the same output bits)
            found = _fast(dense, weights, indices, offsets, options[0], options[1], options[2],
                          options[3], options[4], options[5], True)
            if found is not None:
                out, pooled = found
        if out is None:
            out = _eager(dense, weights, indices, offsets, *options)
        ctx.save_for_backward(dense, *weights, *indices, *offsets)
        ctx.num = len(weights)
        ctx.options = options
        ctx.pooled = pooled
        return out

    @staticmethod
    def backward(ctx, grad):
        num = ctx.num
        dense, *rest = ctx.saved_tensors
        needs = ctx.needs_input_grad
        g_dense, g_tables = _per_table_grads(grad, dense, rest[:num], rest[num:2 * num],
                                             rest[2 * num:], ctx.options, needs[0],
                                             any(needs[4:]), ctx.pooled)
        ctx.pooled = None
        return (g_dense, None, None, None, *g_tables)


_bags_interaction_apply = _c_apply(_BagsInteraction)


def _collection_setup(ctx, inputs, output):
    (dense, weights, values, offsets, num_keys, features, tables, interaction, pairs, itself,
     mean, padding_idx, group) = inputs
    ctx.save_for_backward(dense, values, offsets, *weights)
    ctx.options = (num_keys, features, tables, interaction, pairs, itself, mean, padding_idx,
                   group)


def _collection_backward(ctx, grad):
    dense, values, offsets, *weights = ctx.saved_tensors
    g_dense, g_weights = _collection_grads(grad, dense, values, offsets, weights, ctx.options,
                                           ctx.needs_input_grad[0], ctx.needs_input_grad[1])
    return (g_dense, g_weights, None, None, None, None, None, None, None, None, None, None,
            None)


def _collection_grads(grad, dense, values, offsets, weights, options, needs_dense: bool,
                      needs_tables: bool):
    """(d dense or None, [d weights[t] or None]) of the collection op for the output gradient
    ``grad``; ``options``: the op's arguments after ``offsets``."""
    num_keys, features, tables, interaction, pairs, itself, mean, padding_idx, group = options
    idx, offs = _split_kjt(values, offsets, num_keys, features)
    slot_w = [weights[t] for t in tables]
    slot_mean = [mean[t] for t in tables]
    slot_pad = [padding_idx[t] for t in tables]
    pooled = _pooled(slot_w, idx, offs, True, slot_mean, slot_pad)
    g_dense, g_pooled = _interaction_grads(grad, dense, pooled, interaction, pairs, itself)
    g_weights = [None] * len(weights)
    if needs_tables:
        # a table read by several slots: one backward over all of its bags (so a fused
        # optimizer steps once per table, as the collection does)
        for t in sorted(set(tables)):
            slots = [s for s, tt in enumerate(tables) if tt == t]
            if len(slots) == 1:
                s = slots[0]
                g_i, i_i, o_i = g_pooled[s], idx[s], offs[s]
            else:
                g_i = torch.cat([g_pooled[s] for s in slots])
                i_i = torch.cat([idx[s] for s in slots])
                pieces, base = [], 0
                for k, s in enumerate(slots):
                    o = offs[s] + base
                    pieces.append(o if k == len(slots) - 1 else o[:-1])
                    base += idx[s].shape[0]
                o_i = torch.cat(pieces)
            g_weights[t] = _table_grads([g_i], [weights[t]], [i_i], [o_i], True, [mean[t]],
                                        [padding_idx[t]], [_group_module(group, t)], True)[0]
    g_dense = g_dense.to(dense.dtype) if needs_dense else None
    return g_dense, g_weights


torch.library.register_autograd("perfkernels::collection_interaction", _collection_backward,
                                setup_context=_collection_setup)


class _CollectionInteraction(torch.autograd.Function):
    """The eager form of the registered collection op's autograd: ``(dense, values, offsets,
    options, *weights)``, ``options`` the op's arguments after ``offsets``; the backward is the
    registered op's."""

    @staticmethod
    def forward(ctx, dense, values, offsets, options, *weights):
        weights = list(weights)
        out = _collection_eager(dense, weights, values, offsets, *options)
        ctx.save_for_backward(dense, values, offsets, *weights)
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, grad):
        dense, values, offsets, *weights = ctx.saved_tensors
        needs = ctx.needs_input_grad
        g_dense, g_weights = _collection_grads(grad, dense, values, offsets, weights,
                                               ctx.options, needs[0], any(needs[4:]))
        return (g_dense, None, None, None, *g_weights)


_collection_interaction_apply = _c_apply(_CollectionInteraction)
