"""What the examples that compare a stock model with its converted copy share: timing a call, and
training both on the same batches, one step of each in turn."""
from __future__ import annotations

import statistics
import time


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
