"""The collectives the sharded collection uses, on ``torch.distributed``, with clear errors.

Every exchange is one ``all_to_all_single`` (any backend that has it: gloo, nccl, mpi).  A
collective that fails, because a peer raised, died or did not arrive within the process group's
timeout, is re-raised as :class:`CollectiveError` naming this rank and what was being exchanged;
a job never hangs past the timeout given to ``init_process_group``.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor


class CollectiveError(RuntimeError):
    """A collective of the sharded collection failed: another rank raised an error, died, or
    did not reach the same collective within the process group's timeout."""


class Group:
    """A process group (or none: a world of one process with no collectives at all)."""

    def __init__(self, process_group: Optional[Any]) -> None:
        self.pg = process_group
        self.distributed = process_group is not None or (dist.is_available()
                                                         and dist.is_initialized())
        if self.distributed:
            self.size = dist.get_world_size(process_group)
            self.rank = dist.get_rank(process_group)
            self.backend = str(dist.get_backend(process_group))
        else:
            self.size, self.rank, self.backend = 1, 0, "none"
        #: wall seconds spent in each kind of exchange (``what`` of :meth:`all_to_all`), and the
        #: bytes this rank sent to other ranks in it
        self.seconds: dict = defaultdict(float)
        self.bytes_sent: dict = defaultdict(int)

    def global_rank(self, rank: int) -> int:
        """The default group's number of this group's ``rank``."""
        if not self.distributed or self.pg is None:
            return rank
        return dist.get_global_rank(self.pg, rank)

    def _failed(self, what: str, exc: BaseException) -> CollectiveError:
        return CollectiveError(
            f"rank {self.rank} of {self.size}: {what} failed ({type(exc).__name__}: {exc}). "
            f"Another rank raised an error, died, or did not reach this collective within the "
            f"process group's timeout (init_process_group(timeout=...)); see that rank's log")

    def all_to_all(self, send: Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                   what: str) -> Tensor:
        """``send`` split by ``send_splits`` (elements per destination, rank order); returns the
        concatenation of what each source sent, ``recv_splits`` elements from each."""
        recv = send.new_empty(sum(recv_splits))
        if not self.distributed:
            recv.copy_(send)
            return recv
        start = time.perf_counter()
        try:
            dist.all_to_all_single(recv, send, list(recv_splits), list(send_splits),
                                   group=self.pg)
        except RuntimeError as exc:
            raise self._failed(what, exc) from exc
        self.seconds[what] += time.perf_counter() - start
        self.bytes_sent[what] += (sum(send_splits) - send_splits[self.rank]) * send.element_size()
        return recv

    def all_gather_object(self, obj: Any, what: str) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.pg)
        except RuntimeError as exc:
            raise self._failed(what, exc) from exc
        return out


def check_peers(process_group: Optional[Any] = None, timeout: Optional[float] = None) -> None:
    """Wait until every rank of the group arrives here; raise :class:`CollectiveError` naming the
    ranks that did not within ``timeout`` seconds (gloo's ``monitored_barrier``; other backends:
    a plain barrier, bounded by the group's timeout)."""
    from datetime import timedelta
    group = Group(process_group)
    if not group.distributed:
        return
    try:
        if group.backend == "gloo":
            dist.monitored_barrier(group=process_group, wait_all_ranks=True,
                                   timeout=None if timeout is None else timedelta(seconds=timeout))
        else:
            dist.barrier(group=process_group)
    except RuntimeError as exc:
        raise group._failed("the barrier checking that every rank is alive", exc) from exc


def int_tensor(values: Sequence[int], device: torch.device) -> Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=device)
