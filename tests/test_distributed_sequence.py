"""perfkernels.torch.distributed.ShardedEmbeddingCollection (unpooled) in spawned gloo worlds.

Worlds of 2 and 3 processes on 127.0.0.1 (tests/test_distributed.py's launcher: this file run as
a script, one process per rank, under a timeout).  Every rank compares its own batch's rows with
the unsharded perfkernels.torch.EmbeddingCollection (the same JaggedTensors) and with a float64
NumPy gather of the full tables; after a few steps of fused row-wise Adagrad and Adam (and dense
gradients) the local rows and states equal those of the unsharded collection trained on the
global batch.  The 2-rank world saves a checkpoint that the 3-rank world loads on another plan.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from perfkernels.torch import (EmbeddingCollection, EmbeddingConfig,  # noqa: E402
                               KeyedJaggedTensor)
from perfkernels.torch import distributed as pkd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_distributed import (assert_close, assert_ok, copy_weights, finish,  # noqa: E402
                              global_batch, hand_plan, local_kjt, rank_slices, reference_weights,
                              start_world)

KINDS = [pkd.TABLE_WISE, pkd.ROW_WISE, pkd.TABLE_ROW_WISE, pkd.DATA_PARALLEL]


def make_tables() -> list:
    """One float32 table per sharding type (named ``<type>_<format>`` for ``hand_plan``), the
    table-wise one read by two features, row-wise float16 and bfloat16 tables and a table-wise
    float16 one."""
    tables = []
    for i, (kind, fmt) in enumerate([(k, torch.float32) for k in KINDS]
                                    + [(pkd.ROW_WISE, torch.float16),
                                       (pkd.ROW_WISE, torch.bfloat16),
                                       (pkd.TABLE_WISE, torch.float16)]):
        name = f"{kind}_{str(fmt).split('.')[-1]}"
        features = [name, name + "_b"] if i == 0 else [name]
        tables.append(EmbeddingConfig(num_embeddings=13 + 4 * i, embedding_dim=(5, 7, 1, 8)[i % 4],
                                      name=name, feature_names=features, data_type=fmt))
    return tables


def unsharded(tables, full: dict, fused=None, need_indices=False) -> EmbeddingCollection:
    ec = EmbeddingCollection(tables, fused_optimizer=fused, need_indices=need_indices)
    copy_weights(ec.embeddings, full)
    return ec


def numpy_rows(tables, full: dict, kjt) -> dict:
    """float64 rows of every feature's IDs: the table (rounded to its format) gathered."""
    by_feature = {f: t for t in tables for f in t.feature_names}
    out, pos = {}, 0
    lengths = kjt.lengths().view(len(kjt.keys()), -1).sum(1).tolist()
    for key, n in zip(kjt.keys(), lengths):
        t = by_feature[key]
        table = full[t.name].to(t.data_type).double().numpy()
        out[key] = table[kjt.values()[pos:pos + n].numpy()]
        pos += n
    return out


def check_same(got: dict, want: dict, reference: dict, what: str) -> None:
    """The sharded output equals the unsharded one (bits, lengths, offsets, keys, order) and
    the float64 reference."""
    assert list(got) == list(want), f"{what}: keys {list(got)} != {list(want)}"
    for key in want:
        g, w = got[key], want[key]
        assert g.values().dtype == w.values().dtype, f"{what} {key}: dtype"
        assert torch.equal(g.values(), w.values()), f"{what} {key}: values"
        assert torch.equal(g.lengths(), w.lengths()), f"{what} {key}: lengths"
        assert torch.equal(g.offsets(), w.offsets()), f"{what} {key}: offsets"
        np.testing.assert_array_equal(g.values().double().numpy(), reference[key],
                                      err_msg=f"{what} {key}: against the NumPy gather")


# ------------------------------------------------------------------------- the workers

