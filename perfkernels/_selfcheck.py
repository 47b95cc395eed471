"""The workloads of ``python -m perfkernels check``: small inputs for every kernel family, each
result compared with :mod:`perfkernels.reference` on every ISA level this CPU runs.

A quick installation check for users (the test suite is far more thorough).  Bit-exact formats
(conversions, quantization) are compared bit for bit; sums and the LSTM unit within the tolerance
their float32 arithmetic allows.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from . import _registry, reference
from ._variants import BITS, CONVERSIONS, GATE_ORDERS, MODES, TABLE_DTYPES

#: Families ``check`` knows, in the order it runs them: every family of the registry.
FAMILIES = _registry.FAMILY_NAMES
#: The sparse optimizers of the training family, each with the shape of its state (None: none).
OPTIMIZERS = {"sgd": None, "adagrad": "rows x D", "rowwise_adagrad": "rows"}
#: A few of the awkward dimensions: below, at and above a vector width, and a long odd row.
DIMS = (7, 64, 129)


class Check(NamedTuple):
    """One kernel call and its reference: ``rtol=None`` means bit-exact."""
    family: str
    name: str
    run: Callable[[], Any]          # returns an array or a tuple of arrays
    expected: Any                   # the reference's array / tuple / reference.Expected
    rtol: float | None = None
    atol: float = 0.0
    #: checks the result itself (raises AssertionError) where a single tolerance cannot say it
    verify: Callable[[Any], None] | None = None


def _convert(rng) -> list[Check]:
    import perfkernels as pk
    out = []
    for conv in CONVERSIONS:
        x = (rng.standard_normal(1001) * 1000).astype(np.float32).astype(conv.src)
        x[:4] = np.array([0.0, -0.0, np.inf, np.nan], np.float32).astype(conv.src)
        out.append(Check("convert", conv.name, lambda f=getattr(pk, conv.name), x=x: f(x),
                         getattr(reference, conv.name)(x)))
    return out


def _bag_inputs(rng, rows, n_bags):
    lengths = rng.integers(0, 9, n_bags)
    lengths[1] = 0                                         # an empty bag
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    indices = rng.integers(0, rows, int(lengths.sum()))
    return indices, offsets, rng.standard_normal(indices.size).astype(np.float32)


def _embedding(rng) -> list[Check]:
    import perfkernels as pk
    out = []
    for dtype_name, dtype in TABLE_DTYPES.items():
        for dim in DIMS:
            weight = rng.standard_normal((50, dim)).astype(np.float32).astype(dtype)
            indices, offsets, psw = _bag_inputs(rng, 50, 6)
            for mode in MODES:
                kw = dict(mode=mode, per_sample_weights=psw if mode == "sum" else None,
                          padding_idx=3)
                out.append(Check("embedding", f"{dtype_name} D={dim} {mode}",
                                 lambda w=weight, i=indices, o=offsets, kw=kw:
                                 pk.embedding_bag(w, i, o, **kw),
                                 reference.embedding_bag(weight, indices, offsets, **kw), 1e-5))
    return out


def _quantized(rng) -> list[Check]:
    import perfkernels as pk
    out = []
    for bits in BITS:
        for dim in DIMS:
            weight = rng.standard_normal((50, dim)).astype(np.float32)
            packed = reference.quantize_rowwise(weight, bits)
            out.append(Check("quantized", f"quantize {bits}-bit D={dim}",
                             lambda w=weight, b=bits: pk.quantize_rowwise(w, bits=b), packed))
            out.append(Check("quantized", f"dequantize {bits}-bit D={dim}",
                             lambda p=packed, b=bits, d=dim: pk.dequantize_rowwise(p, bits=b, dim=d),
                             reference.dequantize_rowwise(packed, bits, dim), 1e-6, 1e-6))
            indices, offsets, psw = _bag_inputs(rng, 50, 6)
            out.append(Check("quantized", f"bag {bits}-bit D={dim}",
                             lambda p=packed, i=indices, o=offsets, w=psw, b=bits, d=dim:
                             pk.embedding_bag_quantized(p, i, o, bits=b, dim=d, per_sample_weights=w),
                             reference.embedding_bag_quantized(packed, indices, offsets, bits=bits,
                                                               dim=dim, per_sample_weights=psw),
                             1e-5, 1e-5))
    return out


def _multi(rng) -> list[Check]:
    """One batch over a float32, a bfloat16 and a 4-bit table of different widths."""
    import perfkernels as pk
    batch = 6
    tables = [rng.standard_normal((40, 7)).astype(np.float32),
              rng.standard_normal((30, 64)).astype(np.float32).astype(TABLE_DTYPES["bfloat16"]),
              reference.quantize_rowwise(rng.standard_normal((50, 129)).astype(np.float32), 4)]
    bits, dims = [None, None, 4], [None, None, 129]
    lengths = rng.integers(0, 5, 3 * batch)
    lengths[batch:batch + 2] = 0                          # empty bags
    indices = np.concatenate([rng.integers(0, len(t), int(lengths[f * batch:(f + 1) * batch].sum()))
                              for f, t in enumerate(tables)])
    kw = dict(lengths=lengths, modes=["sum", "mean", "sum"], padding_idx=[None, 2, None],
              bits=bits, dims=dims)
    return [Check("multi", "3 tables (float32, bfloat16, 4-bit)",
                  lambda: pk.embedding_bags_multi(tables, indices, **kw),
                  reference.embedding_bags_multi(tables, indices, **kw), 1e-5, 1e-5)]


def _interaction(rng) -> list[Check]:
    """DLRM's dot interaction (both pair orders), then fused with three lookups."""
    import perfkernels as pk
    dense = rng.standard_normal((5, 17)).astype(np.float32)
    sparse = rng.standard_normal((5, 4, 17)).astype(np.float32)
    out = [Check("interaction", f"dot {pairs} D=17",
                 lambda p=pairs: pk.dot_interaction(dense, sparse, pairs=p),
                 reference.dot_interaction(dense, sparse, pairs=pairs), 1e-5, 1e-5)
           for pairs in ("dlrm", "torchrec")]
    tables = [rng.standard_normal((30, 17)).astype(np.float32) for _ in range(3)]
    indices = [rng.integers(0, 30, 9) for _ in range(3)]
    offsets = [np.array([0, 2, 2, 5, 7]) for _ in range(3)]
    out.append(Check("interaction", "3 lookups + dot D=17",
                     lambda: pk.embedding_bags_interaction(dense, tables, indices, offsets),
                     reference.embedding_bags_interaction(dense, tables, indices, offsets),
                     1e-5, 1e-5))
    return out


