"""The drop-in matrix: stock torch against convert() and optimize() over a generated table of
cases (module kind x mode x padding_idx x per_sample_weights x include_last_offset x max_norm x
sparse x table format x grad mode x index dtypes x input form).

Per case, the stock module and its converted (and, for a share of the cases, optimized) copy run
the same input: either both raise, the converted one an instance of the stock exception's class,
or both answer: the same outputs (bit for bit for float32 unpooled rows, within float rounding
for pooled float32 rows, against the stock module over the rounded table for float16 and 8-bit
tables), the same gradients (layout, values) and the same tables afterwards (max_norm
renormalises in place).  No case may answer differently without an error."""
import copy
import itertools
import random
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import perfkernels.torch as pkt  # noqa: E402

ROWS, DIM = 12, 5
#: optimize() captures the model (torch.export, a fraction of a second): every k-th case
OPTIMIZE_EVERY = 6

BAG_AXES = dict(mode=["sum", "mean", "max"], padding_idx=[None, 3], psw=[False, True],
                include_last_offset=[False, True], max_norm=[None, 1.0], sparse=[False, True],
                table=["float32", "float16", "bits8"], grad=[False, True],
                index=[(torch.int64, torch.int64), (torch.int32, torch.int32),
                       (torch.int32, torch.int64)],
                form=["1d", "2d"], bad=[None, "index", "form"])
EMB_AXES = dict(padding_idx=[None, 3], max_norm=[None, 1.0], sparse=[False, True],
                scale_grad_by_freq=[False, True], table=["float32", "float16", "bits8"],
                grad=[False, True], index=[torch.int64, torch.int32], form=["1d", "2d"],
                bad=[None, "index"])

#: cases that fail because of a known gap fixed elsewhere: (predicate, reason)
KNOWN: list = []


def _cases(kind, axes, count, seed):
    names = list(axes)
    every = [dict(zip(names, values), kind=kind) for values in itertools.product(*axes.values())]
    return random.Random(seed).sample(every, count)


def _id(case):
    parts = [case["kind"]]
    for k, v in case.items():
        if k == "kind" or (k == "bad" and v is None):
            continue
        if isinstance(v, tuple):
            v = "-".join(str(x).replace("torch.", "") for x in v)
        parts.append(f"{k}={str(v).replace('torch.', '')}")
    return ",".join(parts)


CASES = _cases("bag", BAG_AXES, 260, 0) + _cases("emb", EMB_AXES, 90, 1)


def _params():
    out = []
    for i, case in enumerate(CASES):
        marks = [pytest.mark.xfail(strict=True, reason=why)
                 for pred, why in KNOWN if pred(case)][:1]
        out.append(pytest.param(case, i % OPTIMIZE_EVERY == 0, id=_id(case), marks=marks))
    return out


def _stock(case):
    torch.manual_seed(7)
    if case["kind"] == "bag":
        return nn.EmbeddingBag(ROWS, DIM, mode=case["mode"], padding_idx=case["padding_idx"],
                               include_last_offset=case["include_last_offset"],
                               max_norm=case["max_norm"], sparse=case["sparse"],
                               dtype=torch.float32)
    return nn.Embedding(ROWS, DIM, padding_idx=case["padding_idx"], max_norm=case["max_norm"],
                        sparse=case["sparse"], scale_grad_by_freq=case["scale_grad_by_freq"],
                        dtype=torch.float32)


def _options(case):
    return {"float32": {}, "float16": {"dtype": torch.float16}, "bits8": {"bits": 8}}[
        case["table"]]


