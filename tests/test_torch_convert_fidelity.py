"""convert() against stock torch: placement keeps shared storage, ties stay tied under dtype= and
bits=, hooks stay removable, optimizers built before convert() keep working (or are warned about),
dtype conversions of the model after convert(), meta models with bits=, and bits-converted
tables answering every input as the float module they were made from (the same result, or the
same exception class with torch's message)."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import perfkernels
import perfkernels.torch as pt

# 10000 x 64 float32 = 2.5 MiB: "auto" placement moves tables of this size
ROWS, DIM = 10000, 64


def _answer(fn):
    """("ok", result) or (exception class, message) of fn()."""
    try:
        with torch.no_grad():
            return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return type(exc), str(exc)


# --------------------------------------------------------------------------- placement and sharing

def _lookup(model, row):
    with torch.no_grad():
        return model(torch.tensor([row]), torch.tensor([0]))[0]


def test_numpy_backed_table_stays_on_the_array():
    arr = np.ones((ROWS, DIM), np.float32)
    stock = nn.EmbeddingBag.from_pretrained(torch.from_numpy(arr), mode="sum")
    conv = pt.convert(stock)
    arr[1] = 0.0                       # the array's owner updates the table
    torch.testing.assert_close(_lookup(conv, 1), _lookup(stock, 1))
    assert float(_lookup(conv, 1)[0]) == 0.0
    (name, why), = pt.last_report().kept_in_place
    assert name == "weight" and "torch did not allocate" in why


def test_memmap_backed_table_stays_on_the_file(tmp_path):
    mm = np.memmap(tmp_path / "table.bin", np.float32, "w+", shape=(ROWS, DIM))
    mm[:] = 1.0
    stock = nn.EmbeddingBag.from_pretrained(torch.from_numpy(mm), mode="sum")
    conv = pt.convert(stock, inplace=True)
    mm[2] = 3.0
    torch.testing.assert_close(_lookup(conv, 2), torch.full((DIM,), 3.0))


def test_shared_memory_table_stays_shared():
    stock = nn.EmbeddingBag(ROWS, DIM, mode="sum")
    stock.share_memory()
    ptr = stock.weight.data_ptr()
    conv = pt.convert(stock, inplace=True)
    assert conv.weight.is_shared() and conv.weight.data_ptr() == ptr
    assert "shared memory" in pt.last_report().kept_in_place[0][1]


def test_table_with_an_alias_stays_with_it():
    stock = nn.EmbeddingBag(ROWS, DIM, mode="sum")
    alias = stock.weight.detach()          # another tensor on the same storage
    conv = pt.convert(stock, inplace=True)
    alias[4] = 7.0
    torch.testing.assert_close(_lookup(conv, 4), torch.full((DIM,), 7.0))
    assert "another tensor" in pt.last_report().kept_in_place[0][1]


def test_two_parameters_on_one_storage_stay_together():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.EmbeddingBag(ROWS, DIM, mode="sum")
            self.b = nn.EmbeddingBag(ROWS, DIM, mode="sum")
            self.b.weight = nn.Parameter(self.a.weight.data)   # the same storage

    conv = pt.convert(M())
    with torch.no_grad():
        conv.a.weight[5] = 2.0
    torch.testing.assert_close(_lookup(conv.b, 5), torch.full((DIM,), 2.0))
    assert {n for n, _ in pt.last_report().kept_in_place} == {"a.weight", "b.weight"}


def test_unshared_tables_are_still_placed():
    model = nn.Sequential(nn.EmbeddingBag(ROWS, DIM, mode="sum"))
    stock = copy.deepcopy(model)
    conv = pt.convert(model)               # inplace=False: the same Parameter object
    assert perfkernels.placement_of(conv[0].weight) is not None
    assert not pt.last_report().kept_in_place
    # the original model reads the moved storage too: both stay one table
    assert model[0].weight is conv[0].weight
    with torch.no_grad():
        model[0].weight[6] = 5.0
        stock[0].weight[6] = 5.0
    torch.testing.assert_close(_lookup(conv[0], 6), _lookup(stock[0], 6))


def test_constructor_keeps_a_numpy_table():
    arr = np.ones((ROWS, DIM), np.float32)
    ours = pt.EmbeddingBag.from_pretrained(torch.from_numpy(arr), mode="sum")
    stock = nn.EmbeddingBag.from_pretrained(torch.from_numpy(arr), mode="sum")
    arr[3] = 0.0
    torch.testing.assert_close(_lookup(ours, 3), _lookup(stock, 3))


# --------------------------------------------------------------------------- ties

class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.item = nn.Embedding(20, 8)
        self.hist = nn.EmbeddingBag(20, 8, mode="sum")
        self.hist.weight = self.item.weight

    def forward(self, x):
        return self.item(x).sum(1) + self.hist(x)


@pytest.mark.parametrize("options", [{"dtype": torch.float16}, {"dtype": torch.bfloat16},
                                     {"bits": 8}, {"bits": 4}, {}])
def test_embedding_and_bag_stay_tied(options):
    stock = _Tied()
    conv = pt.convert(stock, **options)
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    if "bits" in options:
        assert conv.item.packed_weight is conv.hist.packed_weight
        with torch.no_grad():
            stock.item.weight.copy_(conv.item.dequantize())   # stock on the quantized values
            torch.testing.assert_close(conv(x), stock(x))
        return
    assert conv.item.weight is conv.hist.weight
    assert len(list(conv.parameters())) == 1
    # the shared gradient accumulates from both modules, as on stock
    conv(x).sum().backward()
    stock(x).sum().backward()
    torch.testing.assert_close(conv.item.weight.grad, stock.item.weight.grad)
    torch.testing.assert_close(conv(x), stock(x))


@pytest.mark.parametrize("options", [{"dtype": torch.float16}, {"bits": 8}])
def test_table_tied_to_a_linear_stays_tied(options):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(10, 4, mode="sum")
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.bag.weight

    stock = M()
    conv = pt.convert(stock, **options)
    assert conv.bag.weight is conv.head.weight
    with torch.no_grad():
        conv.head.weight[1] += 1.0
    torch.testing.assert_close(_lookup(conv.bag, 1), conv.head.weight[1])
    assert "head.weight" in pt.last_report().swapped[0][3]


# --------------------------------------------------------------------------- hooks

@pytest.mark.parametrize("options", [{}, {"dtype": torch.float16}, {"bits": 8}])
@pytest.mark.parametrize("kind", ["bag", "embedding"])
def test_removed_hook_stays_removed(options, kind):
    table = nn.EmbeddingBag(10, 4, mode="sum") if kind == "bag" else nn.Embedding(10, 4)
    model = nn.Sequential(table)
    calls = []
    handle = model[0].register_forward_hook(lambda *a: calls.append(1))
    pre = model[0].register_forward_pre_hook(lambda *a: calls.append(2))
    pt.convert(model, inplace=True, **options)
    x = torch.tensor([[1, 2]])
    with torch.no_grad():
        model(x)
    assert calls == [2, 1]               # the hooks moved with the table
    handle.remove()
    pre.remove()
    with torch.no_grad():
        model(x)
    assert calls == [2, 1]


# --------------------------------------------------------------------------- optimizers

def test_optimizer_built_before_convert_inplace_keeps_updating():
    model = nn.Sequential(nn.EmbeddingBag(10, 4, mode="sum"))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    pt.convert(model, dtype=torch.float16, inplace=True)
    before = model[0].weight.detach().clone()
    model(torch.tensor([[1, 2]])).sum().backward()
    opt.step()
    assert model[0].weight.dtype is torch.float16
    assert not torch.equal(model[0].weight.detach(), before)
    # stock: the same step on the same float16 table
    ref = nn.EmbeddingBag.from_pretrained(before.float(), freeze=False, mode="sum")
    ref(torch.tensor([[1, 2]])).sum().backward()
    torch.testing.assert_close(model[0].weight.detach().float(),
                               (ref.weight - ref.weight.grad).detach().half().float())


def test_optimizer_built_before_convert_copy_is_warned_about():
    model = nn.Sequential(nn.EmbeddingBag(10, 4, mode="sum"))
    opt = torch.optim.Adam(model.parameters())
    with pytest.warns(UserWarning, match=r"optimizer built before convert\(\).*\bparameters\(\)"):
        conv = pt.convert(model, dtype=torch.float16)
    assert conv[0].weight is not model[0].weight
    del opt
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # nothing outside the model holds them: no warning
        pt.convert(nn.Sequential(nn.EmbeddingBag(10, 4, mode="sum")), dtype=torch.float16)


# --------------------------------------------------------------------------- the model's dtype

@pytest.mark.parametrize("options", [{"dtype": torch.float16}, {"bits": 8}, {"bits": 4}])
@pytest.mark.parametrize("kind", ["bag", "embedding"])
@pytest.mark.parametrize("cast", ["half", "bfloat16", "double", "to_float64", "float"])
def test_model_dtype_casts_after_convert(options, kind, cast):
    torch.manual_seed(0)
    if kind == "bag":
        stock = nn.Sequential(nn.EmbeddingBag(10, 4, mode="sum"), nn.Linear(4, 2))
    else:
        stock = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    conv = pt.convert(stock, **options)

    def apply(m):
        return m.to(torch.float64) if cast == "to_float64" else getattr(m, cast)()
    apply(stock)
    apply(conv)
    x = torch.tensor([[1, 2], [3, 4]])
    with torch.no_grad():
        want, got = stock(x), conv(x)
    assert got.dtype is want.dtype
    torch.testing.assert_close(got, want, atol=0.2, rtol=0.1)


# --------------------------------------------------------------------------- meta models

@pytest.mark.parametrize("bits", [8, 4])
def test_meta_model_converts_with_bits(bits):
    with torch.device("meta"):
        stock = nn.Sequential(nn.EmbeddingBag(100, 8, mode="sum"), nn.Embedding(100, 8))
    conv = pt.convert(stock, bits=bits)
    x = torch.tensor([[1, 2]], device="meta")
    assert conv[0](x).shape == stock[0](x).shape and conv[0](x).device.type == "meta"
    assert conv[1](x).shape == stock[1](x).shape
    conv.to_empty(device="cpu")
    assert conv[0].packed_weight.device.type == "cpu"


# --------------------------------------------------------------------------- bits=: what torch takes

def _reference(conv, stock):
    """The float bag torch would run on the converted table's dequantized rows."""
    ref = nn.EmbeddingBag.from_pretrained(conv.dequantize(), mode=stock.mode,
                                          include_last_offset=stock.include_last_offset)
    return ref


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("case", ["int16 indices", "int16 offsets", "int32 indices, int64 offsets",
                                  "int64 indices, int32 offsets", "last offset short"])
