"""The references themselves (perfkernels.reference), checked against PyTorch on the CPU.

Every kernel test trusts these oracles, so each is compared here with an independent
implementation: PyTorch's float64 ops (embedding_bag, autograd through the LSTM formulas) and its
bit-exact quantized prepack/unpack ops.  The comparison helpers are checked to fail when they must.
"""
import numpy as np
import pytest

from conftest import AWKWARD_DIMS, BITS, GATE_ORDERS, MODES, without_zero_bias_signs_off_x86
from perfkernels import reference

torch = pytest.importorskip("torch")

PREPACK = {8: torch.ops.quantized.embedding_bag_byte_prepack,
           4: torch.ops.quantized.embedding_bag_4bit_prepack,
           2: torch.ops.quantized.embedding_bag_2bit_prepack}
UNPACK = {8: torch.ops.quantized.embedding_bag_byte_unpack,
          4: torch.ops.quantized.embedding_bag_4bit_unpack,
          2: torch.ops.quantized.embedding_bag_2bit_unpack}


def scaled_table(rng, rows, dim):
    """Rows of very different scales, one constant row, one with signed zeros."""
    x = (rng.standard_normal((rows, dim)) * 10.0 ** rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    x[0] = 0.5
    if rows > 1:
        x[1] = rng.choice(np.float32([0.0, -0.0]), dim)
    return x


# ---- quantize / dequantize ------------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_matches_torch_prepack(rng, bits, dtype):
    for dim in AWKWARD_DIMS + (136, 256):
        if bits != 8 and dim % (8 // bits):
            continue                                    # PyTorch needs whole bytes of codes
        x = scaled_table(rng, 41, dim).astype(dtype)
        np.testing.assert_array_equal(
            *without_zero_bias_signs_off_x86(x, reference.quantize_rowwise(x, bits),
                                             PREPACK[bits](torch.from_numpy(x)).numpy()),
            err_msg=f"dim={dim}")


@pytest.mark.parametrize("bits", BITS)
def test_quantize_extreme_rows_match_torch(rng, bits):
    dim = 64
    tables = [rng.uniform(-3e38, 3e38, (8, dim)), rng.uniform(-1e6, 1e6, (8, dim)),
              rng.standard_normal((8, dim)) * 10.0 ** rng.integers(-30, 30, (8, dim)),
              rng.uniform(0, 1, (8, dim)) * 70000 + 65500]
    for x in tables:
        x = x.astype(np.float32)
        np.testing.assert_array_equal(reference.quantize_rowwise(x, bits),
                                      PREPACK[bits](torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("bits", BITS)
def test_quantize_any_dim_pads_with_zero_codes_and_round_trips(rng, bits):
    """Dims PyTorch rejects: zero codes pad the last byte; the round trip is within a step."""
    per = 8 // bits
    for dim in AWKWARD_DIMS:
        x = scaled_table(rng, 5, dim)
        packed = reference.quantize_rowwise(x, bits)
        assert packed.shape == (5, reference.packed_row_bytes(dim, bits))
        if bits != 8 and dim % per:
            assert np.all(packed[:, dim // per] >> ((dim % per) * bits) == 0)
        step = (x.max(1) - x.min(1)) / ((1 << bits) - 1)
        err = np.abs(reference.dequantize_rowwise(packed, bits, dim) - x).max(1)
        assert np.all(err <= step * (0.5 if bits == 8 else 1.0) + 1e-3 * np.abs(x).max(1) + 1e-6)


def test_quantize_rejects_nonfinite_rows():
    x = np.ones((4, 8), np.float32)
    x[2, 5] = np.inf
    with pytest.raises(ValueError, match="row 2"):
        reference.quantize_rowwise(x, 8)


@pytest.mark.parametrize("bits", BITS)
def test_dequantize_matches_torch_unpack(rng, bits):
    x = scaled_table(rng, 31, 64)
    packed = reference.quantize_rowwise(x, bits)
    np.testing.assert_allclose(reference.dequantize_rowwise(packed, bits, 64),
                               UNPACK[bits](torch.from_numpy(packed)).numpy(), rtol=1e-6, atol=1e-6)


# ---- embedding bags -------------------------------------------------------------------------------

def torch_bag(table, indices, offsets, **kw):
    kw = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    return torch.nn.functional.embedding_bag(
        torch.from_numpy(indices), torch.from_numpy(table),
        None if offsets is None else torch.from_numpy(offsets), **kw).numpy()


@pytest.mark.parametrize("mode", MODES)
def test_embedding_bag_matches_torch_float64(rng, mode):
    rows, dim = 50, 12
    table = rng.standard_normal((rows, dim))
    lengths = rng.integers(0, 7, 15)
    lengths[3] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    indices = rng.integers(0, rows, int(lengths.sum()))
    psw = rng.standard_normal(indices.size) if mode == "sum" else None
    for pad in (None, 7, -3):
        want = torch_bag(table, indices, offsets, mode=mode, per_sample_weights=psw, padding_idx=pad)
        got = reference.embedding_bag(table, indices, offsets, mode=mode, per_sample_weights=psw,
                                      padding_idx=pad)
        np.testing.assert_allclose(got.value, want, rtol=1e-12, atol=1e-12)
        assert np.all(got.magnitude >= np.abs(got.value) - 1e-12)
    # the other bag conventions describe the same bags
    base = reference.embedding_bag(table, indices, offsets, mode=mode).value
    np.testing.assert_array_equal(
        reference.embedding_bag(table, indices, lengths=lengths, mode=mode).value, base)
    np.testing.assert_array_equal(reference.embedding_bag(
        table, indices, np.append(offsets, indices.size), include_last_offset=True, mode=mode).value,
        base)
    two_d = rng.integers(0, rows, (6, 4))
    np.testing.assert_allclose(reference.embedding_bag(table, two_d, mode=mode).value,
                               torch_bag(table, two_d, None, mode=mode), rtol=1e-12, atol=1e-12)


def test_embedding_bags_multi_is_torch_per_feature_side_by_side(rng):
    """The KJT layout: feature f's values follow feature f-1's; sample b's row is every
    feature's pooled row in feature order (as TorchRec's KeyedTensor)."""
    F, B = 3, 5
    tables = [rng.standard_normal((rows, dim)) for rows, dim in ((9, 2), (4, 3), (30, 1))]
    lengths = rng.integers(0, 4, F * B)
    lengths[B:2 * B] = 0                       # an empty feature (the "mean" one: torch has no
                                               # per-sample weights in mean mode)
    indices = np.concatenate([rng.integers(0, tables[f].shape[0], int(lengths[f * B:(f + 1) * B].sum()))
                              for f in range(F)])
    psw = rng.standard_normal(indices.size)
    got = reference.embedding_bags_multi(tables, indices, lengths=lengths, per_sample_weights=psw,
                                         modes=["sum", "mean", "sum"], padding_idx=[None, 1, -2])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    want = []
    for f, (mode, pad) in enumerate(zip(["sum", "mean", "sum"], [None, 1, -2])):
        lo, hi = offsets[f * B], offsets[(f + 1) * B]
        weights = {"per_sample_weights": psw[lo:hi]} if mode == "sum" else {}  # torch: sum only
        want.append(torch_bag(tables[f], indices[lo:hi], offsets[f * B:(f + 1) * B] - lo,
                              mode=mode, padding_idx=pad, **weights))
    assert got.value.shape == (B, 6)
    np.testing.assert_allclose(got.value[:, [0, 1, 5]], np.concatenate([want[0], want[2]], 1),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got.value[:, 2:5], 0)   # the empty feature
    again = reference.embedding_bags_multi(tables, indices, offsets=offsets, per_sample_weights=psw,
                                           modes=["sum", "mean", "sum"], padding_idx=[None, 1, -2])
    np.testing.assert_array_equal(again.value, got.value)


def test_positional_weights_index_the_position_in_the_bag(rng):
    table = rng.standard_normal((20, 5))
    indices = rng.integers(0, 20, 9)
    offsets = np.array([0, 4, 4, 6])
    pw = rng.standard_normal(4)
    expanded = np.concatenate([pw[:4], pw[:2], pw[:3]])
    np.testing.assert_array_equal(
        reference.embedding_bag(table, indices, offsets, per_sample_weights=pw,
                                positional_weights=True).value,
        reference.embedding_bag(table, indices, offsets, per_sample_weights=expanded).value)


def test_embedding_bag_raises_on_bad_index():
    with pytest.raises(IndexError, match=r"indices\[2\] = -1 is out of range for a table of 4 rows"):
        reference.embedding_bag(np.ones((4, 2)), np.array([0, 3, -1]), np.array([0]))


@pytest.mark.parametrize("bits", BITS)
def test_quantized_bags_are_bags_of_the_dequantized_table(rng, bits):
    packed = reference.quantize_rowwise(scaled_table(rng, 30, 16), bits)
    indices, offsets = rng.integers(0, 30, 25), np.array([0, 10, 10, 20])
    got = reference.embedding_bag_quantized(packed, indices, offsets, bits=bits, mode="mean")
    want = torch_bag(UNPACK[bits](torch.from_numpy(packed)).numpy().astype(np.float64), indices,
                     offsets, mode="mean")
    np.testing.assert_allclose(got.value, want, rtol=1e-6, atol=1e-6)


# ---- LSTM unit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("gate_order", GATE_ORDERS)
def test_lstm_matches_torch_autograd(rng, gate_order):
    n, d = 5, 7
    h_prev = rng.standard_normal((n, d))
    c_prev = rng.standard_normal((n, d))
    gates = rng.standard_normal((n, 4 * d)) * 3
    tc_prev = torch.from_numpy(c_prev).requires_grad_()
    tg = torch.from_numpy(gates).requires_grad_()
    blocks = dict(zip(gate_order, tg.chunk(4, dim=1)))
    i, f = torch.sigmoid(blocks["i"]), torch.sigmoid(blocks["f"] + 0.25)
    o, g = torch.sigmoid(blocks["o"]), torch.tanh(blocks["g"])
    c = f * tc_prev + i * g
    h = o * torch.tanh(c)
    kw = dict(forget_bias=0.25, gate_order=gate_order)
    rh, rc = reference.lstm_unit(h_prev, c_prev, gates, **kw)
    np.testing.assert_allclose(rh, h.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(rc, c.detach().numpy(), rtol=1e-12)
    dh, dc = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    torch.autograd.backward([h, c], [torch.from_numpy(dh), torch.from_numpy(dc)])
    dh_prev, dc_prev, dgates = reference.lstm_unit_backward(c_prev, gates, rc, dh, dc, **kw)
    assert not dh_prev.any()
    np.testing.assert_allclose(dc_prev, tc_prev.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgates, tg.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("drop_states", [False, True])
def test_lstm_invalid_rows(rng, drop_states):
    n, d = 4, 3
    h_prev, c_prev, dh, dc = (rng.standard_normal((n, d)) for _ in range(4))
    gates = rng.standard_normal((n, 4 * d))
    lens = np.array([0, 2, 1, 5])
    h, c = reference.lstm_unit(h_prev, c_prev, gates, seq_lengths=lens, t=1, drop_states=drop_states)
    dh_prev, dc_prev, dg = reference.lstm_unit_backward(c_prev, gates, c, dh, dc, seq_lengths=lens, t=1,
                                                        drop_states=drop_states)
    invalid = lens <= 1
    for got, kept in ((h, h_prev), (c, c_prev), (dh_prev, dh), (dc_prev, dc)):
        np.testing.assert_array_equal(got[invalid], 0 * kept[invalid] if drop_states else kept[invalid])
    assert not dg[invalid].any() and not dh_prev[~invalid].any()


# ---- the comparison helpers fail when they must ---------------------------------------------------

def test_assert_close_scales_with_the_magnitude():
    expected = reference.Expected(np.array([1.0, 0.0]), np.array([1.0, 1e6]))
    reference.assert_close(np.array([1.0 + 9e-6, 9.0]), expected, rtol=1e-5)
    with pytest.raises(AssertionError, match="1 of 2 elements off"):
        reference.assert_close(np.array([1.0 + 2e-5, 0.0]), expected, rtol=1e-5)
    with pytest.raises(AssertionError):
        reference.assert_close(np.array([np.nan, 0.0]), expected)
    with pytest.raises(AssertionError, match="shape"):
        reference.assert_close(np.zeros(3), expected)
    assert reference.max_excess(np.array([1.0, 5.0]), expected, rtol=1e-5) == pytest.approx(0.5)


def test_assert_same_bits_sees_signed_zeros_and_nan_payloads():
    reference.assert_same_bits(np.float32([0.0, np.nan]), np.float32([0.0, np.nan]))
    with pytest.raises(AssertionError):
        reference.assert_same_bits(np.float32([0.0]), np.float32([-0.0]))
    quiet, other = np.uint32([0x7fc00000, 0x7fc00001]).view(np.float32)
    with pytest.raises(AssertionError):
        reference.assert_same_bits(np.float32([quiet]), np.float32([other]))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("mode", MODES)
def test_backward_update_matches_torch_float64(rng, optimizer, mode):
    """The training reference against nn.EmbeddingBag(sparse=True) + torch.optim in float64,
    duplicates and a padding row included, over two steps (the state carries over)."""
    rows, dim, lr, eps = 20, 5, 0.1, 1e-10
    weight = rng.standard_normal((rows, dim))
    bag = torch.nn.EmbeddingBag(rows, dim, mode=mode, sparse=True, padding_idx=3,
                                dtype=torch.float64)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(weight))
    opt = (torch.optim.SGD(bag.parameters(), lr=lr) if optimizer == "sgd"
           else torch.optim.Adagrad(bag.parameters(), lr=lr, eps=eps))
    w, h = weight, (None if optimizer == "sgd" else np.zeros((rows, dim)))
    for _ in range(2):
        indices = rng.integers(0, 8, 30)
        offsets = np.array([0, 4, 4, 11, 20])
        grad = rng.standard_normal((5, dim))
        opt.zero_grad()
        (bag(torch.from_numpy(indices), torch.from_numpy(offsets)) * torch.from_numpy(grad)).sum().backward()
        opt.step()
        w, h, _, _ = reference.embedding_bag_backward_update(
            w, indices, offsets, grad_output=grad, optimizer=optimizer, state=h, lr=lr, eps=eps,
            mode=mode, padding_idx=3)
    np.testing.assert_allclose(w, bag.weight.detach().numpy(), rtol=1e-12, atol=1e-13)
    if h is not None:
        np.testing.assert_allclose(h, opt.state[bag.weight]["sum"].numpy(), rtol=1e-12)
