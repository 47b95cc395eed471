"""Smoke check run on an emulated CPU (``qemu-x86_64 -cpu <model> python smoke.py <expected ISA>``).

Imports perfkernels, prints ``show_runtime()``, checks that the level chosen at import is the
expected one for the emulated CPU, and calls every public kernel once on the default (chosen)
level and on each lower level, comparing with plain NumPy float64 arithmetic.  Kept free of torch
and of pytest so that it runs quickly under emulation.  Exits non-zero on any mismatch; an illegal
instruction would kill the process with SIGILL, which the caller reports.
"""
import sys

import ml_dtypes
import numpy as np

import perfkernels as pk


def check_all() -> None:
    rng = np.random.default_rng(0)
    D = 19  # not a multiple of any vector width: main loops and tails both run
    x = rng.standard_normal((5, D)).astype(np.float32)

    np.testing.assert_array_equal(pk.float_to_half(x).view(np.uint16), x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(pk.half_to_float(x.astype(np.float16)), x.astype(np.float16).astype(np.float32))
    b = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(pk.float_to_bfloat16(x).view(np.uint16), b.view(np.uint16))
    np.testing.assert_array_equal(pk.bfloat16_to_float(b), b.astype(np.float32))

    table = rng.standard_normal((40, D)).astype(np.float32)
    indices = rng.integers(0, 40, 30)
    offsets = np.array([0, 4, 4, 17])
    weights = rng.random(30, dtype=np.float32)
    bounds = list(offsets) + [len(indices)]
    expected = np.stack([(table[indices[s:e]].astype(np.float64) * weights[s:e, None]).sum(0)
                         for s, e in zip(bounds[:-1], bounds[1:])])
    np.testing.assert_allclose(pk.embedding_bag(table, indices, offsets, per_sample_weights=weights),
                               expected, rtol=1e-5, atol=1e-5)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        t = table.astype(dtype)
        exp = np.stack([t[indices[s:e]].astype(np.float64).sum(0) for s, e in zip(bounds[:-1], bounds[1:])])
        np.testing.assert_allclose(pk.embedding_bag(t, indices, offsets), exp, rtol=1e-5, atol=1e-5)

    for bits in (8, 4, 2):
        packed = pk.quantize_rowwise(table, bits=bits)
        deq = pk.dequantize_rowwise(packed, bits=bits, dim=D)
        levels = 2 ** bits - 1
        step = (table.max(1) - table.min(1)) / levels
        assert np.all(np.abs(deq - table) <= step[:, None] * 0.51 + 2e-2 * (bits < 8)), bits
        exp = np.stack([deq[indices[s:e]].astype(np.float64).sum(0) for s, e in zip(bounds[:-1], bounds[1:])])
        np.testing.assert_allclose(pk.embedding_bag_quantized(packed, indices, offsets, bits=bits, dim=D),
                                   exp, rtol=1e-4, atol=1e-4)

    # several tables in one call: a float32 and an 8-bit feature, each against its own reference
    packed = pk.quantize_rowwise(table, bits=8)
    deq = pk.dequantize_rowwise(packed, bits=8)
    lengths = np.diff(bounds)
    multi = pk.embedding_bags_multi([table, packed], np.concatenate([indices, indices]),
                                    lengths=np.concatenate([lengths, lengths]), bits=[None, 8])
    for f, t in enumerate((table, deq)):
        exp = np.stack([t[indices[s:e]].astype(np.float64).sum(0) for s, e in zip(bounds[:-1], bounds[1:])])
        np.testing.assert_allclose(multi[:, f * D:(f + 1) * D], exp, rtol=1e-4, atol=1e-4)

    # the fused backward + row-wise Adagrad step, against the formula in float64
    grad = rng.standard_normal((len(offsets), D)).astype(np.float32)
    state = rng.random(40, dtype=np.float32)
    w64, h64 = table.astype(np.float64), state.astype(np.float64)
    g = np.zeros((40, D))
    for b, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        np.add.at(g, indices[s:e], grad[b].astype(np.float64))
    touched = np.unique(indices)
    h64[touched] += (g[touched] ** 2).mean(1)
    w64[touched] -= 0.1 * g[touched] / (np.sqrt(h64[touched])[:, None] + 1e-8)
    updated = table.copy()
    pk.embedding_bag_backward_update(updated, indices, offsets, grad_output=grad,
                                     optimizer="rowwise_adagrad", state=state, lr=0.1)
    np.testing.assert_allclose(state, h64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(updated, w64, rtol=1e-4, atol=1e-5)

    # unpooled lookups, float and 8-bit rows
    grid = indices[:12].reshape(3, 4)
    np.testing.assert_array_equal(pk.embedding(table, grid), table[grid])
    np.testing.assert_allclose(pk.embedding_quantized(packed, grid), deq[grid], rtol=1e-6, atol=1e-6)

    # DLRM's dot interaction, alone and fused with the lookups of two tables
    dense = rng.standard_normal((len(offsets), D)).astype(np.float32)
    pooled = np.stack([np.stack([t[indices[s:e]].astype(np.float64).sum(0)
                                 for s, e in zip(bounds[:-1], bounds[1:])]) for t in (table, deq)], 1)
    z = np.concatenate([dense[:, None].astype(np.float64), pooled], 1)
    li, lj = np.tril_indices(3, -1)
    exp = np.concatenate([dense, (z @ z.transpose(0, 2, 1))[:, li, lj]], 1)
    np.testing.assert_allclose(pk.dot_interaction(dense, pooled.astype(np.float32)), exp,
                               rtol=1e-4, atol=1e-4)
    # its gradient: (G + G^T) z per sample, G the pairs' gradients at (li, lj)
    grad = rng.standard_normal(exp.shape).astype(np.float32)
    G = np.zeros((len(dense), 3, 3))
    G[:, li, lj] = grad[:, D:]
    dz = (G + G.transpose(0, 2, 1)) @ z
    d_dense, d_sparse = pk.dot_interaction_backward(grad, dense, pooled.astype(np.float32))
    np.testing.assert_allclose(d_dense, grad[:, :D] + dz[:, 0], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(d_sparse, dz[:, 1:], rtol=1e-4, atol=1e-3)
    fused = pk.embedding_bags_interaction(dense, [table, packed], [indices, indices],
                                          [offsets, offsets], bits=[None, 8])
    np.testing.assert_allclose(fused, exp, rtol=1e-4, atol=1e-3)

    n = 6
    h_prev, c_prev = rng.standard_normal((2, n, D)).astype(np.float32)
    gates = rng.standard_normal((n, 4 * D)).astype(np.float32)
    g = gates.astype(np.float64)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    i, f, o, gg = sig(g[:, :D]), sig(g[:, D:2 * D]), sig(g[:, 2 * D:3 * D]), np.tanh(g[:, 3 * D:])
    c_exp = f * c_prev + i * gg
    h_exp = o * np.tanh(c_exp)
    h, c = pk.lstm_unit(h_prev, c_prev, gates)
    np.testing.assert_allclose(h, h_exp, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(c, c_exp, rtol=1e-5, atol=2e-6)
    dh, dc = rng.standard_normal((2, n, D)).astype(np.float32)
    dh_prev, dc_prev, dgates = pk.lstm_unit_backward(c_prev, gates, c, dh, dc)
    tc = np.tanh(c.astype(np.float64))
    dct = dc + dh * o * (1 - tc ** 2)
    np.testing.assert_allclose(dc_prev, dct * f, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(dh_prev, 0)
    np.testing.assert_allclose(dgates[:, 3 * D:], dct * i * (1 - gg ** 2), rtol=1e-4, atol=1e-5)


def main() -> int:
    expected = sys.argv[1]
    pk.show_runtime()
    assert pk.active_isa() == expected, (pk.active_isa(), expected)
    assert pk.available_isas()[-1] == expected, pk.available_isas()
    for isa in pk.available_isas():
        with pk.use_isa(isa):
            check_all()
        print(f"checked every kernel on {isa}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
