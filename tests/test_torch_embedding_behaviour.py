"""The behaviours of ``torch.nn.Embedding`` / ``torch.nn.functional.embedding``, checked on
torch's own classes and on ours: ``perfkernels.torch.Embedding`` / ``perfkernels.torch.embedding``
and an ``nn.Embedding`` passed through ``perfkernels.torch.convert`` (the ``impl`` parameter).
Each test states a behaviour, checks it against a value derived here from the behaviour (index
counts, norms, zero rows), and compares ours with torch's module on the same weights and inputs,
so that a test passing on torch and failing on ours shows a difference.

Behaviours, and the test that checks each:

- sparse=True: the gradient is a sparse tensor of the weight's shape, with the index counts as
  rows: ``test_sparse_gradient_is_sparse_of_the_weights_shape``; also for a table of 0 rows x 0
  columns and of 10 rows x 0 columns: ``test_sparse_gradient_of_empty_tables``.
- A sparse gradient lists each looked-up index once per lookup with its output gradient row, and a
  second backward appends to it (float64 and float32):
  ``test_sparse_gradient_indices_and_values_accumulate``.
- ``.to(float16)`` (``bfloat16``) of a sparse module: the weight's dtype changes, its sizes stay,
  lookups return that dtype: ``test_to_16_bit_keeps_the_sizes_and_looks_up``.
- max_norm: looked-up rows of norm above ``max_norm`` are rescaled in the weight, in place, others
  are not, and equal indices give equal rows: ``test_max_norm_renormalises_looked_up_rows``; the
  gradient still counts each index's lookups (max_norm is not differentiated):
  ``test_max_norm_gradient_counts_lookups``; forward-mode AD passes the tangent's rows through:
  ``test_max_norm_forward_ad_passes_tangent_rows``, and without max_norm
  ``test_forward_ad_gathers_tangent_rows``.
- from_pretrained: integer and float tables are kept as given and looked up as given, frozen by
  default: ``test_from_pretrained_keeps_table_and_dtype``; with padding_idx, the padding row is
  not zeroed: ``test_from_pretrained_keeps_the_padding_row``; with max_norm, norm_type 0.5 and
  sparse under a float64 default dtype, the given tensor is renormalised in place:
  ``test_from_pretrained_options_renormalise_the_given_tensor``.
- The functional form equals the module's lookup, with and without padding_idx:
  ``test_functional_equals_module``.
- Dense gradients and their double backward are those of a gather (gradcheck, gradgradcheck;
  float64 and float32): ``test_dense_gradient_and_double_backward_gradcheck``.
- A weight that is not 2-D raises RuntimeError "'weight' must be 2-D" (0-D and 3-D):
  ``test_weight_must_be_2d``.
- padding_idx: the padding row is zero at construction and looked up as zero, for non-negative and
  negative padding_idx, dense and sparse, float32 / float16 / bfloat16:
  ``test_padding_rows_look_up_as_zero``; a padding row set by hand is looked up as set:
  ``test_padding_row_set_by_hand_is_looked_up``; padding_idx outside ``[-rows, rows)`` fails the
  constructor's assertion: ``test_padding_idx_out_of_range_is_an_assertion``; the padding row
  gets no gradient, from one backward or from a double backward, whatever the number of padding
  lookups (1, 2, 1000) and other indices: ``test_padding_row_gets_no_gradient``.
- scale_grad_by_freq: each row's gradient is divided by its count in the batch, and it is refused
  with sparse gradients: ``test_scale_grad_by_freq``.
- Index dtypes: int64 and int32 look up the same rows; other dtypes raise RuntimeError naming
  Long and Int; an index outside ``[0, rows)`` raises IndexError "index out of range in self":
  ``test_int32_and_int64_indices_look_up_the_same_rows``, ``test_other_index_dtypes_are_refused``,
  ``test_index_out_of_range``.
"""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck, gradgradcheck  # noqa: E402

import perfkernels.torch as pkt  # noqa: E402


