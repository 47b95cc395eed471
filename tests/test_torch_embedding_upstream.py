"""PyTorch's own nn.Embedding tests, run against perfkernels.torch.Embedding and
perfkernels.torch.embedding in place of torch.nn.Embedding and torch.nn.functional.embedding.

Ported from pytorch/pytorch test/nn/test_embedding.py (the tests of TestEmbeddingNN and
TestEmbeddingNNDeviceType that are not about EmbeddingBag, on the CPU; BSD-3-Clause, Copyright
(c) Facebook, Inc. and its affiliates and the PyTorch contributors).  The file is not in the torch
wheel, so its non-bag tests are copied here with three changes: ``nn.Embedding`` is ours,
``F.embedding`` is ours, and unittest assertions are pytest's (``assertEqual`` is
``torch.testing.assert_close`` with torch's default tolerances, exact for integer and equal
values).  CUDA-only tests are left out (this is a CPU layer).  Each test is also run with torch's
own classes (the ``impl`` parameter), so a test that fails only on ours shows a difference."""
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.autograd import gradcheck, gradgradcheck  # noqa: E402

import perfkernels.torch as pkt  # noqa: E402


class _Impl:
    def __init__(self, embedding, functional):
        self.Embedding, self.embedding = embedding, functional


IMPLS = {"perfkernels": _Impl(pkt.Embedding, pkt.embedding),
         "torch": _Impl(torch.nn.Embedding, torch.nn.functional.embedding)}


