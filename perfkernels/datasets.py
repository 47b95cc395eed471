"""Synthetic recommender inputs shaped like Criteo 1TB as MLPerf's DLRM-v2 reads it: multi-hot
bags of power-law IDs, dense features and labels, in batches or in MLPerf-style samples of
100-700 user-item pairs.

The shape facts are MLPerf's (its reference DLRM-v2 configuration): 26 categorical features with
the row counts :data:`DLRM_V2_ROWS` and the multi-hot bag sizes :data:`DLRM_V2_BAG_SIZES`
(214 lookups per pair), 13 dense features.  The distributions are ours, chosen to look like click
logs and documented exactly so that any batch can be regenerated from its seed and index:

* **IDs.**  Per feature, a *rank* is drawn from a bounded power law: ``u`` uniform in ``[0, 1)``,
  ``x = ((N + 1) ** (1 - a) - 1) * u + 1) ** (1 / (1 - a))`` (``x = (N + 1) ** u`` when
  ``a = 1``), ``rank = min(floor(x) - 1, N - 1)``, so ``P(rank < k) = ((k + 1) ** (1 - a) - 1)
  / ((N + 1) ** (1 - a) - 1)`` (``a``: the exponent, ``N``: the table's rows).  The rank is then
  scattered over the table by a fixed bijection, ``id = (rank * A + B) mod N`` with ``A`` coprime
  to ``N`` (drawn once per feature from the seed), so the hot rows are spread over the table, not
  packed at its start.
* **Multi-hot.**  One base ID per feature and pair expands into a fixed bag of ``bag_size`` IDs:
  ``(base + delta_j) mod N`` for the feature's fixed offsets ``delta_0 = 0, delta_1..`` (drawn
  once per feature, uniform in ``[1, N)``), as MLPerf's multi-hot Criteo expands each one-hot ID
  into a bag that depends only on that ID.
* **Dense features** ``log(1 + e)``, ``e`` exponential with a per-feature scale; **labels** 1 with
  probability ``label_rate``.
* **Samples** (MLPerf's inference queries): sizes from ``low`` to ``high`` pairs, a truncated
  exponential whose mean is ``mean`` (MLPerf's about 270).

Random streams: ``numpy.random.Generator(numpy.random.PCG64(numpy.random.SeedSequence(seed,
spawn_key=key)))`` with key ``(0, f)`` for feature ``f``'s fixed draws (``A``, ``B``, the
offsets, the dense scale), ``(1, i)`` for batch ``i``, ``(2,)`` for the sample sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

__all__ = ["DLRM_V2_ROWS", "DLRM_V2_BAG_SIZES", "DLRM_V2_DENSE", "Batch", "CriteoLike",
           "ZipfIds", "dlrm_v2_rows", "sample_sizes"]

#: rows of MLPerf DLRM-v2's 26 tables (Criteo 1TB, hashed to at most 40M rows)
DLRM_V2_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282,
                10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108,
                36)
#: MLPerf DLRM-v2's multi-hot bag size of each feature
DLRM_V2_BAG_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3,
                     1, 1)
#: dense (integer) features of Criteo
DLRM_V2_DENSE = 13


def dlrm_v2_rows(scale: float = 1) -> list[int]:
    """DLRM-v2's row counts divided by ``scale`` (1: full size), rounded up."""
    if not scale >= 1:
        raise ValueError(f"scale must be >= 1; got {scale!r}")
    return [max(1, math.ceil(r / scale)) for r in DLRM_V2_ROWS]


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