class Impl:
    """How one implementation builds its module and calls the functional form."""

    def __init__(self, name, make, from_pretrained, functional):
        self.name, self.make, self.from_pretrained, self.functional = \
            name, make, from_pretrained, functional

    def __repr__(self):
        return self.name


IMPLS = [
    Impl("torch", torch.nn.Embedding, torch.nn.Embedding.from_pretrained,
         torch.nn.functional.embedding),
    Impl("perfkernels", pkt.Embedding, pkt.Embedding.from_pretrained, pkt.embedding),
    Impl("converted", lambda *a, **kw: pkt.convert(torch.nn.Embedding(*a, **kw)),
         lambda *a, **kw: pkt.convert(torch.nn.Embedding.from_pretrained(*a, **kw)),
         pkt.embedding),
]


@pytest.fixture(params=IMPLS, ids=repr)
def impl(request):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # our one-time fallback notices
        yield request.param


def twin(impl, *args, dtype=None, **kwargs):
    """(torch's module, impl's module) of the same sizes and options, with equal weights (each
    its own Parameter), in ``dtype`` when given."""
    ref = torch.nn.Embedding(*args, **kwargs)
    mod = impl.make(*args, **kwargs)
    # convert() leaves max_norm and scale_grad_by_freq to torch; otherwise the module is ours
    left_to_torch = impl.name == "torch" or (impl.name == "converted" and (
        kwargs.get("max_norm") is not None or kwargs.get("scale_grad_by_freq")))
    assert isinstance(mod, pkt.Embedding) != left_to_torch
    if dtype is not None:
        ref, mod = ref.to(dtype), mod.to(dtype)
    with torch.no_grad():
        mod.weight.copy_(ref.weight)
    return ref, mod


def counts(indices, rows):
    """How many times each row is looked up (float64 column)."""
    return torch.bincount(indices.reshape(-1), minlength=rows).double()[:, None]


def dense(grad):
    return grad.to_dense() if grad.is_sparse else grad


def same(got, want):
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# --------------------------------------------------------------------------- sparse gradients


def test_sparse_gradient_is_sparse_of_the_weights_shape(impl):
    idx = torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]])
    ref, mod = twin(impl, 10, 20, sparse=True)
    ref(idx).sum().backward()
    mod(idx).sum().backward()
    assert mod.weight.grad.is_sparse and mod.weight.grad.shape == mod.weight.shape
    same(dense(mod.weight.grad).double(), counts(idx, 10).expand(10, 20))
    same(dense(mod.weight.grad), dense(ref.weight.grad))


@pytest.mark.parametrize("rows,dim", [(0, 0), (10, 0)])
def test_sparse_gradient_of_empty_tables(impl, rows, dim):
    idx = torch.tensor([], dtype=torch.long) if rows == 0 else torch.tensor([[0, 2, 4], [9, 3, 0]])
    ref, mod = twin(impl, rows, dim, sparse=True)
    for m in (ref, mod):
        m(idx).sum().backward()
        assert m.weight.grad.is_sparse and m.weight.grad.shape == (rows, dim)
    same(dense(mod.weight.grad), dense(ref.weight.grad))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sparse_gradient_indices_and_values_accumulate(impl, dtype):
    ref, mod = twin(impl, 10, 3, sparse=True, dtype=dtype)
    first, second = torch.tensor([7, 1, 3]), torch.tensor([8, 1, 3])
    g1 = torch.arange(9, dtype=dtype).view(3, 3)
    g2 = -torch.arange(9, dtype=dtype).view(3, 3)
    for m in (ref, mod):
        m(first).backward(g1)
        grad = m.weight.grad
        same(grad._indices(), first[None])
        same(grad._values(), g1)
        m(second).backward(g2)
        same(m.weight.grad._indices(), torch.cat([first, second])[None])
        same(m.weight.grad._values(), torch.cat([g1, g2]))
    want = torch.zeros(10, 3, dtype=dtype).index_add_(0, first, g1).index_add_(0, second, g2)
    same(dense(mod.weight.grad), want)


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_to_16_bit_keeps_the_sizes_and_looks_up(impl, dtype):
    ref, mod = twin(impl, 10, 3, sparse=True)
    assert mod.weight.dtype == torch.get_default_dtype() and mod.weight.device.type == "cpu"
    ref.to(dtype), mod.to(dtype)
    assert mod.weight.dtype == dtype
    assert (mod.num_embeddings, mod.embedding_dim) == (10, 3) and mod.weight.shape == (10, 3)
    idx = torch.tensor([1, 2, 9, 1])
    out = mod(idx)
    assert out.dtype == dtype
    same(out, mod.weight.detach()[idx])
    same(out, ref(idx))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.float32, torch.float64])