def check_forward(world: int, rank: int) -> None:
    tables = make_tables()
    full = reference_weights(tables)
    ref = unsharded(tables, full)
    ec = pkd.ShardedEmbeddingCollection(tables, hand_plan(tables, world))   # seeded alike
    batch = 2 * world + 1
    keys, values, lengths, _ = global_batch(tables, batch, seed=5)
    lo, hi = rank_slices(batch, world)[rank]
    empty = tables[1].feature_names[0] if rank == world - 1 else None
    kjt = local_kjt(keys, values, lengths, None, lo, hi, empty=empty)
    with torch.no_grad():
        check_same(ec(kjt), ref(kjt), numpy_rows(tables, full, kjt), f"rank {rank}")
    # a subset of the features, in another order (the others get no rows)
    sub = [tables[4], tables[0]]
    keys, values, lengths, _ = global_batch(sub, batch, seed=6)
    kjt = local_kjt(keys, values, lengths, None, lo, hi)
    with torch.no_grad():
        check_same(ec(kjt), ref(kjt), numpy_rows(tables, full, kjt), f"rank {rank} subset")
    # the planner's own plan, from EmbeddingConfigs; need_indices: the IDs as weights
    plan = pkd.plan(tables, world, batch_size=batch, replicate_below=200)
    ref = unsharded(tables, full, need_indices=True)
    ec = pkd.ShardedEmbeddingCollection.from_collection(ref, plan)
    assert ec.need_indices()
    with torch.no_grad():
        got, want = ec(kjt), ref(kjt)
    check_same(got, want, numpy_rows(tables, full, kjt), f"rank {rank} planned")
    for key in want:
        assert torch.equal(got[key].weights_or_none(), want[key].weights_or_none()), key


def losses(out: dict, world_batch_values: dict, lo_pos: dict, scale: float):
    """sum over features of values * a fixed random target (the target of the global batch,
    sliced to this rank's IDs), times ``scale``."""
    total = 0
    for key, jt in out.items():
        target = world_batch_values[key]
        a = lo_pos[key]
        total = total + (jt.values().float() * target[a:a + jt.values().shape[0]]).sum()
    return total * scale


def check_training(world: int, rank: int, steps: int = 3) -> dict:
    """Dense gradients, then fused row-wise Adagrad and Adam: the local rows (and states) equal
    the unsharded collection's trained on the global batch."""
    tables = make_tables()
    full = reference_weights(tables)
    plan = hand_plan(tables, world)
    batch = 2 * world + 1
    lo, hi = rank_slices(batch, world)[rank]
    trained = {}
    for opt in (None, "rowwise_adagrad", "adam"):
        spec = None if opt is None else (opt, {"lr": 0.05, "eps": 1e-3})
        ref = unsharded(tables, full, fused=spec)
        ec = pkd.ShardedEmbeddingCollection.from_collection(
            ref, plan, fused_optimizer=spec, gradient_division=opt is not None)
        for step in range(steps if opt else 1):
            # step 1: the last table's features in no rank's input (no Adam step for it)
            keys, values, lengths, _ = global_batch(tables[:-1] if step == 1 else tables, batch,
                                                    seed=100 + step)
            whole = local_kjt(keys, values, lengths, None, 0, batch)
            mine = local_kjt(keys, values, lengths, None, lo, hi)
            gen = torch.Generator().manual_seed(step)
            dims = {f: t.embedding_dim for t in tables for f in t.feature_names}
            targets = {k: torch.randn(v.numel(), dims[k], generator=gen)
                       for k, v in zip(keys, values)}
            start = {k: int(n[:lo].sum()) for k, n in zip(keys, lengths)}
            losses(ref(whole), targets, dict.fromkeys(keys, 0), 1.0).backward()
            # with gradient division each rank's loss counts 1 / world
            losses(ec(mine), targets, start, world if opt else 1.0).backward()
        for t in tables:
            a, b = ec.plan.shardings[t.name].rows_of(rank)
            mine_t, ref_t = ec.embeddings[t.name], ref.embeddings[t.name]
            if opt == "adam":
                assert int(mine_t.step) == int(ref_t.step) == (
                    steps - (t is tables[-1])), f"{t.name}: step"
            if b == a:
                continue
            f32 = t.data_type is torch.float32
            bf16 = t.data_type is torch.bfloat16
            tol = (dict(rtol=1e-5, atol=1e-6) if f32 else
                   dict(rtol=1e-2, atol=1e-2 if bf16 else 2e-3))
            # 16-bit rows give 16-bit upstream gradients (the unsharded collection sums an ID's
            # 16-bit gradients; scaled by a world of 3 and back they round otherwise): the
            # states agree to that precision
            m1 = dict(rtol=1e-4, atol=1e-5) if f32 else dict(rtol=2e-3 + 8e-3 * bf16,
                                                              atol=1e-3 + 4e-3 * bf16)
            m2 = dict(rtol=1e-4, atol=1e-6) if f32 else dict(rtol=2e-3 + 8e-3 * bf16,
                                                              atol=2e-5 + 1e-4 * bf16)
            what = f"rank {rank} {opt}: {t.name}"
            if opt is None:
                assert_close(mine_t.weight.grad, ref_t.weight.grad[a:b], what + " grad", **tol)
                continue
            assert_close(mine_t.weight, ref_t.weight[a:b], what, **tol)
            assert_close(mine_t.momentum1, ref_t.momentum1[a:b], what + " state", **m1)
            if opt == "adam":
                assert_close(mine_t.momentum2, ref_t.momentum2[a:b], what + " momentum2", **m2)
        trained[opt] = (ec, ref)
    return trained


