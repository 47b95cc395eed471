"""The embedding module's C fast path (perfkernels/torch/_tensor_bags.pyx): the plain cases it
takes give torch's answers, and everything else is left to the full path (the entry answers
None, and the module still gives torch's answer or raises torch's exception)."""
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import perfkernels as pk  # noqa: E402
import perfkernels.torch as pt  # noqa: E402
from perfkernels.torch import _tensor_bags  # noqa: E402

TORCH_EMBEDDING_BAG = F.embedding_bag   # torch's own, taken before any routing
ROWS, DIM = 50, 7
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}

pytestmark = pytest.mark.skipif(not _tensor_bags.has_tensor_views(),
                                reason="this torch has no DLPack C exchange API")


def _lookup(weight, ix, off, psw=None, mode="sum", ilo=False, pad=None, output_dtype=None,
            weighted_mean=False, sparse=False, torch_kernel_ok=True):
    return _tensor_bags.lookup(weight, ix, off, psw, mode, ilo, pad, output_dtype,
                               weighted_mean, sparse, torch_kernel_ok)


def _reference(weight, ix, off, psw=None, mode="sum", ilo=False, pad=None):
    """torch's function on the table in float32 (torch rounds partial sums of half tables to the
    table's dtype; ours accumulate in float32)."""
    return TORCH_EMBEDDING_BAG(ix, weight.detach().float(), off, mode=mode, per_sample_weights=psw,
                               include_last_offset=ilo, padding_idx=pad)