def test_from_pretrained_keeps_table_and_dtype(impl, dtype):
    table = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=dtype)
    mod = impl.from_pretrained(table)
    assert mod.weight.dtype == dtype and not mod.weight.requires_grad
    same(mod.weight.detach(), table)
    idx = torch.tensor([2, 0, 2])
    same(mod(idx), table[idx])
    same(mod(idx), torch.nn.Embedding.from_pretrained(table)(idx))


def test_from_pretrained_keeps_the_padding_row(impl):
    table = torch.rand(4, 3)
    table[2] = 7.0
    mod = impl.from_pretrained(table, padding_idx=2)
    same(mod.weight.detach()[2], torch.full((3,), 7.0))
    same(mod(torch.tensor([2, 1])), table[[2, 1]])


def test_from_pretrained_options_renormalise_the_given_tensor(impl):
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        given = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        original = given.clone()
        opts = dict(max_norm=2.0, norm_type=0.5, scale_grad_by_freq=False, sparse=True)
        ref = torch.nn.Embedding.from_pretrained(original.clone(), **opts)
        mod = impl.from_pretrained(given, **opts)
        out = mod(torch.tensor([0, 1]))
        assert out.dtype == torch.float64
        same(out, given)                            # the weight is the given tensor, renormalised
        assert bool((given != original).all())
        # the 0.5-"norm" (sum |x|^0.5)^2 of every row is now max_norm (up to the 1e-7 margin)
        norms = given.abs().sqrt().sum(1) ** 2
        torch.testing.assert_close(norms, torch.full((2,), 2.0), rtol=1e-6, atol=0)
        assert bool((norms <= 2.0).all())
        torch.testing.assert_close(out, ref(torch.tensor([0, 1])))
    finally:
        torch.set_default_dtype(default)


# --------------------------------------------------------------------------- max_norm


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_max_norm_renormalises_looked_up_rows(impl, norm_type):
    torch.manual_seed(0)
    ref, mod = twin(impl, 22, 5, max_norm=1.0, norm_type=norm_type)
    with torch.no_grad():
        ref.weight.mul_(3.0)
        mod.weight.copy_(ref.weight)
    before = mod.weight.detach().clone()
    idx = torch.tensor([2, 8, 8, 6])
    out = mod(idx)
    same(out[1], out[2])
    norms = out.detach().norm(p=norm_type, dim=1)
    # the row scaled by max_norm / (norm + 1e-7) can have a norm a float32 rounding above 1.0
    # when summed again (aarch64, norm_type 1: torch's own module too)
    assert bool((norms <= 1.0 + 1e-6).all())
    torch.testing.assert_close(norms, torch.ones(4), rtol=1e-6, atol=0)
    untouched = [r for r in range(22) if r not in (2, 6, 8)]
    same(mod.weight.detach()[untouched], before[untouched])
    scale = before[idx].norm(p=norm_type, dim=1, keepdim=True)
    torch.testing.assert_close(mod.weight.detach()[idx], before[idx] / scale)
    same(out, ref(idx))
    same(mod.weight.detach(), ref.weight.detach())


