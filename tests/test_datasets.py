"""perfkernels.datasets: the Criteo-1TB-like generator (multi-hot, power-law IDs, MLPerf-style
samples), checked against the documented distributions."""
import math

import numpy as np
import pytest

from perfkernels import datasets as D


def test_mlperf_shape_facts():
    assert len(D.DLRM_V2_ROWS) == len(D.DLRM_V2_BAG_SIZES) == 26
    assert sum(D.DLRM_V2_ROWS) == 204_184_588 and sum(D.DLRM_V2_BAG_SIZES) == 214
    assert D.dlrm_v2_rows(1) == list(D.DLRM_V2_ROWS)
    small = D.dlrm_v2_rows(1000)
    assert small[0] == 40_000 and small[5] == 1 and all(r >= 1 for r in small)
    with pytest.raises(ValueError, match="scale"):
        D.dlrm_v2_rows(0.5)


def _head_mass(n, a, k):
    """P(rank < k) of the documented bounded power law, in float64 from its density."""
    if a == 1:
        return math.log(k + 1) / math.log(n + 1)
    return ((k + 1) ** (1 - a) - 1) / ((n + 1) ** (1 - a) - 1)


@pytest.mark.parametrize("a", [0.8, 1.0, 1.05, 1.3])
def test_zipf_head_is_heavy_as_the_power_law_says(a):
    n = 1_000_000
    z = D.ZipfIds(n, a, multiplier=7919, shift=3)
    ranks = z.ranks(np.random.default_rng(0).random(400_000))
    assert ranks.min() >= 0 and ranks.max() < n
    for k in (1, 10, 1000, 100_000):
        want = _head_mass(n, a, k)
        got = float((ranks < k).mean())
        assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / ranks.size) + 1e-4, (k, got)
    # the same frequencies per ID as per rank: the bijection only moves the rows
    ids = z.ids(ranks)
    counts = np.bincount(ids, minlength=n)
    assert sorted(counts)[-1] == np.bincount(ranks).max()
    hottest = z.ids(np.arange(100))
    assert len(set(hottest.tolist())) == 100 and np.ptp(hottest) > n // 4   # scattered


def test_zipf_bijection_and_errors():
    for n in (1, 2, 12, 97, 1000):
        z = D.ZipfIds(n, 1.1, multiplier=n * 3 // 2, shift=5)
        assert sorted(z.ids(np.arange(n)).tolist()) == list(range(n))
    for bad in (dict(rows=0, exponent=1.0), dict(rows=2 ** 31, exponent=1.0),
                dict(rows=10, exponent=0)):
        with pytest.raises(ValueError):
            D.ZipfIds(**bad)


def test_batch_layout_and_ranges():
    rows = D.dlrm_v2_rows(500)
    gen = D.CriteoLike(rows, seed=3)
    b = gen.batch(64, index=5)
    F, B = 26, 64
    assert b.dense.shape == (B, 13) and b.dense.dtype == np.float32 and (b.dense >= 0).all()
    assert b.labels.shape == (B,) and set(np.unique(b.labels)) <= {0.0, 1.0}
    assert b.lengths.shape == (F * B,) and b.lengths.sum() == b.values.size == 214 * B
    np.testing.assert_array_equal(b.lengths.reshape(F, B),
                                  np.repeat(np.array(D.DLRM_V2_BAG_SIZES)[:, None], B, 1))
    for f, key in enumerate(b.keys):
        values, offsets = b.feature(key)
        assert offsets[-1] == values.size == B * D.DLRM_V2_BAG_SIZES[f]
        assert values.min() >= 0 and values.max() < rows[f]
        # the multi-hot bag is a fixed function of its first (base) ID
        bags = values.reshape(B, -1)
        deltas = (bags - bags[:, :1]) % rows[f]
        assert (deltas == deltas[0]).all()
    assert gen.pooling_factor == 214


def test_reproducible_by_seed_and_index():
    rows = D.dlrm_v2_rows(1000)
    a = D.CriteoLike(rows, seed=1).batch(32, 2)
    b = D.CriteoLike(rows, seed=1).batch(32, 2)
    for x, y in zip((a.dense, a.values, a.lengths, a.labels), (b.dense, b.values, b.lengths,
                                                               b.labels)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.values, D.CriteoLike(rows, seed=2).batch(32, 2).values)
    assert not np.array_equal(a.values, D.CriteoLike(rows, seed=1).batch(32, 3).values)


def test_one_hot_and_per_feature_exponents():
    gen = D.CriteoLike([100, 200], [1, 1], exponent=[0.5, 2.0], keys=["a", "b"], seed=0)
    b = gen.batch(20_000)
    va, _ = b.feature("a")
    vb, _ = b.feature("b")
    top_a = np.bincount(va).max() / va.size
    top_b = np.bincount(vb).max() / vb.size
    assert abs(top_b - _head_mass(200, 2.0, 1)) < 0.015       # about half on one row
    assert abs(top_a - _head_mass(100, 0.5, 1)) < 0.008       # under 5%
    with pytest.raises(ValueError, match="exponent has 1 values for 2"):
        D.CriteoLike([100, 200], [1, 1], exponent=[1.0])
    with pytest.raises(ValueError, match="differ in length"):
        D.CriteoLike([100], [1, 1])


def test_sample_sizes_mlperf_style():
    s = D.sample_sizes(50_000, seed=0)
    assert s.min() >= 100 and s.max() <= 700 and abs(s.mean() - 270) < 3
    assert s.min() == 100 and (s > 600).any()
    np.testing.assert_array_equal(s, D.sample_sizes(50_000, seed=0))
    gen = D.CriteoLike(D.dlrm_v2_rows(10_000), seed=4)
    sizes = [b.batch_size for b in gen.samples(5)]
    np.testing.assert_array_equal(sizes, D.sample_sizes(5, seed=4))


def test_kjt_ours():
    torch = pytest.importorskip("torch")
    b = D.CriteoLike(D.dlrm_v2_rows(10_000), seed=0).batch(8)
    ours = b.to_kjt(torchrec=False)
    from perfkernels.torch import KeyedJaggedTensor
    assert isinstance(ours, KeyedJaggedTensor) and ours.keys() == b.keys
    torch.testing.assert_close(ours.offsets(), torch.from_numpy(b.offsets()))


@pytest.mark.slow            # importing TorchRec takes about 10 s
def test_kjt_torchrec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchrec")
    b = D.CriteoLike(D.dlrm_v2_rows(10_000), seed=0).batch(8)
    kjt = b.to_kjt()
    assert type(kjt).__module__.startswith("torchrec")
    torch.testing.assert_close(kjt.values(), torch.from_numpy(b.values))
    torch.testing.assert_close(kjt.lengths(), torch.from_numpy(b.lengths))
    assert kjt.stride() == 8
