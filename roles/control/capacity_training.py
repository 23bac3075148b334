"""The capacity predictor trained off control's loop (``[placement] mode = "skew"``).

Training the predictor (``roles.algorithms.capacity``) takes tens of milliseconds to seconds,
more the longer the history: done in control's one loop it would stall heartbeats, probes and
every decision meanwhile. Here it runs on a thread of its own: a training starts when new
history records are in and none is running, on a copy of the predictor in service (so it goes
on from the weights already learnt), and the trained copy replaces the one in service once it
is done (checked at each window). Until the first training is done, there is no predictor in
service and placement uses equal (or configured) capacities. The history is bounded by the
caller (``[placement] history_windows``), so a training's cost does not grow with the job.
Torch runs on one thread; its work releases Python's lock between small steps, so control's
loop goes on meanwhile (measured: ``scripts/bench_control_loop.py``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from roles.algorithms.capacity import CapacityPredictor, Record

log = logging.getLogger(__name__)


class BackgroundFit:
    def __init__(self, shards: int, steps: int, save_to: Path):
        self.blank = CapacityPredictor(shards)   # torch's import: at start, not mid-job,
        self.blank.torch.optim.Adam(self.blank.model.parameters())  # and the optimiser's (its
        # first use imports torch._dynamo: seconds on a busy machine)
        self.steps = steps
        self.save_to = save_to
        self.serving: CapacityPredictor | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capacity-fit")
        self.running: Future[tuple[CapacityPredictor | None, int, float]] | None = None
        self.fits = 0
        self.fit_s_last = 0.0
        self.trained_at = -1     # the history version the serving predictor was trained on

    def want(self, records: list[Record], version: int) -> None:
        """Train on ``records`` (history ``version``) unless a training is still running or the
        one in service already knows this version."""
        if self.running is not None or version == self.trained_at or not records:
            return
        start = (self.serving if self.serving is not None else self.blank).copy()
        self.running = self.pool.submit(self._fit, start, list(records), version)

    def _fit(self, predictor: CapacityPredictor, records: list[Record],
             version: int) -> tuple[CapacityPredictor | None, int, float]:
        started = time.perf_counter()
        predictor.torch.set_num_threads(1)  # OpenMP's thread count is per thread: without
        # this, a training on this thread ran 30-60x slower on a busy 2-core machine
        try:
            predictor.fit(records, steps=self.steps)
        except ValueError as exc:   # nothing usable after filtering
            log.warning("capacity predictor not trained: %s", exc)
            return None, version, time.perf_counter() - started
        predictor.save(self.save_to)
        return predictor, version, time.perf_counter() - started

    def poll(self) -> None:
        """Put a finished training in service (the previous predictor served until now)."""
        if self.running is None or not self.running.done():
            return
        done, self.running = self.running, None
        trained, self.trained_at, self.fit_s_last = done.result()
        if trained is not None:
            self.serving = trained
            self.fits += 1

    def capacities(self, pairs: float) -> np.ndarray | None:
        return None if self.serving is None else self.serving.capacities(pairs)

    def wait(self, timeout: float | None = None) -> None:
        """Until the running training is done (tests)."""
        if self.running is not None:
            self.running.result(timeout)
            self.poll()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