def test_max_norm_gradient_counts_lookups(impl):
    weight = (torch.randn(4, 4) * 2).requires_grad_()
    ref_weight = weight.detach().clone().requires_grad_()
    idx = torch.tensor([0, 1, 2, 2])
    impl.functional(idx, weight, max_norm=1.0).sum().backward()
    same(weight.grad.double(), counts(idx, 4).expand(4, 4))
    torch.nn.functional.embedding(idx, ref_weight, max_norm=1.0).sum().backward()
    same(weight.grad, ref_weight.grad)


def test_max_norm_forward_ad_passes_tangent_rows(impl):
    weight = torch.randn(4, 4) * 2
    tangent = torch.arange(16.0).view(4, 4)
    idx = torch.tensor([[0, 1], [2, 2]])
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(weight, tangent)
        out = impl.functional(idx, dual, max_norm=1.0)
        jvp = torch.autograd.forward_ad.unpack_dual(out).tangent
    same(jvp, tangent[idx])


def test_forward_ad_gathers_tangent_rows(impl):
    weight = torch.randn(4, 4)
    tangent = torch.arange(16.0).view(4, 4)
    idx = torch.tensor([[0, 1], [2, 2]])
    with torch.autograd.forward_ad.dual_level():
        out = impl.functional(idx, torch.autograd.forward_ad.make_dual(weight, tangent))
        primal, jvp = torch.autograd.forward_ad.unpack_dual(out)
    same(primal, weight[idx])
    same(jvp, tangent[idx])


# --------------------------------------------------------------------------- functional, autograd


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_functional_equals_module(impl, padding_idx):
    idx = torch.tensor([[1, 3, 2], [0, 2, 1]])
    table = torch.rand(4, 3, requires_grad=True)
    mod = impl.from_pretrained(table, padding_idx=padding_idx)
    got = impl.functional(idx, table, padding_idx=padding_idx)
    same(got, mod(idx))
    same(got, table.detach()[idx])
    same(got, torch.nn.functional.embedding(idx, table, padding_idx=padding_idx))
    # a plain module whose weight is set to the table looks up the same
    plain = impl.make(4, 3)
    plain.weight.data = table.data
    same(plain(idx), got)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dense_gradient_and_double_backward_gradcheck(impl, dtype):
    weight = impl.make(20, 20).to(dtype).weight
    idx = torch.tensor([[0, 1, 1, 2], [3, 5, 7, 11]])

    def lookup(w):
        return impl.functional(idx, w)

    tol = {} if dtype == torch.float64 else {"eps": 1e-2, "atol": 1e-2, "rtol": 1e-2}
    assert gradcheck(lookup, (weight,), **tol)
    assert gradgradcheck(lookup, (weight,), **tol)


@pytest.mark.parametrize("shape", [(), (1, 1, 1)])
def test_weight_must_be_2d(impl, shape):
    idx = torch.zeros(2, 2, dtype=torch.long)
    weight = torch.ones(shape)
    with pytest.raises(RuntimeError, match="'weight' must be 2-D"):
        torch.nn.functional.embedding(idx, weight)
    with pytest.raises(RuntimeError, match="'weight' must be 2-D"):
        impl.functional(idx, weight)