def test_bits_bag_takes_what_torch_takes(bits, mode, case):
    include_last = case == "last offset short"
    stock = nn.EmbeddingBag(10, 4, mode=mode, include_last_offset=include_last)
    conv = pt.convert(stock, bits=bits)
    x, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])
    if case == "int16 indices":
        x = x.to(torch.int16)
    elif case == "int16 offsets":
        off = off.to(torch.int16)
    elif case == "int32 indices, int64 offsets":
        x = x.int()
    elif case == "int64 indices, int32 offsets":
        off = off.int()
    want = _answer(lambda: _reference(conv, stock)(x, off))
    assert _answer(lambda: stock(x, off))[0] == "ok"
    got = _answer(lambda: conv(x, off))
    assert got[0] == "ok", got
    torch.testing.assert_close(got[1], want[1])


# --------------------------------------------------------------------------- bits=: what torch refuses

_BAD = {
    "per_sample_weights shape": (torch.tensor([1, 2, 3]), torch.tensor([0, 2]), torch.ones(2)),
    "2-D input with offsets": (torch.tensor([[1, 2]]), torch.tensor([0]), None),
    "1-D input without offsets": (torch.tensor([1, 2]), None, None),
    "2-D offsets": (torch.tensor([1, 2]), torch.tensor([[0]]), None),
    "0-D input": (torch.tensor(1), torch.tensor([0]), None),
    "3-D input": (torch.ones(1, 1, 1, dtype=torch.long), None, None),
    "2-D input without columns": (torch.empty(2, 0, dtype=torch.long), None, None),
    "per_sample_weights in mode mean": (torch.tensor([1, 2]), torch.tensor([0, 1]),
                                        torch.ones(2)),
    "float16 per_sample_weights": (torch.tensor([1, 2]), torch.tensor([0, 1]),
                                   torch.ones(2, dtype=torch.float16)),
    "float indices": (torch.tensor([1.0, 2.0]), torch.tensor([0, 1]), None),
}