def _bags(gen, num_bags, max_len, rows=ROWS, dtype=torch.int64):
    lengths = torch.randint(0, max_len + 1, (num_bags,), generator=gen)
    ix = torch.randint(0, rows, (int(lengths.sum()),), generator=gen).to(dtype)
    off = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]]).to(dtype)
    return ix, off


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_plain_cases_are_taken_and_give_torchs_result(isa, table_dtype, index_dtype, mode):
    """1-D input with offsets (empty bags among them, include_last_offset), 2-D input, padding_idx
    positive and negative, per_sample_weights in mode sum, tiny calls and calls large enough for
    the thread pool (GIL released): the entry answers, with torch's result."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(ROWS, DIM, generator=gen).to(table_dtype)
    cases = []
    for num_bags, max_len in [(1, 1), (5, 3), (700, 12)]:      # the last: >= 4096 values
        ix, off = _bags(gen, num_bags, max_len, dtype=index_dtype)
        cases += [(ix, off, {}), (ix, off, dict(pad=3)), (ix, off, dict(pad=-ROWS))]
        cases.append((ix, torch.cat([off, torch.tensor([ix.numel()], dtype=index_dtype)]),
                      dict(ilo=True)))
        if mode == "sum":
            cases.append((ix, off, dict(psw=torch.rand(ix.shape, generator=gen))))
    two_d = torch.randint(0, ROWS, (600, 9), generator=gen).to(index_dtype)
    cases += [(two_d, None, {}), (two_d[:3], None, dict(pad=-1))]
    if mode == "sum":
        cases.append((two_d, None, dict(psw=torch.rand(two_d.shape, generator=gen))))
    for ix, off, kw in cases:
        with torch.no_grad():
            got = _lookup(weight, ix, off, mode=mode, output_dtype=torch.float32, **kw)
        assert got is not None, (ix.shape, kw)
        assert got.dtype is torch.float32
        torch.testing.assert_close(got, _reference(weight, ix, off, mode=mode, **kw),
                                   **TOL[table_dtype])


def test_the_module_and_the_functional_take_it_and_keep_torchs_dtypes():
    """The module's forward reads its options in C; without output_dtype a half table answers in
    its dtype (torch's behaviour), with it (convert(dtype=...)) in the model's float32."""
    gen = torch.Generator().manual_seed(4)
    ix, off = _bags(gen, 6, 4)
    for dtype in [torch.float32, torch.float16, torch.bfloat16]:
        m = pt.EmbeddingBag(ROWS, DIM, mode="mean", padding_idx=2, dtype=dtype)
        with torch.no_grad():
            direct = _tensor_bags.module_lookup(m, ix, off, None)
            assert direct is not None and direct.dtype is dtype
            want = TORCH_EMBEDDING_BAG(ix, m.weight, off, mode="mean", padding_idx=2)
            torch.testing.assert_close(m(ix, off), want, **TOL[dtype])
            torch.testing.assert_close(pt.embedding_bag(ix, m.weight, off, mode="mean",
                                                        padding_idx=2), want, **TOL[dtype])
    model = pt.convert(torch.nn.EmbeddingBag(ROWS, DIM, mode="sum"), dtype=torch.float16)
    psw = torch.rand(ix.shape, generator=gen)
    with torch.no_grad():
        got = _tensor_bags.module_lookup(model, ix, off, psw)
    assert got is not None and got.dtype is torch.float32
    torch.testing.assert_close(got, _reference(model.weight, ix, off, psw), **TOL[torch.float16])


def test_weighted_mean_opt_in():
    gen = torch.Generator().manual_seed(5)
    ix, off = _bags(gen, 8, 5)
    psw = torch.rand(ix.shape, generator=gen)
    m = pt.EmbeddingBag(ROWS, DIM, mode="mean", weighted_mean=True)
    with torch.no_grad():
        got = _tensor_bags.module_lookup(m, ix, off, psw)
        assert got is not None
        assert _lookup(m.weight, ix, off, psw, mode="mean") is None    # no opt-in: torch refuses
        w = m.weight.double()
        want = torch.zeros(8, DIM, dtype=torch.float64)
        ends = off.tolist()[1:] + [ix.numel()]
        for b, (start, end) in enumerate(zip(off.tolist(), ends)):
            if end > start:
                rows = w[ix[start:end]] * psw[start:end, None].double()
                want[b] = rows.sum(0) / (end - start)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def _neg(t):
    return torch._neg_view(t)


def _odd_layouts():
    """(name, weight, input, offsets, per_sample_weights, mode): inputs the entry leaves to the
    full path."""
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(ROWS, DIM, generator=gen)
    ix, off = torch.tensor([1, 4, 9, 2, 2, 30]), torch.tensor([0, 2, 2])
    wide = torch.arange(40, dtype=torch.int64)

    class Sub(torch.Tensor):
        pass

    return [
        ("non-contiguous input", w, wide[::2][:6], off, None, "sum"),
        ("non-contiguous offsets", w, ix, torch.tensor([0, 9, 2, 9, 2])[::2], None, "sum"),
        ("non-contiguous 2-D input", w, wide[:12].reshape(3, 4).t(), None, None, "sum"),
        ("transposed table", torch.randn(DIM, ROWS, generator=gen).t(), ix, off, None, "sum"),
        ("negative view of the input", w, _neg(ix), off, None, "sum"),    # values -ix
        ("negative view of the table", _neg(-w), ix, off, None, "sum"),
        ("negative view of the weights", w, ix, off, _neg(-torch.rand(6, generator=gen)), "sum"),
        ("non-contiguous weights", w, ix, off, torch.rand(12, generator=gen)[::2], "sum"),
        ("misaligned input", w, torch.frombuffer(bytearray(1) + ix.numpy().tobytes(), offset=1,
                                                 count=6, dtype=torch.int64), off, None, "sum"),
        ("float64 table", w.double(), ix, off, None, "sum"),
        ("int16 input", w, ix.short(), off.short(), None, "sum"),
        ("uint8 input", w, ix.to(torch.uint8), off, None, "sum"),
        ("float64 weights", w, ix, off, torch.rand(6, dtype=torch.float64), "sum"),
        ("float16 weights on a float32 table", w, ix, off, torch.rand(6).half(), "sum"),
        ("weights in mode mean", w, ix, off, torch.rand(6), "mean"),
        ("mode max", w, ix, off, None, "max"),
        ("a Tensor subclass as input", w, ix.as_subclass(Sub), off, None, "sum"),
        ("a list as input", w, [1, 2], off, None, "sum"),
        ("sparse input", w, ix.to_sparse(), off, None, "sum"),
        ("meta table", w.to("meta"), ix, off, None, "sum"),
        ("offsets not starting at 0", w, ix, torch.tensor([1, 2, 2]), None, "sum"),
        ("decreasing offsets", w, ix, torch.tensor([0, 3, 2]), None, "sum"),
        ("offsets past the input", w, ix, torch.tensor([0, 2, 7]), None, "sum"),
        ("index out of range", w, torch.tensor([1, ROWS]), torch.tensor([0]), None, "sum"),
        ("negative index", w, torch.tensor([1, -1]), torch.tensor([0]), None, "sum"),
        ("2-D input with offsets", w, ix.reshape(2, 3), torch.tensor([0]), None, "sum"),
        ("2-D input without columns", w, torch.zeros(3, 0, dtype=torch.int64), None, None, "sum"),
        ("3-D input", w, ix.reshape(1, 2, 3), None, None, "sum"),
        ("1-D input without offsets", w, ix, None, None, "sum"),
    ]


@pytest.fixture
def torch_on_two_threads():
    """torch refuses decreasing offsets in its multi-threaded kernel only (on one thread it
    returns uninitialised memory); the oracle is its checked answer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name,weight,ix,off,psw,mode", _odd_layouts(),
                         ids=[case[0] for case in _odd_layouts()])