# --------------------------------------------------------------------------- padding_idx


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("padding_idx,row", [(0, 0), (-2, 8)])
def test_padding_rows_look_up_as_zero(impl, dtype, sparse, padding_idx, row):
    ref, mod = twin(impl, 10, 20, padding_idx=padding_idx, sparse=sparse, dtype=dtype)
    assert mod.padding_idx == row
    same(mod.weight.detach()[row], torch.zeros(20, dtype=dtype))
    idx = torch.tensor([[row, 2, 4, 5], [4, 3, row, 9]])
    out = mod(idx)
    same(out[0, 0], torch.zeros(20, dtype=dtype))
    same(out[1, 2], torch.zeros(20, dtype=dtype))
    assert bool((out[0, 1:] != 0).any())
    same(out, ref(idx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_padding_row_set_by_hand_is_looked_up(impl, dtype):
    ref, mod = twin(impl, 10, 20, padding_idx=2, sparse=True, dtype=dtype)
    for m in (ref, mod):
        with torch.no_grad():
            m.weight[2] = torch.ones(20, dtype=dtype)
    out = mod(torch.tensor([0, 2]))
    same(out[1], torch.ones(20, dtype=dtype))
    same(out, ref(torch.tensor([0, 2])))


@pytest.mark.parametrize("padding_idx", [10, 25, -11, -25])
def test_padding_idx_out_of_range_is_an_assertion(impl, padding_idx):
    with pytest.raises(AssertionError, match="Padding_idx must be within num_embeddings"):
        torch.nn.Embedding(10, 20, padding_idx=padding_idx)
    with pytest.raises(AssertionError, match="Padding_idx must be within num_embeddings"):
        impl.make(num_embeddings=10, embedding_dim=20, padding_idx=padding_idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 1000])
def test_padding_row_gets_no_gradient(impl, dtype, n):
    ref, mod = twin(impl, 5, 2, padding_idx=0, dtype=dtype)
    for others in ([], [1, 3], [2]):
        idx = torch.tensor(others + [0] * n)
        want = counts(idx, 5)
        want[0] = 0
        grads = []
        for m in (ref, mod):
            m.zero_grad()
            m(idx).sum().backward()
            same(m.weight.grad.double(), want.expand(5, 2))
            grads.append(m.weight.grad.clone())
            m.zero_grad()
            # double backward: the gradient's sum, differentiated again, plus the lookups' sum
            total = m(idx).sum()
            (grad,) = torch.autograd.grad(total, [m.weight], create_graph=True)
            (grad.sum() + total).backward()
            same(m.weight.grad[0], torch.zeros(2, dtype=dtype))
            grads.append(m.weight.grad.clone())
            m.zero_grad()
        same(grads[2], grads[0])
        same(grads[3], grads[1])


# --------------------------------------------------------------------------- scale_grad_by_freq


def test_scale_grad_by_freq(impl):
    idx = torch.tensor([1, 1, 2, 4, 4, 4, 1])
    ref, mod = twin(impl, 6, 3, scale_grad_by_freq=True)
    g = torch.rand(7, 3)
    for m in (ref, mod):
        m(idx).backward(g)
    c = counts(idx, 6).float()
    want = torch.zeros(6, 3).index_add_(0, idx, g) / c.clamp(min=1)
    torch.testing.assert_close(mod.weight.grad, want)
    same(mod.weight.grad, ref.weight.grad)
    for m in twin(impl, 6, 3, scale_grad_by_freq=True, sparse=True):
        with pytest.raises(RuntimeError, match="scale_grad_by_freq not supported with sparse"):
            m(idx).sum().backward()


# --------------------------------------------------------------------------- indices


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int32_and_int64_indices_look_up_the_same_rows(impl, dtype):
    ref, mod = twin(impl, 10, 4, dtype=dtype)
    idx = torch.tensor([[9, 0, 3], [3, 3, 1]])
    want = ref.weight.detach()[idx]
    for index_dtype in (torch.int64, torch.int32):
        out = mod(idx.to(index_dtype))
        same(out, want)
        same(out, ref(idx.to(index_dtype)))


@pytest.mark.parametrize("index_dtype", [torch.float32, torch.int16, torch.uint8, torch.bool])
def test_other_index_dtypes_are_refused(impl, index_dtype):
    ref, mod = twin(impl, 10, 4)
    idx = torch.tensor([1, 0]).to(index_dtype)
    for m in (ref, mod):
        with pytest.raises(RuntimeError, match="'indices' to have one of the following scalar "
                                               "types: Long, Int"):
            m(idx)


@pytest.mark.parametrize("bad", [10, -1, 1 << 40])
def test_index_out_of_range(impl, bad):
    ref, mod = twin(impl, 10, 4)
    before = copy.deepcopy(mod.weight.detach())
    for m in (ref, mod):
        with pytest.raises(IndexError, match="index out of range in self"):
            m(torch.tensor([0, bad, 3]))
    same(mod.weight.detach(), before)
