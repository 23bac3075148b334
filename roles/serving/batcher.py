"""Concurrent requests scored together (micro-batching): a request's rows wait for others while
the scorer is idle, up to ``max_wait_s`` after the first of them or until ``max_rows`` are
waiting; while it is busy they gather, and the next batch takes them all (up to ``max_rows``).
So at a low rate a row waits at most ``max_wait_s``, and at a high one the batches grow with
the load instead of the queue. Scoring runs on a thread of its own (torch leaves the GIL while
it computes): the event loop reads and answers requests meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from roles.serving.inference import Request
from roles.serving.served import Served


class NotReady(RuntimeError):
    """No model is loaded yet (``--follow`` before the job's first checkpoint)."""


@dataclass
class Scored:
    probabilities: np.ndarray
    version: str
    batch_rows: int


class Batcher:
    """``current()``: the model to score with now (None: none yet); ``on_batch(rows)``
    is told of each batch scored."""

    def __init__(self, current: Callable[[], Served | None], max_rows: int, max_wait_s: float,
                 on_batch: Callable[[int], None] = lambda rows: None):
        self.current, self.max_rows, self.max_wait_s = current, max_rows, max_wait_s
        self.on_batch = on_batch
        self.waiting: list[tuple[Request, asyncio.Future[Scored]]] = []
        self.rows = 0
        self.first_at = 0.0
        self.arrived: asyncio.Event | None = None
        self.task: asyncio.Task | None = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="zbus-score")

    async def infer(self, request: Request) -> Scored:
        if self.current() is None:
            raise NotReady("no model is loaded yet")
        if self.task is None:   # started in the server's event loop, at its first request
            self.arrived = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self.run())
        assert self.arrived is not None
        future: asyncio.Future[Scored] = asyncio.get_running_loop().create_future()
        if not self.waiting:
            self.first_at = time.monotonic()
        self.waiting.append((request, future))
        self.rows += len(request)
        self.arrived.set()
        return await future

    async def run(self) -> None:
        assert self.arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            await self.arrived.wait()
            self.arrived.clear()
            while self.waiting and self.rows < self.max_rows:   # the scorer is idle: gather
                left = self.first_at + self.max_wait_s - time.monotonic()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(self.arrived.wait(), left)
                except TimeoutError:
                    break
                self.arrived.clear()
            batch = self.take()
            if not batch:
                continue
            served = self.current()
            try:
                if served is None:
                    raise NotReady("no model is loaded")
                results = await loop.run_in_executor(
                    self.pool, served.score, [r.block for r, _ in batch])
            except Exception as exc:   # every request of the batch hears of it
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            rows = sum(len(r) for r, _ in batch)
            self.on_batch(rows)
            for (_, future), probabilities in zip(batch, results, strict=True):
                if not future.done():   # (its client may have gone)
                    future.set_result(Scored(probabilities, served.version, rows))
            if self.waiting:
                self.arrived.set()   # what gathered meanwhile goes at once

    def take(self) -> list[tuple[Request, asyncio.Future[Scored]]]:
        """The waiting requests of at most ``max_rows`` rows (one at least), in order."""
        batch: list[tuple[Request, asyncio.Future[Scored]]] = []
        rows = 0
        while self.waiting and (not batch or rows + len(self.waiting[0][0]) <= self.max_rows):
            request, future = self.waiting.pop(0)
            rows += len(request)
            batch.append((request, future))
        self.rows -= rows
        if self.waiting:
            self.first_at = time.monotonic()
        return batch

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