def test_everything_else_is_left_to_the_full_path_which_answers_as_torch(
        torch_on_two_threads, name, weight, ix, off, psw, mode):
    """The entry answers None (nothing computed); the module and the functional then give
    torch's result, or raise torch's exception class."""
    module = pt.EmbeddingBag(weight.shape[0], weight.shape[1], mode=mode, device=weight.device)
    module.weight = torch.nn.Parameter(weight, requires_grad=False)
    calls = [lambda: pt.embedding_bag(ix, weight, off, mode=mode, per_sample_weights=psw),
             lambda: module(ix, off, psw)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")     # "using torch's implementation instead"
        assert _lookup(weight, ix, off, psw, mode=mode) is None
        assert _tensor_bags.module_lookup(module, ix, off, psw) is None
        try:
            want = TORCH_EMBEDDING_BAG(ix, weight, off, mode=mode, per_sample_weights=psw)
        except Exception as exc:        # torch refuses: ours refuses with the same class
            for call in calls:
                with pytest.raises(type(exc)):
                    call()
            return
        for call in calls:
            got = call()
            if want.device.type == "meta":
                assert got.device.type == "meta" and got.shape == want.shape
            else:
                torch.testing.assert_close(got, want)


def test_a_bad_index_raises_torchs_error_from_the_module():
    m = pt.EmbeddingBag(ROWS, DIM)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), pytest.raises(
                pt.IndexOutOfRangeError,
                match=rf"Index 2 of input takes value {ROWS} which is not in the valid range"):
            m(torch.tensor([1, 2, ROWS]), torch.tensor([0, 1]))


def test_read_only_and_column_slice_tables_are_read_in_place():
    """A table over read-only NumPy memory is only read; a column slice of a wider table (rows
    spaced wider than D) is read in place, as by the NumPy API."""
    gen = torch.Generator().manual_seed(8)
    ix, off = _bags(gen, 9, 4)
    frozen = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)
    frozen.flags.writeable = False
    with warnings.catch_warnings():      # torch warns "not writable" once per process
        warnings.simplefilter("ignore")
        table = torch.from_numpy(frozen)
    wide = torch.randn(ROWS, DIM + 5, generator=gen)[:, 2:2 + DIM]
    for t in (table, wide):
        with torch.no_grad():
            got = _lookup(t, ix, off)
        assert got is not None
        torch.testing.assert_close(got, _reference(t, ix, off))