def check_refusals(world: int, rank: int) -> None:
    """A bad ID or feature on the last rank: torch's exception there, ValueError on the others,
    no hang, nothing written, the group still usable; a plan for other tables is refused."""
    tables = make_tables()
    full = reference_weights(tables)
    spec = ("rowwise_adagrad", {"lr": 0.5})
    ec = pkd.ShardedEmbeddingCollection(tables, hand_plan(tables, world), fused_optimizer=spec)
    keys, values, lengths, _ = global_batch(tables, 4, seed=1)
    good = local_kjt(keys, values, lengths, None, 0, 4)
    last = rank == world - 1
    bad_values = good.values().clone()
    bad_values[-1] = 1000
    for bad, exc, text in ((KeyedJaggedTensor(keys, bad_values, lengths=good.lengths()),
                            IndexError, "index out of range in self"),
                           (KeyedJaggedTensor(keys[:-1] + ["nope"], good.values(),
                                              lengths=good.lengths()),
                            KeyError, "'nope' is in no table")):
        with pytest.raises(exc if last else ValueError) as info:
            ec(bad if last else good).values()
        expected = text if last else f"rank {world - 1} refused its input"
        assert expected in str(info.value), str(info.value)
    for t in tables:     # nothing written
        a, b = ec.plan.shardings[t.name].rows_of(rank)
        assert torch.equal(ec.embeddings[t.name].weight, full[t.name][a:b].to(t.data_type))
    with torch.no_grad():   # still usable
        ec(good)
    with pytest.raises(ValueError, match="not one of the tables"):
        pkd.ShardedEmbeddingCollection(tables[:-1], hand_plan(tables, world))


def worker(scenario: str, rank: int, world: int, directory: Path) -> None:
    import datetime
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(
        seconds=float(os.environ.get("PK_TEST_PG_TIMEOUT", "60"))))
    try:
        check_forward(world, rank)
        check_refusals(world, rank)
        trained = check_training(world, rank)
        ec, ref = trained["adam"]
        if world == 2:
            # the unsharded collection's keys; sharded tables as ShardedTensors of its shape
            mine, theirs = ec.state_dict(), ref.state_dict()
            assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
            for key, value in mine.items():
                assert value.shape == theirs[key].shape, key
            pkd.save_checkpoint(ec, directory / "ckpt")
            exported = pkd.export_tables(ec)
            if rank == 0:
                torch.save(ref.state_dict(), directory / "reference.pt")
                assert set(exported["state_dict"]) == {f"embeddings.{n}.weight"
                                                       for n in ec.plan.shardings}
                for key, value in exported["state_dict"].items():
                    assert_close(value, theirs[key], f"exported {key}", rtol=1e-2, atol=2e-3)
        else:
            check_load(directory, world, rank)
    finally:
        dist.destroy_process_group()
    print(f"rank {rank} of {world}: OK", flush=True)
    sys.stderr.flush()
    os._exit(0)     # no interpreter teardown (gloo threads), as tests/test_distributed.py


def check_load(directory: Path, world: int, rank: int) -> None:
    """The 2-rank Adam checkpoint loaded on this world's planned (other) plan: every local row
    and state is the reference's, the step counts too."""
    tables = make_tables()
    reference = torch.load(directory / "reference.pt")
    plan = pkd.plan(tables, world, batch_size=4, replicate_below=0)
    ec = pkd.ShardedEmbeddingCollection(tables, plan, fused_optimizer=("adam", {"lr": 0.05}),
                                        seed=99)
    pkd.load_checkpoint(ec, directory / "ckpt")
    for t in tables:
        a, b = plan.shardings[t.name].rows_of(rank)
        key = f"embeddings.{t.name}"
        assert int(ec.embeddings[t.name].step) == int(reference[key + ".step"])
        for field in ("weight", "momentum1", "momentum2"):
            assert_close(getattr(ec.embeddings[t.name], field), reference[f"{key}.{field}"][a:b],
                         f"rank {rank}: {key}.{field} after loading", rtol=1e-2, atol=2e-3)


