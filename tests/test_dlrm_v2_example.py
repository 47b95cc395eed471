"""examples/dlrm_v2.py at a tiny --scale: the tables' formats, the lookups into the cross
network's input against torch's own bag ops, and (slow) TorchRec's DLRM_DCN with the same
weights."""
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dlrm_v2.py"


def _example():
    spec = importlib.util.spec_from_file_location("dlrm_v2_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # torch.compile imports the module of the classes it traces
    spec.loader.exec_module(mod)
    return mod


def test_table_formats():
    ex = _example()
    from perfkernels.datasets import DLRM_V2_ROWS
    mixed = ex.table_formats("4:big,8:small", DLRM_V2_ROWS)
    assert [i for i, f in enumerate(mixed) if f == 4] == [0, 9, 10, 19, 20, 21]
    assert set(mixed) == {4, 8}
    assert ex.table_formats("float16", DLRM_V2_ROWS) == ["float16"] * 26
    with pytest.raises(ValueError, match="big and small"):
        ex.table_formats("4:huge,8:small", DLRM_V2_ROWS)


@pytest.mark.parametrize("bits", ["4:big,8:small", "float16"])
def test_lookups_into_the_cross_input_match_torch(tmp_path, bits):
    ex = _example()
    from perfkernels import datasets
    import torch.nn.functional as F
    rows = datasets.dlrm_v2_rows(20_000)
    fmts = ex.table_formats(bits, datasets.DLRM_V2_ROWS)
    gen = datasets.CriteoLike(rows, seed=1)
    tabs = ex.build_or_map_tables(rows, fmts, 0, None, progress=False)      # in memory
    mapped = ex.build_or_map_collection(rows, fmts, 0, str(tmp_path), gen.keys)   # files
    in_memory = ex.build_or_map_collection(rows, fmts, 0, None, gen.keys, progress=False)
    for ebc in (mapped, in_memory):
        model = ex.DLRMv2(ebc).eval()
        assert model.keys == gen.keys
        assert all(np.array_equal(a, b) for a, b in zip(tabs, model.tables))
    model = ex.DLRMv2(mapped).eval()
    assert model.bits == [f if isinstance(f, int) else None for f in fmts]
    b = gen.batch(7)
    dense, values, lengths = (torch.from_numpy(a) for a in (b.dense, b.values, b.lengths))
    with torch.no_grad():
        x = model.interaction_input(dense, values, lengths)
        torch.testing.assert_close(x[:, :128], model.bottom(dense))
        for f, (t, fmt) in enumerate(zip(tabs, fmts)):
            v, offs = (torch.from_numpy(a) for a in b.feature(b.keys[f]))
            if fmt == 4:
                want = torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
                    torch.from_numpy(t.copy()), v, offs[:-1])
            elif fmt == 8:
                want = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
                    torch.from_numpy(t.copy()), v, offs[:-1])
            else:
                w = torch.from_numpy(np.asarray(t).astype(np.float32))
                want = F.embedding_bag(v, w, offs[:-1], mode="sum")
            torch.testing.assert_close(x[:, 128 * (f + 1):128 * (f + 2)], want,
                                       rtol=1e-5, atol=1e-5)
        logits = model.run_sample(dense, values, lengths)
        # the model as a user calls it: forward(dense, KeyedJaggedTensor)
        torch.testing.assert_close(model(dense, b.to_kjt(torchrec=False)), logits)
    assert logits.shape == (7, 1) and torch.isfinite(logits).all()


def test_optimize_fuses_the_lookups_into_the_cross_input(tmp_path):
    """optimize() on the example's model: the collection's lookups and the concatenation become
    one op, and the logits stay those of the eager model."""
    ex = _example()
    import perfkernels.torch as pkt
    from perfkernels import datasets
    rows = datasets.dlrm_v2_rows(20_000)
    fmts = ex.table_formats("4:big,8:small", datasets.DLRM_V2_ROWS)
    gen = datasets.CriteoLike(rows, seed=2)
    model = ex.DLRMv2(ex.build_or_map_collection(rows, fmts, 0, str(tmp_path), gen.keys)).eval()
    fast = pkt.optimize(model)
    for batch in (9, 1):
        b = gen.batch(batch, index=batch)
        dense, kjt = torch.from_numpy(b.dense), b.to_kjt(torchrec=False)
        with torch.no_grad():
            torch.testing.assert_close(fast(dense, kjt), model(dense, kjt),
                                       rtol=1e-5, atol=1e-5)
    report = str(pkt.last_optimize_report())           # of the captures the calls made
    assert "DCN concatenation" in report, report
    # an ID past its table: refused as the eager model refuses it, by both
    b = gen.batch(4, index=4)
    b.values[5] = rows[0] + 3
    dense, kjt = torch.from_numpy(b.dense), b.to_kjt(torchrec=False)
    for m in (model, fast):
        with torch.no_grad(), pytest.raises(IndexError, match=str(rows[0] + 3)):
            m(dense, kjt)