@pytest.fixture(params=list(IMPLS))
def nn(request):
    """The module namespace of the test: ``nn.Embedding`` and ``nn.embedding`` (functional)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # our one-time fallback warnings
        yield IMPLS[request.param]


def assert_equal(a, b):
    torch.testing.assert_close(a, b, check_dtype=False) if isinstance(b, torch.Tensor) else \
        torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype))


def test_embedding_sparse_basic(nn):
    embedding = nn.Embedding(10, 20, sparse=True)
    input = torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]], dtype=torch.long)
    embedding(input).sum().backward()
    assert embedding.weight.grad.is_sparse
    assert embedding.weight.grad.shape == embedding.weight.shape


def test_embedding_sparse_empty_tensor(nn):
    embedding = nn.Embedding(0, 0, sparse=True)
    input = torch.tensor([], dtype=torch.int64)
    embedding(input).sum().backward()
    assert embedding.weight.grad.is_sparse
    assert embedding.weight.grad.shape == embedding.weight.shape

    embedding = nn.Embedding(10, 0, sparse=True)
    input = torch.LongTensor([[0, 2, 4, 5], [4, 3, 0, 9]])
    embedding(input).sum().backward()
    assert embedding.weight.grad.is_sparse
    assert embedding.weight.grad.shape == embedding.weight.shape


def test_move_sparse_half_embedding(nn):
    embedding = nn.Embedding(10, 3, sparse=True)
    assert embedding.weight.device.type == "cpu"
    assert embedding.weight.dtype == torch.get_default_dtype()
    embedding.to(torch.float16)
    assert embedding.weight.dtype == torch.float16
    assert embedding.embedding_dim == 3
    assert embedding.num_embeddings == 10
    # (ours, beyond the original: the moved module still looks up)
    assert embedding(torch.tensor([1, 2])).dtype == torch.float16


def test_embedding_max_norm(nn):
    embedding = nn.Embedding(22, 5, max_norm=1.0)
    input = torch.tensor([2, 8, 8, 6], dtype=torch.long)
    output = embedding(input)
    assert_equal(output[1], output[2])
    assert output.data.norm(p=2, dim=1).le(1).all()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.float, torch.double])
def test_embedding_from_pretrained(nn, dtype):
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=dtype)
    embedding = nn.Embedding.from_pretrained(a)
    assert_equal(a, embedding.weight.data)
    input = torch.LongTensor([0, 1])
    output = embedding(input)
    assert_equal(a, output)


def test_embedding_from_pretrained_padding_idx(nn):
    padding_idx = 2
    padding_vec = torch.ones(3) * 7
    embeddings = torch.rand(4, 3, requires_grad=True)
    with torch.no_grad():
        embeddings[padding_idx] = padding_vec
    embedding_nn = nn.Embedding.from_pretrained(embeddings, padding_idx=padding_idx)
    assert_equal(embedding_nn.weight[padding_idx], padding_vec)


def test_embedding_from_pretrained_options(nn):
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.double)
    try:
        a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        opts = {"max_norm": 2.0, "norm_type": 0.5, "scale_grad_by_freq": False, "sparse": True}
        embedding = nn.Embedding.from_pretrained(a, **opts)
        input = torch.LongTensor([0, 1])
        output = embedding(input)
        # test output and that weight matrix was renormalized
        assert_equal(a, output)
        assert a.ne(torch.arange(1, 7, dtype=a.dtype).view(2, 3)).all()
        assert output.data.norm(p=opts["norm_type"], dim=1).le(opts["max_norm"]).all()
    finally:
        torch.set_default_dtype(default)


def test_embedding_functional(nn):
    a = torch.tensor([[1, 3, 2], [0, 2, 1]], dtype=torch.long)
    embeddings = torch.rand(4, 3, requires_grad=True)

    embed_old = nn.Embedding(4, 3)
    embed_old.weight.data = embeddings.data
    assert_equal(embed_old.weight.data, embeddings.data)
    res_old = embed_old(a)

    res_F = nn.embedding(a, embeddings)
    assert_equal(res_old, res_F)

    embed_old = nn.Embedding(4, 3)
    embed_old = embed_old.from_pretrained(embeddings, padding_idx=2)
    res_old = embed_old(a)
    res_F = nn.embedding(a, embeddings, padding_idx=2)
    assert_equal(res_old, res_F)


@pytest.mark.parametrize("dtype", [torch.double, torch.float])
def test_embedding_dense_grad(nn, dtype):
    # the original runs in double (torch's function then runs: our kernels take float32 / 16-bit
    # tables); float32 too, on our kernel, with gradcheck's float32 tolerances
    embd = nn.Embedding(20, 20).to(dtype)
    weight = embd.weight

    def fn(weight):
        inp = torch.tensor([[0, 1, 1, 2], [3, 5, 7, 11]], dtype=torch.long)
        return nn.embedding(inp, weight)

    kw = {} if dtype == torch.double else {"eps": 1e-2, "atol": 1e-2, "rtol": 1e-2}
    assert gradcheck(fn, (weight,), **kw)
    assert gradgradcheck(fn, (weight,), **kw)


def test_embedding_scalar_weight_error(nn):
    indices = torch.rand(2, 2).long()
    weights = [torch.tensor(1.0), torch.tensor(1.0).reshape(1, 1, 1)]
    for weight in weights:
        with pytest.raises(RuntimeError, match="'weight' must be 2-D"):
            nn.embedding(indices, weight)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_embedding_backward(nn, dtype):
    # original: float64 on the CPU; float32 added (our kernel's; torch's CPU cannot sum two
    # sparse float16 / bfloat16 gradients, "add_out_sparse_cpu" is not implemented for them)
    embedding = nn.Embedding(10, 3, sparse=True)
    tensor = torch.tensor([[7, 1, 3]])
    ones = torch.tensor(1.0, dtype=dtype).expand(3, 3)
    tensorTwice = tensor.repeat(1, 2)
    onesTwice = torch.cat((ones, ones))

    embedding = embedding.to(dtype=dtype)

    embedding.zero_grad()
    embedding(tensor[0]).sum().backward()
    assert_equal(embedding.weight.grad._indices(), tensor)
    assert_equal(embedding.weight.grad._values(), ones)

    embedding.zero_grad()
    embedding(tensor[0]).sum().backward()
    embedding(tensor[0]).sum().backward()
    assert_equal(embedding.weight.grad._indices(), tensorTwice)
    assert_equal(embedding.weight.grad._values(), onesTwice)

    embedding.zero_grad()
    embedding(tensor[0]).sum().backward()
    tensor[0, 0] = 8
    embedding(tensor[0]).sum().backward()
    tensorTwice[0, 3] = 8
    assert_equal(embedding.weight.grad._indices(), tensorTwice)
    assert_equal(embedding.weight.grad._values(), onesTwice)


def test_embedding_max_norm_backward(nn):
    dtype = torch.float32
    weight = torch.randn((4, 4), dtype=dtype) * 2
    weight.requires_grad_()
    inp_list = [0, 1, 2, 2]
    inp = torch.tensor(inp_list)
    out = nn.embedding(inp, weight, max_norm=1.0).sum()
    out.backward()
    expected_grad = torch.tensor([[1.0, 1.0, 2.0, 0.0]], dtype=dtype).transpose(0, 1).expand(4, 4)
    assert_equal(weight.grad, expected_grad)


def test_embedding_max_norm_fwd_AD(nn):
    dtype = torch.float32
    weight = torch.randn((4, 4), dtype=dtype) * 2
    tangent = torch.ones((4, 4), dtype=dtype)
    inp = torch.tensor([[0, 1], [2, 2]])
    with torch.autograd.forward_ad.dual_level():
        dual_weight = torch.autograd.forward_ad.make_dual(weight, tangent)
        out = nn.embedding(inp, dual_weight, max_norm=1.0)
        jvp = torch.autograd.forward_ad.unpack_dual(out).tangent
    expected_grad = torch.ones((2, 2, 4), dtype=dtype)
    assert_equal(jvp, expected_grad)


def test_embedding_fwd_AD_without_max_norm(nn):
    # ours, beside the original above: forward-mode AD through a plain lookup
    weight = torch.randn((4, 4))
    tangent = torch.arange(16.0).view(4, 4)
    inp = torch.tensor([[0, 1], [2, 2]])
    with torch.autograd.forward_ad.dual_level():
        out = nn.embedding(inp, torch.autograd.forward_ad.make_dual(weight, tangent))
        jvp = torch.autograd.forward_ad.unpack_dual(out).tangent
    assert_equal(jvp, tangent[inp])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_embedding_padding_idx(nn, dtype):
    # original: float32 on the CPU; our kernels' 16-bit dtypes added
    embedding = nn.Embedding(10, 20, padding_idx=0).to(dtype=dtype)
    input = torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]], dtype=torch.long)
    output = embedding(input)
    assert_equal(output[0][0].sum(), 0)
    assert_equal(output[1][2].sum(), 0)

    embedding = nn.Embedding(10, 20, padding_idx=0, sparse=True).to(dtype=dtype)
    input = torch.tensor([[0, 2, 4, 5], [4, 3, 0, 9]], dtype=torch.long)
    output = embedding(input)
    assert_equal(output[0][0].sum(), 0)
    assert_equal(output[1][2].sum(), 0)

    # negative indexing check for padding_idx
    # padding_idx=-2, num_embeddings=10 ==> index 8 padded
    embedding = nn.Embedding(10, 20, padding_idx=-2).to(dtype=dtype)
    input = torch.tensor([[0, 2, 8, 5], [4, 8, 0, 9]], dtype=torch.long)
    output = embedding(input)
    assert_equal(output[0][2].sum(), 0)
    assert_equal(output[1][1].sum(), 0)

    embedding = nn.Embedding(10, 20, padding_idx=-2, sparse=True).to(dtype=dtype)
    input = torch.tensor([[0, 2, 8, 5], [4, 8, 0, 9]], dtype=torch.long)
    output = embedding(input)
    assert_equal(output[0][2].sum(), 0)
    assert_equal(output[1][1].sum(), 0)

    # change padding vector
    padding_vector = torch.ones(20, dtype=dtype)
    embedding = nn.Embedding(10, 20, padding_idx=2, sparse=True).to(dtype=dtype)
    with torch.no_grad():
        embedding.weight[2] = padding_vector
    input = torch.tensor([0, 2], dtype=torch.long)
    output = embedding(input)
    assert_equal(output[1], padding_vector)

    # out of bounds check for padding_idx
    with pytest.raises(AssertionError):
        nn.Embedding(num_embeddings=10, embedding_dim=20, padding_idx=25)
    with pytest.raises(AssertionError):
        nn.Embedding(num_embeddings=10, embedding_dim=20, padding_idx=-25)

    padding_idx = 0
    embedding = nn.Embedding(5, 2, padding_idx=padding_idx).to(dtype=dtype)
    for n in (1, 2, 1000):  # Need large N to trigger all the methods we have implemented
        for other_indices in ([], [1, 3], [2]):
            indices = torch.tensor(other_indices + [padding_idx] * n, dtype=torch.long)
            pre = embedding.weight[padding_idx].clone()
            embedding(indices).sum().backward()
            after = (embedding.weight + embedding.weight.grad)[padding_idx]
            embedding.zero_grad()
            assert_equal(after, pre)

            # test double backward
            emb_sum = embedding(indices).sum()
            emb_grad = torch.autograd.grad(outputs=emb_sum, inputs=list(embedding.parameters()),
                                           retain_graph=True)
            scalar = emb_grad[0].sum() + emb_sum
            scalar.backward()
            after = (embedding.weight + embedding.weight.grad)[padding_idx]
            embedding.zero_grad()
            assert_equal(after, pre)