class ZipfIds:
    """Power-law IDs over ``rows`` rows with exponent ``exponent`` (> 0), scattered by the fixed
    bijection ``id = (rank * A + B) mod rows`` (see the module docstring).  ``rows < 2**31``."""

    def __init__(self, rows: int, exponent: float, multiplier: int = 1, shift: int = 0) -> None:
        if int(rows) != rows or not 1 <= rows < 2 ** 31:
            raise ValueError(f"rows must be an int in [1, 2**31); got {rows!r}")
        if not exponent > 0:
            raise ValueError(f"exponent must be > 0; got {exponent!r}")
        self.rows, self.exponent = int(rows), float(exponent)
        a = int(multiplier) % self.rows or 1
        while math.gcd(a, self.rows) != 1:
            a = a % self.rows + 1
        self.multiplier, self.shift = a, int(shift) % self.rows

    def head_mass(self, k: float) -> float:
        """``P(rank < k)``: the share of draws that fall on the ``k`` hottest rows."""
        n, a = self.rows, self.exponent
        k = min(max(k, 0), n)
        if a == 1:
            return math.log(k + 1) / math.log(n + 1)
        return ((k + 1) ** (1 - a) - 1) / ((n + 1) ** (1 - a) - 1)

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """The ranks (0 = hottest) of uniform draws ``u`` in [0, 1)."""
        n, a = self.rows, self.exponent
        u = np.asarray(u, np.float64)
        if a == 1:
            x = np.exp(u * math.log(n + 1))
        else:
            x = (((n + 1) ** (1 - a) - 1) * u + 1) ** (1 / (1 - a))
        return np.minimum(np.floor(x).astype(np.int64) - 1, n - 1).clip(0)

    def ids(self, ranks: np.ndarray) -> np.ndarray:
        """Table rows of ``ranks`` (the fixed bijection)."""
        return (np.asarray(ranks, np.int64) * self.multiplier + self.shift) % self.rows

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` IDs (int64)."""
        return self.ids(self.ranks(rng.random(n)))


def _truncated_exp_scale(span: float, mean: float) -> float:
    """The scale ``s`` of an exponential truncated to ``[0, span)`` whose mean is ``mean``."""
    if not 0 < mean < span / 2:
        raise ValueError(f"the mean sample size must lie above low and below the middle of "
                         f"[low, high]; got {mean!r} over a span of {span!r}")
    lo, hi = 1e-6 * span, 1e6 * span
    for _ in range(200):
        s = math.sqrt(lo * hi)
        e = math.exp(-span / s)
        m = s - span * e / (1 - e)
        lo, hi = (s, hi) if m < mean else (lo, s)
    return math.sqrt(lo * hi)


def sample_sizes(n: int, seed: int = 0, *, low: int = 100, high: int = 700,
                 mean: float = 270.0) -> np.ndarray:
    """``n`` MLPerf-style sample sizes (pairs per query), int64 in ``[low, high]``: ``low +
    floor(x)``, ``x`` exponential truncated to ``[0, high - low + 1)`` with the mean that makes the
    sizes average about ``mean``."""
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= low <= high; got low={low!r}, high={high!r}")
    if low == high:
        return np.full(n, low, np.int64)
    span = high - low + 1
    s = _truncated_exp_scale(span, mean - low + 0.5)
    u = _rng(seed, 2).random(n)
    x = -s * np.log1p(-u * (1 - math.exp(-span / s)))
    return np.minimum(low + np.floor(x).astype(np.int64), high)


@dataclass
class Batch:
    """One batch: ``dense`` float32 ``[B, 13]``, ``keys`` (the features), ``lengths`` int64
    ``[F * B]`` and ``values`` int64 (the KeyedJaggedTensor layout: feature-major, every bag of
    feature 0 first), ``labels`` float32 ``[B]``."""
    dense: np.ndarray
    keys: list
    lengths: np.ndarray
    values: np.ndarray
    labels: np.ndarray

    @property
    def batch_size(self) -> int:
        return self.dense.shape[0]

    def offsets(self) -> np.ndarray:
        """``[F * B + 1]`` offsets of the bags into ``values``."""
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def feature(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)`` of one feature's bags (offsets ``[B + 1]`` from 0)."""
        f = self.keys.index(key)
        b = self.batch_size
        offs = self.offsets()[f * b:(f + 1) * b + 1]
        return self.values[offs[0]:offs[-1]], offs - offs[0]

    def to_kjt(self, torchrec: Optional[bool] = None) -> Any:
        """The sparse features as a KeyedJaggedTensor: TorchRec's when ``torchrec`` is True (or
        None and TorchRec imports), else :class:`perfkernels.torch.KeyedJaggedTensor`."""
        import torch
        values, lengths = torch.from_numpy(self.values), torch.from_numpy(self.lengths)
        if torchrec is not False:
            try:
                from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
                return KeyedJaggedTensor.from_lengths_sync(list(self.keys), values, lengths)
            except ImportError:
                if torchrec:
                    raise
        from perfkernels.torch import KeyedJaggedTensor as Ours
        return Ours.from_lengths_sync(list(self.keys), values, lengths)


class CriteoLike:
    """A Criteo-1TB-like source of batches (see the module docstring for every distribution).

    Parameters
    ----------
    rows : sequence of int
        Rows of each feature's table (default :data:`DLRM_V2_ROWS`; :func:`dlrm_v2_rows` scales).
    bag_sizes : sequence of int
        IDs per bag of each feature (default :data:`DLRM_V2_BAG_SIZES`; all 1: one-hot).
    exponent : float or sequence of float
        The power law's exponent, for all features or each (default 1.05).
    seed : int
        Everything is a function of the seed and the batch index.
    dense : int
        Dense features per pair (default 13).
    label_rate : float
        Share of positive labels (default 0.03).
    keys : sequence of str
        Feature names (default ``cat_0``... ``cat_25``).
    """

    def __init__(self, rows: Sequence[int] = DLRM_V2_ROWS,
                 bag_sizes: Sequence[int] = DLRM_V2_BAG_SIZES, *,
                 exponent: Union[float, Sequence[float]] = 1.05, seed: int = 0,
                 dense: int = DLRM_V2_DENSE, label_rate: float = 0.03,
                 keys: Optional[Sequence[str]] = None) -> None:
        rows, bag_sizes = list(rows), list(bag_sizes)
        if len(rows) != len(bag_sizes):
            raise ValueError(f"rows and bag_sizes differ in length: {len(rows)} and "
                             f"{len(bag_sizes)}")
        if any(int(b) != b or b < 1 for b in bag_sizes):
            raise ValueError(f"bag sizes must be ints >= 1; got {bag_sizes}")
        exps = ([float(exponent)] * len(rows) if np.ndim(exponent) == 0 else
                [float(e) for e in exponent])
        if len(exps) != len(rows):
            raise ValueError(f"exponent has {len(exps)} values for {len(rows)} features")
        self.keys = list(keys) if keys is not None else [f"cat_{i}" for i in range(len(rows))]
        if len(self.keys) != len(rows):
            raise ValueError(f"keys has {len(self.keys)} names for {len(rows)} features")
        self.rows, self.bag_sizes, self.exponents = rows, [int(b) for b in bag_sizes], exps
        self.seed, self.dense, self.label_rate = int(seed), int(dense), float(label_rate)
        self.ids: list[ZipfIds] = []
        self.deltas: list[np.ndarray] = []
        for f, (n, b, a) in enumerate(zip(rows, self.bag_sizes, exps)):
            g = _rng(self.seed, 0, f)
            mult = int(g.integers(1, 2 ** 62)) % n if n > 1 else 1
            z = ZipfIds(n, a, mult or 1, int(g.integers(0, n)))
            self.ids.append(z)
            self.deltas.append(np.concatenate(
                [[0], g.integers(1, n, b - 1) if n > 1 else np.zeros(b - 1, np.int64)]
            ).astype(np.int64))
        self.dense_scale = _rng(self.seed, 0, len(rows)).uniform(1.0, 100.0, self.dense)

    @property
    def pooling_factor(self) -> int:
        """IDs per pair over all features (DLRM-v2: 214)."""
        return sum(self.bag_sizes)

    def batch(self, batch_size: int, index: int = 0) -> Batch:
        """Batch number ``index`` of ``batch_size`` pairs (the same for the same seed, index and
        size)."""
        if int(batch_size) != batch_size or batch_size < 0:
            raise ValueError(f"batch_size must be an int >= 0; got {batch_size!r}")
        B = int(batch_size)
        g = _rng(self.seed, 1, int(index))
        values, lengths = [], []
        for z, deltas in zip(self.ids, self.deltas):
            base = z.sample(g, B)
            values.append(((base[:, None] + deltas[None, :]) % z.rows).reshape(-1))
            lengths.append(np.full(B, len(deltas), np.int64))
        dense = np.log1p(g.exponential(self.dense_scale, (B, self.dense))).astype(np.float32)
        labels = (g.random(B) < self.label_rate).astype(np.float32)
        return Batch(dense, list(self.keys),
                     np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
                     np.concatenate(values) if values else np.zeros(0, np.int64), labels)

    def samples(self, count: int, *, low: int = 100, high: int = 700, mean: float = 270.0
                ) -> Iterator[Batch]:
        """``count`` MLPerf-style samples: batch ``i`` has :func:`sample_sizes`'s ``i``-th size."""
        for i, size in enumerate(sample_sizes(count, self.seed, low=low, high=high, mean=mean)):
            yield self.batch(int(size), i)
