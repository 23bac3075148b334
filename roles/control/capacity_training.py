"""The capacity predictor trained off control's loop (``[placement] mode = "skew"``).

Training the predictor (``roles.algorithms.control.capacity``) takes tens of milliseconds to
seconds, more the longer the history: done in control's one loop it would stall heartbeats, probes
and every decision meanwhile. Here it runs in a child process of control's (one, started with
control, torch imported there once): a training starts when new history records are in and
none is running, from the weights of the predictor in service (so it goes on from what it has
learnt), and the trained predictor replaces the one in service once it is done (checked at each
window). Until the first training is done there is no predictor in service, and placement uses
equal (or configured) capacities. The history is bounded by the caller (``[placement]
history_windows``), so a training's cost does not grow with the job. (A thread was tried
first: its Python work held control's loop for up to a few hundred milliseconds at a time on a
busy two-core machine, sharing Python's lock; measured in ``scripts/bench_control_loop.py``.)
The child (and multiprocessing's resource tracker, which exits once the child and control have)
does not outlive control: control ends it when it closes, and on Linux the kernel kills it
when control dies in any way (``zbus.children``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from roles.algorithms.control.capacity import CapacityPredictor, Record
from zbus import children

log = logging.getLogger(__name__)
Weights = dict[str, Any]   # a predictor's state: its network's arrays, offset, counts


def _state(p: CapacityPredictor) -> Weights:
    return {"model": {k: v.numpy().copy() for k, v in p.model.state_dict().items()},
            "offset": p.offset, "trained_on": p.trained_on, "dropped": p.dropped}


def _adopt(p: CapacityPredictor, state: Weights) -> CapacityPredictor:
    p.model.load_state_dict({k: p.torch.from_numpy(v) for k, v in state["model"].items()})
    p.offset, p.trained_on, p.dropped = state["offset"], state["trained_on"], state["dropped"]
    return p


def _warm(shards: int) -> None:
    """In the child, once: torch's import and the optimiser's (seconds on a busy machine)."""
    from roles.algorithms.shared.dense_optimizer import DenseAdam
    p = CapacityPredictor(shards)
    DenseAdam(list(p.model.parameters()), 0.02)


def _train(shards: int, start: Weights | None, records: list[Record], steps: int,
           save_to: str) -> tuple[Weights | None, float, int]:
    """In the child: train from ``start`` (or fresh), save the model; its state, the seconds
    it took and the process that did it."""
    started = time.perf_counter()
    p = CapacityPredictor(shards)
    if start is not None:
        _adopt(p, start)
    try:
        p.fit(records, steps=steps)
    except ValueError as exc:   # nothing usable after filtering
        log.warning("capacity predictor not trained: %s", exc)
        return None, time.perf_counter() - started, os.getpid()
    p.save(Path(save_to))
    return _state(p), time.perf_counter() - started, os.getpid()


def child_process() -> Executor:
    """Where trainings run: one child process, started now (spawned: a fresh interpreter,
    which inherits none of control's sockets), killed when control dies."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=children.die_with_parent, initargs=(os.getpid(),))


class BackgroundFit:
    def __init__(self, shards: int, steps: int, save_to: Path,
                 executor: Callable[[], Executor] = child_process):
        self.shards = shards
        self.steps = steps
        self.save_to = save_to
        self.executor = executor
        self.serving: CapacityPredictor | None = None
        self.spare = CapacityPredictor(shards)   # the next one to serve (torch's import: at
        self.pool = self.start_pool()            # start, not mid-job)
        self.running: Future[tuple[Weights | None, float, int]] | None = None
        self.running_version = -1
        self.fits = 0
        self.fit_s_last = 0.0
        self.trained_by = 0      # the process that trained the serving predictor
        self.trained_at = -1     # the history version the serving predictor was trained on

    def want(self, records: list[Record], version: int) -> None:
        """Train on ``records`` (history ``version``) unless a training is still running or the
        one in service already knows this version."""
        if self.running is not None or version == self.trained_at or not records:
            return
        start = None if self.serving is None else _state(self.serving)
        try:
            self.running = self.pool.submit(_train, self.shards, start, list(records),
                                            self.steps, str(self.save_to))
        except BrokenProcessPool:   # the child died: the next window starts a new one
            log.warning("the capacity predictor's process died; starting another")
            self.pool = self.start_pool()
            return
        self.running_version = version

    def start_pool(self) -> Executor:
        pool = self.executor()
        pool.submit(_warm, self.shards)
        return pool

    def poll(self) -> None:
        """Put a finished training in service (the previous predictor served until now)."""
        if self.running is None or not self.running.done():
            return
        done, self.running = self.running, None
        self.trained_at = self.running_version
        try:
            state, self.fit_s_last, self.trained_by = done.result()
        except Exception:   # the child died (killed, out of memory): a new one next time
            log.exception("capacity predictor training failed")
            return
        if state is not None:
            self.serving, self.spare = _adopt(self.spare, state), self.serving or \
                CapacityPredictor(self.shards)
            self.fits += 1

    def capacities(self, pairs: float) -> np.ndarray | None:
        return None if self.serving is None else self.serving.capacities(pairs)

    def wait(self, timeout: float | None = None) -> None:
        """Until the running training is done (tests)."""
        if self.running is not None:
            self.running.result(timeout)
            self.poll()

    def close(self) -> None:
        """End the child now: a training under way is of no use any more."""
        # the pool's processes (ProcessPoolExecutor.kill_workers() from Python 3.14 on)
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        for process in processes:
            process.kill()
            process.join()
        self.pool.shutdown(wait=True, cancel_futures=True)