# ------------------------------------------------------------------------- the tests

def test_two_and_three_ranks_match_the_unsharded_collection(tmp_path):
    assert_ok(finish(start_world("main", 2, tmp_path, script=Path(__file__)), 120))
    assert_ok(finish(start_world("main", 3, tmp_path, script=Path(__file__)), 120))


def test_one_process_plan_and_refusals():
    """No process group (a world of one): the planner takes EmbeddingConfigs; the module's
    rows equal the unsharded collection's; plans that do not fit the tables are refused."""
    tables = make_tables()
    plan = pkd.plan(tables, 1, pooling_factors={t.name: 2 for t in tables})
    full = reference_weights(tables)
    ec = pkd.ShardedEmbeddingCollection(tables, plan)
    keys, values, lengths, _ = global_batch(tables, 5, seed=2)
    kjt = local_kjt(keys, values, lengths, None, 0, 5)
    with torch.no_grad():
        check_same(ec(kjt), unsharded(tables, full)(kjt), numpy_rows(tables, full, kjt),
                   "one process")
    with pytest.raises(ValueError, match="the plan is for 2 ranks"):
        pkd.ShardedEmbeddingCollection(tables, hand_plan(tables, 2))
    with pytest.raises(ValueError, match="has no sharding"):
        pkd.ShardedEmbeddingCollection(tables + [EmbeddingConfig(3, 2, name="x")], plan)
    with pytest.raises(ValueError, match="8-bit"):
        one = EmbeddingConfig(3, 2, name="q", data_type=8)
        pkd.ShardedEmbeddingCollection([one], pkd.plan([one], 1))
    with pytest.raises(IndexError, match="index out of range in self"):
        ec(KeyedJaggedTensor(keys, kjt.values() + 100, lengths=kjt.lengths()))


def test_torchrec_style_configs():
    """Configs shaped as ``torchrec.EmbeddingConfig`` (its ``DataType`` enum, its init bounds)
    are planned and sharded, in a world of one: float16 rows, the config's bounds, rows equal a
    NumPy gather."""
    import dataclasses
    import enum

    class DataType(enum.Enum):
        FP32 = "FP32"
        FP16 = "FP16"

    @dataclasses.dataclass
    class TorchRecConfig:
        num_embeddings: int
        embedding_dim: int
        name: str
        data_type: DataType = DataType.FP32
        feature_names: list = dataclasses.field(default_factory=list)
        weight_init_max: float = None
        weight_init_min: float = None

    configs = [TorchRecConfig(50, 3, "a", DataType.FP16, ["x", "y"], 0.5, -0.5),
               TorchRecConfig(9, 4, "b", feature_names=["z"])]
    plan = pkd.plan(configs, 1, replicate_below=0, sharding_types={"a": pkd.ROW_WISE})
    assert plan.shardings["a"].sharding_type == pkd.ROW_WISE
    ec = pkd.ShardedEmbeddingCollection(configs, plan)
    assert ec.embeddings["a"].weight.dtype is torch.float16
    w = ec.embeddings["a"].weight.detach().double()
    assert float(w.abs().max()) <= 0.5 and float(w.abs().max()) > 0.1     # the config's bounds
    expected = pkd.initial_rows(0, 0, (0, 50), 3, -0.5, 0.5).to(torch.float16)
    assert torch.equal(ec.embeddings["a"].weight, expected)
    kjt = KeyedJaggedTensor(["y", "z"], torch.tensor([49, 0, 7, 8, 3]),
                            lengths=torch.tensor([2, 1, 0, 2]))
    with torch.no_grad():
        out = ec(kjt)
    assert list(out) == ["y", "z"]
    np.testing.assert_array_equal(out["y"].values().double().numpy(),
                                  expected.double().numpy()[[49, 0, 7]])
    assert torch.equal(out["z"].lengths(), torch.tensor([0, 2]))


def test_torchrec_configs_are_planned():
    torchrec = pytest.importorskip("torchrec")
    configs = [torchrec.EmbeddingConfig(num_embeddings=100, embedding_dim=8, name="t",
                                        feature_names=["f"])]
    plan = pkd.plan(configs, 2, replicate_below=0, sharding_types={"t": pkd.ROW_WISE})
    assert plan.shardings["t"].row_offsets == (0, 50, 100)


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