def _lstm(rng) -> list[Check]:
    import perfkernels as pk
    out = []
    for gate_order in GATE_ORDERS:
        for dim in DIMS:
            n = 5
            h_prev, c_prev, dh, dc = (rng.standard_normal((n, dim)).astype(np.float32) for _ in range(4))
            gates = (rng.standard_normal((n, 4 * dim)) * 3).astype(np.float32)
            kw = dict(seq_lengths=np.array([0, 1, 2, 3, 4]), t=1, forget_bias=1.0,
                      gate_order=gate_order)
            want_h, want_c = reference.lstm_unit(h_prev, c_prev, gates, **kw)
            c32 = want_c.astype(np.float32)
            out.append(Check("lstm", f"lstm_unit {gate_order} D={dim}",
                             lambda a=(h_prev, c_prev, gates), kw=kw: pk.lstm_unit(*a, **kw),
                             (want_h, want_c), 1e-5, 2e-6))
            out.append(Check("lstm", f"lstm_unit_backward {gate_order} D={dim}",
                             lambda a=(c_prev, gates, c32, dh, dc), kw=kw:
                             pk.lstm_unit_backward(*a, **kw),
                             reference.lstm_unit_backward(c_prev, gates, c32, dh, dc, **kw),
                             1e-5, 2e-6))
    return out


