"""What the examples that compare a stock model with its converted copy share: timing a call, and
training both on the same batches, one step of each in turn."""
from __future__ import annotations

import statistics
import sys
import time


def common_options(ap, repeat: str) -> None:
    """The options every comparison takes: timings per measurement (``repeat``: what of), learning
    rate, threads, tolerance."""
    ap.add_argument("--repeat", type=int, default=3, help=f"timings per {repeat}")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=None, help="torch's threads (default its own)")
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="largest difference accepted between stock and converted")


def start(args):
    """Set torch's threads (``--threads``) and the seed; ``perfkernels.torch``."""
    import torch

    import perfkernels.torch as pkt
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return pkt


def check(difference: float, args, what: str) -> None:
    """Exit with a message when stock and converted differ by more than ``--tolerance``."""
    if difference > args.tolerance:
        sys.exit(f"{what} differ by {difference:.3g}")


def timed(fn):
    """(fn(), seconds it took)."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def train_in_turn(sides, batches, alternate: bool = False) -> dict:
    """Train each ``(name, model, optimizers)`` of ``sides`` on every batch (``model(*batch)`` is
    the loss), one step of each in turn (with ``alternate``, who goes first alternates, so that
    both see the same machine state).  Returns the loss curves, their largest difference between
    the first two sides, and the median milliseconds per step (the first step, which makes the
    optimizers' state, not timed)."""
    losses = {name: [] for name, _, _ in sides}
    times = {name: [] for name, _, _ in sides}
    for step, batch in enumerate(batches):
        order = sides if not alternate or step % 2 == 0 else sides[::-1]
        for name, model, opts in order:
            def one_step():
                for o in opts:
                    o.zero_grad(set_to_none=True)
                loss = model(*batch)
                loss.backward()
                for o in opts:
                    o.step()
                return loss.item()
            loss, dt = timed(one_step)
            losses[name].append(loss)
            if step > 0:
                times[name].append(dt)
    first, second = (name for name, _, _ in sides[:2])
    diff = max((abs(a - b) for a, b in zip(losses[first], losses[second])), default=0.0)
    return {"max_loss_diff": diff, "losses": losses,
            "step_ms": {k: statistics.median(v) * 1e3 if v else float("nan")
                        for k, v in times.items()}}