@pytest.mark.slow            # TorchRec's import and its model take tens of seconds
def test_predictions_agree_with_torchrec_dlrm_dcn():
    pytest.importorskip("torchrec")
    ex = _example()
    r = ex.run(ex.parse_args(["--scale", "20000", "--samples", "2", "--check-torchrec",
                              "--bits", "4:big,8:small"]))
    assert r["runs"][0]["pairs"] >= 200 and r["torchrec_rel_diff"] < 1e-4, r


def test_set_dense_refuses_unknown_kinds():
    ex = _example()
    from perfkernels import datasets
    rows = datasets.dlrm_v2_rows(20_000)
    fmts = ex.table_formats("8", datasets.DLRM_V2_ROWS)
    keys = datasets.CriteoLike(rows).keys
    model = ex.DLRMv2(ex.build_or_map_collection(rows, fmts, 0, None, keys, progress=False)).eval()
    with pytest.raises(ValueError, match="eager, compiled or int8"):
        model.set_dense("fp8")
    with pytest.raises(ValueError, match="calibration"):
        model.set_dense("int8")


@pytest.mark.slow            # Inductor compiles the float32 and int8 dense parts: minutes
def test_compiled_and_int8_dense_parts_agree_with_eager():
    try:
        import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401
    except Exception as exc:
        if os.environ.get("PERFKERNELS_REQUIRE_TORCHAO") == "1":
            raise
        pytest.skip(f"torchao is not usable here (optional): {exc}")
    ex = _example()
    r = ex.run(ex.parse_args(["--scale", "20000", "--samples", "2", "--threads", "1",
                              "--dense", "eager,compiled,int8", "--calibration", "2"]))
    eager, compiled, int8 = r["runs"]
    assert [x["dense"] for x in r["runs"]] == ["eager", "compiled", "int8"]
    assert compiled["logit_diff_vs_eager"] < 1e-5, compiled
    assert 0 < int8["logit_diff_vs_eager"] < 0.05, int8
    assert all(x["pairs"] == eager["pairs"] > 0 for x in r["runs"])


def test_torch_bags_route_gives_the_same_model(tmp_path):
    """--torch-bags: the same model with torch's own bag op per table; its logits equal ours but
    for float32 summation order, and the run reports both and their ratio."""
    ex = _example()
    r = ex.run(ex.parse_args(["--scale", "20000", "--samples", "3", "--threads", "1",
                              "--torch-bags", "--tables-dir", str(tmp_path)]))
    ours, theirs = r["runs"]
    assert (ours["lookups"], theirs["lookups"]) == ("ours", "torch")
    assert ours["pairs"] == theirs["pairs"] > 0
    assert theirs["logit_diff_vs_eager"] < 1e-5, theirs
    assert ours["vs_torch_bags"] > 0 and ours["lookup_vs_torch_bags"] > 0
    # the route itself, against torch's ops called here on a copy of each table
    from perfkernels import datasets
    rows = datasets.dlrm_v2_rows(20_000)
    fmts = ex.table_formats("4:big,8:small", datasets.DLRM_V2_ROWS)
    gen = datasets.CriteoLike(rows, seed=3)
    model = ex.DLRMv2(ex.build_or_map_collection(rows, fmts, 0, str(tmp_path), gen.keys)).eval()
    b = gen.batch(5)
    dense, values, lengths = (torch.from_numpy(a) for a in (b.dense, b.values, b.lengths))
    with torch.no_grad():
        mine = model.interaction_input(dense, values, lengths)
        model.lookups = "torch"
        via_torch = model.interaction_input(dense, values, lengths)
    torch.testing.assert_close(via_torch, mine, rtol=1e-5, atol=1e-5)