def _inputs(case):
    """(args, kwargs) of one call: indices with repeats and the padding row, an empty bag."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, ROWS, (8,), generator=gen)
    ids[1] = 3
    ids[4] = ids[5]
    if case["bad"] == "index":       # a row past the table
        ids[6] = ROWS
    if case["kind"] == "emb":
        index = case["index"]
        return ((ids.view(2, 4) if case["form"] == "2d" else ids).to(index),), {}
    index, offset = case["index"]
    kwargs = {}
    if case["form"] == "2d":
        args = (ids.view(2, 4).to(index),)
        n = 8
    else:
        offsets = [0, 3, 3, 6]
        if case["include_last_offset"]:
            offsets.append(8)
        args = (ids.to(index), torch.tensor(offsets, dtype=offset))
        n = 8
    if case["bad"] == "form":        # 2-D input with offsets, 1-D input without
        args = ((args[0], torch.tensor([0, 1], dtype=offset)) if case["form"] == "2d"
                else args[:1])
    if case["psw"]:
        kwargs["per_sample_weights"] = (torch.rand(n, generator=gen, dtype=torch.float32) + 0.5).view(
            (2, 4) if case["form"] == "2d" else (n,))
    return args, kwargs


def _reference(case, stock, converted):
    """The stock module over the table the converted one computes from, as float32 (rounded to
    float16, or the 8-bit rows dequantized: an inference table, no gradient).  convert() leaves
    the options its modules do not take (an 8-bit bag of mode max, ...) to torch."""
    reference = copy.deepcopy(stock)
    with torch.no_grad():
        if hasattr(converted, "dequantize"):
            reference.weight.copy_(converted.dequantize().float())
            reference.weight.requires_grad_(False)
        else:
            reference.weight.copy_(converted.weight.detach().float())
    return reference


def _run(model, case, args, kwargs):
    """(output, weight gradient, per-sample-weight gradient) or the exception raised."""
    kwargs = dict(kwargs)
    weight = getattr(model, "weight", None)
    if isinstance(weight, torch.Tensor):
        weight.grad = None
    if case["grad"] and "per_sample_weights" in kwargs:
        kwargs["per_sample_weights"] = kwargs["per_sample_weights"].clone().requires_grad_()
    try:
        with warnings.catch_warnings(), torch.set_grad_enabled(case["grad"]):
            warnings.simplefilter("ignore")
            out = model(*args, **kwargs)
            if not out.requires_grad:
                return out, None, None
            torch.manual_seed(0)
            (out * torch.randn(out.shape, dtype=out.dtype)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - compared with the stock one's
        return exc
    psw = kwargs.get("per_sample_weights")
    return (out, weight.grad if isinstance(weight, torch.Tensor) else None,
            None if psw is None else psw.grad)


def _close(got, want, exact, tol, what):
    assert got.dtype == want.dtype or not exact, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.is_sparse or want.is_sparse:
        assert got.is_sparse == want.is_sparse, f"{what}: layout {got.layout} != {want.layout}"
        got, want = got.to_dense(), want.to_dense()
    if exact:
        assert torch.equal(got, want), f"{what}: not bit for bit"
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol, msg=what)


def _compare(case, stock, candidate, name):
    args, kwargs = _inputs(case)
    want = _run(stock, case, args, kwargs)
    got = _run(candidate, case, args, kwargs)
    if isinstance(want, Exception):
        assert isinstance(got, Exception), (
            f"{name}: stock raised {type(want).__name__}: {want}; {name} answered")
        assert isinstance(got, type(want)), (
            f"{name}: stock raised {type(want).__name__}, {name} {type(got).__name__}: {got}")
        return
    if isinstance(got, Exception):
        raise AssertionError(f"{name}: stock answered, {name} raised "
                             f"{type(got).__name__}: {got}") from got
    float32 = case["table"] == "float32"
    exact = float32 and case["kind"] == "emb"
    tol = 1e-6 if float32 else 2e-3
    _close(got[0], want[0], exact, tol, f"{name} output")
    if case["grad"]:
        assert (got[1] is None) == (want[1] is None), f"{name}: weight gradient"
        if want[1] is not None:
            _close(got[1], want[1], exact and float32, tol, f"{name} weight gradient")
    # a quantized table gives per_sample_weights no gradient (torch.ao's neither)
    if want[2] is not None and not hasattr(candidate, "dequantize"):
        assert got[2] is not None, f"{name}: no per_sample_weights gradient"
        _close(got[2], want[2], False, tol, f"{name} per_sample_weights gradient")
    if case["max_norm"] is not None and case["table"] == "float32":
        _close(candidate.weight.detach(), stock.weight.detach(), False, 1e-6,
               f"{name} table after max_norm")


@pytest.mark.parametrize("case,optimized", _params())
def test_dropin(case, optimized):
    stock = _stock(case)
    converted = pkt.convert(copy.deepcopy(stock), **_options(case))
    _compare(case, _reference(case, stock, converted), converted, "convert()")
    if optimized:
        stock = _stock(case)
        opt = pkt.optimize(copy.deepcopy(stock), **_options(case))
        reference = _reference(case, stock, opt)
        for _ in range(2):      # the capture, then the captured graph
            _compare(case, reference, opt, "optimize()")


@pytest.mark.parametrize("case", CASES[::6], ids=_id)
def test_dropin_whatever_the_default_dtype(case):
    """The same comparisons with torch's global default dtype set to float64 (the tables stay
    float32): the torch layer never reads the default dtype."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        test_dropin(case, False)
    finally:
        torch.set_default_dtype(before)


def test_the_matrix_covers_every_value_of_every_axis():
    for kind, axes in (("bag", BAG_AXES), ("emb", EMB_AXES)):
        cases = [c for c in CASES if c["kind"] == kind]
        for axis, values in axes.items():
            assert {repr(c[axis]) for c in cases} == {repr(v) for v in values}, (kind, axis)