def test_with_a_gradient_torchs_kernel_is_called_directly():
    """A lookup with a gradient that torch's kernel serves (float32, sparse or small) is
    torch.embedding_bag's: the same result, autograd node and gradient as torch's module."""
    gen = torch.Generator().manual_seed(9)
    ix, off = _bags(gen, 16, 6)
    for sparse, mode in [(True, "sum"), (False, "mean")]:
        ref = torch.nn.EmbeddingBag(ROWS, DIM, mode=mode, sparse=sparse, padding_idx=1)
        ours = pt.EmbeddingBag.from_torch(ref)
        ours.weight = torch.nn.Parameter(ref.weight.detach().clone())
        direct = _tensor_bags.module_lookup(ours, ix, off, None)
        assert direct is not None and type(direct.grad_fn).__name__ == "EmbeddingBagBackward0"
        upstream = torch.randn(16, DIM, generator=gen)
        ref(ix, off).backward(upstream)
        got = ours(ix, off)
        torch.testing.assert_close(got, ref(ix, off))
        got.backward(upstream)
        g_ours, g_ref = ours.weight.grad, ref.weight.grad
        assert g_ours.is_sparse == g_ref.is_sparse == sparse
        if sparse:
            g_ours, g_ref = g_ours.coalesce().to_dense(), g_ref.coalesce().to_dense()
        torch.testing.assert_close(g_ours, g_ref)
    # what torch's kernel does not serve is left to the full path
    m = pt.EmbeddingBag(ROWS, DIM, dtype=torch.bfloat16)
    assert _tensor_bags.module_lookup(m, ix, off, None) is None
    m = pt.EmbeddingBag(ROWS, DIM, fused_optimizer=("sgd", {"lr": 0.1}))
    assert _tensor_bags.module_lookup(m, ix, off, None) is None
    m = pt.EmbeddingBag(ROWS, DIM, sparse=True)
    assert _tensor_bags.module_lookup(m, ix, off, torch.rand(ix.shape)) is None
    assert _tensor_bags.module_lookup(m, ix.reshape(-1, 1), None, None) is None


def test_a_torch_function_mode_sees_the_functional_as_with_torchs_module():
    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    ix, off = torch.tensor([1, 2, 3]), torch.tensor([0, 1])
    for module in (torch.nn.EmbeddingBag(ROWS, DIM, sparse=True),
                   pt.EmbeddingBag(ROWS, DIM, sparse=True)):
        with Record() as mode:
            module(ix, off)
        assert TORCH_EMBEDDING_BAG in mode.seen, type(module)


def test_every_isa_level_serves_the_fast_path(isa):
    gen = torch.Generator().manual_seed(10)
    weight = torch.randn(ROWS, 33, generator=gen)
    ix, off = _bags(gen, 40, 7)
    with torch.no_grad():
        got = _lookup(weight, ix, off)
    torch.testing.assert_close(got, _reference(weight, ix, off))


def test_threads_share_a_module():
    """Lookups of one module from several threads (tiny ones on the calling thread, large ones
    with the GIL released on the pool) each give their own bags."""
    gen = torch.Generator().manual_seed(11)
    m = pt.EmbeddingBag(ROWS, DIM, mode="sum")
    calls = [_bags(gen, n, 8) for n in (1, 3, 900, 1200, 2, 700)]
    with torch.no_grad():
        want = [_reference(m.weight, ix, off) for ix, off in calls]
    errors = []

    def work(k):
        try:
            with torch.no_grad():
                for _ in range(30):
                    ix, off = calls[k]
                    torch.testing.assert_close(m(ix, off), want[k])
        except Exception as exc:        # pragma: no cover - reported below
            errors.append(exc)

    saved = pk.get_num_threads()
    pk.set_num_threads(2)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(calls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        pk.set_num_threads(saved)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads)