@pytest.mark.parametrize("options", [{"bits": 8}, {"bits": 4}, {"dtype": torch.float16}])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("case", sorted(_BAD))
def test_converted_bag_refuses_as_torch(options, mode, case):
    x, off, psw = _BAD[case]
    stock = nn.EmbeddingBag(10, 4, mode=mode)
    conv = pt.convert(stock, **options)
    want = _answer(lambda: stock(x, off, psw))
    got = _answer(lambda: conv(x, off, psw))
    if want[0] == "ok":
        assert got[0] == "ok"
        return
    assert got[0] is want[0], (got, want)
    assert want[1][:60] in got[1], (got, want)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("indices", [[1, 2], torch.tensor([1.0]), torch.tensor([1], dtype=torch.int16)],
                         ids=["list", "float", "int16"])
def test_quantized_embedding_refuses_as_torch(bits, indices):
    stock = nn.Embedding(10, 4)
    conv = pt.convert(stock, bits=bits)
    want, got = _answer(lambda: stock(indices)), _answer(lambda: conv(indices))
    assert got[0] is want[0], (got, want)
    assert want[1][:60] in got[1], (got, want)


# --------------------------------------------------------------------------- collections

@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("values", [[1, 12, 3], [1, 2, 30]], ids=["feature 0", "feature 1"])
def test_collection_index_error_in_torchs_words(grad, values):
    torchrec = pytest.importorskip("torchrec")
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=10,
                                 feature_names=[f"f{i}"]) for i in range(2)]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1"], values=torch.tensor(values),
                                              lengths=torch.tensor([2, 1]))
    answers = []
    for make in (lambda: torchrec.EmbeddingBagCollection(tables=tables),
                 lambda: pt.EmbeddingBagCollection(tables)):
        with torch.set_grad_enabled(grad):
            try:
                make()(kjt)
                answers.append(("ok", ""))
            except Exception as exc:  # noqa: BLE001 - the class is what is compared
                answers.append((type(exc), str(exc)))
    want, got = answers
    assert issubclass(got[0], want[0]) and want[1] in got[1], (got, want)
