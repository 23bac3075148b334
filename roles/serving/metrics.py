"""A serving process's figures for Prometheus (``GET /metrics``): requests by status code, their
latency, the rows per scored batch, the served model's round and how old its parameters are
(the version lag). With several worker processes behind one port (``--workers``), each writes
its figures where ``prometheus_client``'s multiprocess mode reads them
(``PROMETHEUS_MULTIPROC_DIR``), so whichever answers the scrape reports them all."""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR"
RECENT_LATENCIES = 20_000   # the infer latencies an interval's percentiles are read from, at most


class Recent:
    """This process's infer requests, rows and latencies since the last ``take`` (what it
    reports to control: ``roles.serving.reporting``); thread-safe (the event loop adds, the
    reporting thread takes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = self.rows = 0
        self.latencies: deque[float] = deque(maxlen=RECENT_LATENCIES)
        self.since = time.monotonic()

    def request(self, latency_s: float) -> None:
        """An infer request answered (whatever its status), after ``latency_s``."""
        with self.lock:
            self.requests += 1
            self.latencies.append(latency_s)

    def scored(self, rows: int) -> None:
        with self.lock:
            self.rows += rows

    def take(self) -> tuple[float, float, float, float]:
        """Requests/s and rows/s since the last take, and the p50 and p99 latency in ms of
        its requests (the latest ``RECENT_LATENCIES``; -1 when none)."""
        with self.lock:
            now = time.monotonic()
            elapsed = max(now - self.since, 1e-9)
            requests, rows, taken = self.requests, self.rows, list(self.latencies)
            self.requests = self.rows = 0
            self.latencies.clear()
            self.since = now
        latencies = sorted(taken)   # (outside the lock: the event loop adds meanwhile)
        if not latencies:
            return requests / elapsed, rows / elapsed, -1.0, -1.0

        def at(q: float) -> float:
            return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

        return requests / elapsed, rows / elapsed, at(0.5), at(0.99)


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("zbus_serve_requests", "Requests answered, by path kind and "
                                "status code", ["kind", "code"], registry=r)
        self.rows = Counter("zbus_serve_rows", "Rows scored", registry=r)
        self.latency = Histogram("zbus_serve_request_seconds", "Infer requests: from the "
                                 "request read to the response ready", buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.batch_rows = Histogram("zbus_serve_batch_rows", "Rows per scored batch (several "
                                    "requests' rows scored together)", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.round = Gauge("zbus_serve_model_round", "The training round of the model served",
                           registry=r, multiprocess_mode="livemin")
        self.saved = Gauge("zbus_serve_model_saved_timestamp_seconds", "When the served "
                           "model's parameters were saved (Unix time)", registry=r,
                           multiprocess_mode="livemin")
        self.versions = Counter("zbus_serve_model_loads", "Model versions loaded", registry=r)
        self.recent = Recent()

    def loaded(self, round_: int, saved_at: float | None) -> None:
        self.versions.inc()
        self.round.set(round_)
        if saved_at is not None:
            self.saved.set(saved_at)

    def exposition(self, saved_at: float | None) -> tuple[bytes, str]:
        """The text Prometheus reads; the version lag is this process's (now minus when the
        parameters it serves were saved)."""
        if os.environ.get(MULTIPROCESS):
            from prometheus_client import multiprocess
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self.registry
        text = generate_latest(registry)
        if saved_at is not None:
            text += (b"# HELP zbus_serve_version_lag_seconds How old the served parameters "
                     b"are: now minus when they were saved\n"
                     b"# TYPE zbus_serve_version_lag_seconds gauge\n"
                     + f"zbus_serve_version_lag_seconds {time.time() - saved_at:.3f}\n".encode())
        return text, CONTENT_TYPE_LATEST