def _training(rng) -> list[Check]:
    """One fused backward + optimizer step per optimizer, checked with the reference's float32
    tolerance (every touched row, and untouched rows bit for bit)."""
    import perfkernels as pk
    out = []
    for optimizer, state_shape in OPTIMIZERS.items():
        for dim in DIMS:
            weight0 = rng.standard_normal((50, dim)).astype(np.float32)
            state0 = (None if state_shape is None else
                      rng.random((50, dim) if state_shape == "rows x D" else 50).astype(np.float32))
            indices, offsets, psw = _bag_inputs(rng, 50, 6)
            grad = rng.standard_normal((offsets.size, dim)).astype(np.float32)
            kw = dict(grad_output=grad, optimizer=optimizer, lr=0.1, eps=1e-8, weight_decay=0.01,
                      per_sample_weights=psw)

            def run(w0=weight0, h0=state0, i=indices, o=offsets, kw=kw):
                w, h = w0.copy(), None if h0 is None else h0.copy()
                pk.embedding_bag_backward_update(w, i, o, state=h, **kw)
                return w, h

            def verify(got, w0=weight0, h0=state0, i=indices, o=offsets, kw=kw):
                expected = reference.embedding_bag_backward_update(w0, i, o, state=h0, **kw)
                reference.assert_update_close(got[0], got[1], w0, h0, expected,
                                              optimizer=kw["optimizer"], lr=kw["lr"], eps=kw["eps"],
                                              weight_decay=kw["weight_decay"])

            out.append(Check("training", f"{optimizer} D={dim}", run, None, verify=verify))
    for optimizer in ("adam", "rowwise_adam"):
        for dim in DIMS:
            weight0 = rng.standard_normal((50, dim)).astype(np.float32)
            m0 = rng.standard_normal((50, dim)).astype(np.float32)
            v0 = rng.random((50, dim) if optimizer == "adam" else 50).astype(np.float32)
            indices, offsets, psw = _bag_inputs(rng, 50, 6)
            grad = rng.standard_normal((offsets.size, dim)).astype(np.float32)
            kw = dict(grad_output=grad, optimizer=optimizer, lr=0.1, eps=1e-8, weight_decay=0.01,
                      per_sample_weights=psw, step=3)

            def run(w0=weight0, m0=m0, v0=v0, i=indices, o=offsets, kw=kw):
                w, m, v = w0.copy(), m0.copy(), v0.copy()
                pk.embedding_bag_backward_update(w, i, o, state=(m, v), **kw)
                return w, m, v

            def verify(got, w0=weight0, m0=m0, v0=v0, i=indices, o=offsets, kw=kw):
                exp = reference.embedding_bag_backward_adam(w0, i, o, state=(m0, v0), **kw)
                for a, b in zip(got, (exp.weight, *exp.state)):
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
                assert np.array_equal(got[0][~exp.touched], w0[~exp.touched])

            out.append(Check("training", f"{optimizer} D={dim}", run, None, verify=verify))
    return out


def _sequence(rng) -> list[Check]:
    """Unpooled lookups: float tables bit for bit, packed rows within float32 rounding."""
    import perfkernels as pk
    out = []
    for dtype_name, dtype in TABLE_DTYPES.items():
        for dim in DIMS:
            weight = rng.standard_normal((50, dim)).astype(np.float32).astype(dtype)
            indices = rng.integers(0, 50, (3, 7))
            out.append(Check("sequence", f"embedding {dtype_name} D={dim}",
                             lambda w=weight, i=indices: pk.embedding(w, i),
                             reference.embedding(weight, indices)))
    for bits in BITS:
        for dim in DIMS:
            packed = reference.quantize_rowwise(rng.standard_normal((50, dim)).astype(np.float32),
                                                bits)
            indices = rng.integers(0, 50, (3, 7))
            out.append(Check("sequence", f"embedding {bits}-bit D={dim}",
                             lambda p=packed, i=indices, b=bits, d=dim:
                             pk.embedding_quantized(p, i, bits=b, dim=d),
                             reference.embedding_quantized(packed, indices, bits, dim), 1e-6))
    return out


_BUILDERS = {"convert": _convert, "embedding": _embedding, "quantized": _quantized,
             "multi": _multi, "interaction": _interaction, "lstm": _lstm, "training": _training,
             "sequence": _sequence}


def checks(families: list[str] | None = None) -> list[Check]:
    """The checks of the given families (default: all), built from seeded random inputs."""
    rng = np.random.default_rng(2026)
    out: list[Check] = []
    for family in families or FAMILIES:
        if family not in _BUILDERS:
            raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
        out.extend(_BUILDERS[family](rng))
    return out


def compare(check: Check, got) -> tuple[bool, str]:
    """(passed, detail) of one result against its check's reference."""
    if check.verify is not None:
        try:
            check.verify(got)
        except AssertionError as exc:
            return False, str(exc).splitlines()[0] if str(exc) else "outside the tolerance"
        return True, "within the float32 tolerance"
    gots = got if isinstance(got, tuple) else (got,)
    wants = check.expected if isinstance(check.expected, tuple) and not isinstance(
        check.expected, reference.Expected) else (check.expected,)
    if check.rtol is None:
        for g, w in zip(gots, wants):
            try:
                reference.assert_same_bits(g, w)
            except AssertionError as exc:
                return False, str(exc).splitlines()[0]
        return True, "bit-exact"
    try:
        worst = max(reference.max_excess(g, w, rtol=check.rtol, atol=check.atol)
                    for g, w in zip(gots, wants))
    except AssertionError as exc:
        return False, str(exc)
    detail = f"max error / tolerance = {worst:.2f} (rtol {check.rtol:g})"
    return worst <= 1.0, detail
