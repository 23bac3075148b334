#!/usr/bin/env python
"""Freshness: how soon an event changes what ``zbus-serve --follow`` serves.

A stream job (``jobs/adult_stream.toml``, every role its own process over loopback TCP) learns
from a local ``nats-server -js`` while ``zbus-serve --follow RUN`` (a process) follows it; other
traffic (Adult rows as JSON events, 100 a message) is published at each ``--rates`` events/s.
Meanwhile canaries: an Adult row whose ``native-country`` is a brand-new value, published
twice (the job admits a key at its second sighting: ``[embeddings] min_count = 2``, so that until
it is trained it shares its field's default row). A client asks the server, every few
milliseconds, for each waiting canary's row and its twin's (another new value never published,
on the same shard: the same default row) in one request, so both are scored by one version:
the canary is served fresh once their probabilities differ (by more than float32's noise:
``CHANGED``). The figure is the time from the
canary's publish to that answer, p50 and p99 over ``--canaries`` canaries per rate.

Side by side, in the same harness: ``--peers`` runs the job again with live parameters every
10 s (``[serving] publish_ms = 10000``: Monolith's push of the rows touched every 10 s); an
export reloaded every 10 minutes (TorchEasyRec's example) is computed, not run: a canary waits
for the next reload, uniformly over the 600 s (p50 300 s, p99 594 s), plus the reload.

    .venv/bin/python scripts/bench_fresh.py [--rates 0,10000,50000] [--canaries 1000]
        [--publish-ms 200] [--peers]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.data.stream import Tally
from roles.events.publish import open_publisher
from roles.serving.client import Client, request_body
from roles.serving.following import newest_checkpoint
from roles.serving.inference import rows_of
from roles.serving.model import read_model
from roles.serving.served import Served
from roles.testbed.jobs import REPO
from roles.testbed.local_cluster import BIN, LocalCluster
from roles.testbed.nats_server import NatsServer

JOB = REPO / "jobs" / "adult_stream.toml"
TOPIC = "fresh.events"
FIELD = "native-country"
TIMEOUT_S = 60.0      # a canary not served fresh by then is counted as never
MAX_ASKED = 500       # canaries asked about in one request (with their twins: 1,000 rows)
# a canary is fresh once its probability and its twin's differ by more than this: float32's
# last bits are not a change (measured at 10,000-50,000 events/s and alone, 2026-12-01: a
# canary and its twin both on the default row differed by up to 6e-8, a probability's
# rounding; a canary's row trained moved it by 1.2e-5 at the least, by 1e-3 and more unless
# the model was saturated by the canaries' positive labels alone)
CHANGED = 1e-6


def adult_events() -> list[dict[str, str]]:
    with gzip.open(REPO / "data" / "adult.csv.gz", "rt") as f:
        return list(csv.DictReader(f))


class Traffic:
    """Adult events at ``rate`` a second, 100 a message, on a thread (the rate can change)."""

    def __init__(self, url: str, events: list[dict[str, str]]):
        self.publisher = open_publisher(url, TOPIC)
        self.lines = [orjson.dumps(e) for e in events]
        self.rate = 0.0
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        at, next_at = 0, time.monotonic()
        while not self.stop.is_set():
            if self.rate <= 0:
                time.sleep(0.01)
                next_at = time.monotonic()
                continue
            messages = []
            for _ in range(10):   # 1,000 events a batch of messages
                chunk = [self.lines[(at + i) % len(self.lines)] for i in range(100)]
                at += 100
                messages.append(b"\n".join(chunk))
            rate = self.rate
            self.publisher.publish(messages)
            self.sent += 1000
            next_at += 1000 / max(rate, 1.0)
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.publisher.close()


class Canaries:
    """Canaries published every ``every_s``, and a client that finds when each is served fresh."""

    def __init__(self, url: str, server: str, base: dict[str, str], owner, every_s: float):
        self.publisher = open_publisher(url, TOPIC, create=False)
        self.server, self.base, self.owner, self.every_s = server, base, owner, every_s
        self.pending: dict[int, tuple[float, dict, dict]] = {}
        self.lock = threading.Lock()
        self.fresh: list[float] = []
        self.never = 0
        self.lags: list[float] = []   # served version's age (now - its cut) at each answer
        self.number = 0

    def twin_of(self, i: int, canary: dict) -> dict:
        target = self.owner(canary)
        for j in range(1000):
            twin = {**canary, FIELD: f"twin-{i}-{j}"}
            if self.owner(twin) == target:
                return twin
        raise RuntimeError("no twin on the canary's shard")

    def run(self, count: int) -> None:
        client = Client(self.server)
        meta = client.metadata("adult-stream")
        next_at = time.monotonic()
        published = 0
        while published < count or self.pending:
            now = time.monotonic()
            if published < count and now >= next_at:
                i = self.number
                self.number += 1
                canary = {**self.base, FIELD: f"canary-{self.number}-{time.time_ns()}"}
                twin = self.twin_of(i, canary)
                event = orjson.dumps({**canary, "income": ">50K"})
                t0 = time.monotonic()
                self.publisher.publish([event + b"\n" + event])
                self.pending[i] = (t0, canary, twin)
                published += 1
                next_at += self.every_s
            if self.pending:
                order = list(self.pending)[:MAX_ASKED]   # the oldest: one request's rows
                rows = [r for i in order for r in self.pending[i][1:]]
                status, reply = client.infer("adult-stream", request_body(meta, rows))
                now = time.monotonic()
                if status == 200:
                    cut = reply["model_version"].split(".")
                    if len(cut) == 3:
                        self.lags.append(time.time() - int(cut[2]) / 1000)
                    p = np.asarray(reply["outputs"][0]["data"]).reshape(-1, 2)
                    for i, (a, b) in zip(order, p, strict=True):
                        if abs(a - b) > CHANGED:
                            self.fresh.append(now - self.pending.pop(i)[0])
                        elif now - self.pending[i][0] > TIMEOUT_S:
                            self.pending.pop(i)
                            self.never += 1
            time.sleep(0.003)
        client.close()

    def close(self) -> None:
        self.publisher.close()


def owner_of(run: Path) -> tuple:
    """A function from a row to the shard that owns its ``FIELD`` key (from the newest
    checkpoint's model: its hashing and its key map)."""
    model = read_model(newest_checkpoint(str(run)))
    served = Served.of(model)
    slot = list(model.job.sparse_fields).index(FIELD)
    meta = {"inputs": [{"name": n, "datatype": "BYTES"} for n in served.signature.sparse]
            + [{"name": n, "datatype": "FP32"} for n in served.signature.dense]}

    def owner(row: dict) -> int:
        block = rows_of(request_body(meta, [row]), served.signature, 10).block
        keys = served.prepare(block, False, Tally()).keys
        return int(model.owners.owner_of(keys[:, slot])[0])
    return owner


def throughput(run: Path) -> list[float]:
    """Control's throughput records so far (``metrics.jsonl``: samples trained a second, every
    few seconds)."""
    data = (run / "metrics.jsonl").read_bytes()
    whole = data[:data.rfind(b"\n") + 1]   # (a line control is writing now: next time)
    return [orjson.loads(line)["samples_per_s"] for line in whole.splitlines()
            if b'"throughput"' in line]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(publish_ms: int, rates: list[int], count: int, every_s: float) -> list[dict]:
    events = adult_events()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
        nats = NatsServer(Path(tmp) / "nats")
        traffic = Traffic(nats.url, events)
        try:
            traffic.publisher.publish([b"\n".join(traffic.lines[i:i + 100])
                                       for i in range(0, 20_000, 100)])   # a first model
            c = LocalCluster(Path(tmp) / "job", JOB, transport="tcp", stream__url=nats.url,
                             stream__topic=TOPIC, stream__group="fresh",
                             train__until_events=0, embeddings__min_count=2,
                             checkpoint__every_s=30.0, serving__publish_ms=publish_ms)
            server = None
            try:
                c.start_all()
                deadline = time.monotonic() + 300
                while newest_checkpoint(str(c.run_dir)) is None:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"no checkpoint within 300 s\n{c.logs()}")
                    time.sleep(0.5)
                server = subprocess.Popen(
                    [str(BIN / "zbus-serve"), "--follow", str(c.run_dir), "--port", "0",
                     "--poll-ms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True)
                url = server.stdout.readline().split(" on ")[1].split()[0]
                Client(url).wait_ready()
                owner = owner_of(c.run_dir)
                for rate in rates:
                    traffic.rate = rate
                    sent_before, t_before = traffic.sent, time.monotonic()
                    records_before = len(throughput(c.run_dir))
                    time.sleep(5)   # the traffic under way
                    canaries = Canaries(nats.url, url, events[0], owner, every_s)
                    try:
                        canaries.run(count)
                    finally:
                        canaries.close()
                    achieved = (traffic.sent - sent_before) / (time.monotonic() - t_before)
                    rates_seen = throughput(c.run_dir)[records_before:]
                    trained = statistics.median(rates_seen) if rates_seen else float("nan")
                    results.append({
                        "publish_ms": publish_ms, "rate": rate, "achieved": achieved,
                        "trained": trained,
                        "canaries": len(canaries.fresh), "never": canaries.never,
                        "p50": percentile(canaries.fresh, 50),
                        "p99": percentile(canaries.fresh, 99),
                        "lag_p50": percentile(canaries.lags, 50)})
                    print(orjson.dumps(results[-1]).decode(), flush=True)
                traffic.rate = 0
            finally:
                if server is not None:
                    server.terminate()
                    server.wait(timeout=30)
                c.close()
        finally:
            traffic.close()
            nats.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0,10000,50000")
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--every-ms", type=float, default=50.0,
                        help="one canary this often")
    parser.add_argument("--publish-ms", type=int, default=200)
    parser.add_argument("--peers", action="store_true",
                        help="also live parameters every 10 s (Monolith's interval)")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    rows = run(args.publish_ms, rates, args.canaries, args.every_ms / 1000)
    if args.peers:
        rows += run(10_000, rates, args.canaries, args.every_ms / 1000)
    print(f"\nCPU: {cpu_name()}; {args.canaries} canaries per row, one every "
          f"{args.every_ms:g} ms\n")
    print("| mechanism | other events/s (asked / published) | trained events/s (median) | "
          "canaries fresh (not in 60 s) | p50 | p99 | served version's age p50 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = ("zbus, live parameters every 200 ms" if r["publish_ms"] == 200
                else f"live parameters every {r['publish_ms'] / 1000:g} s")
        print(f"| {name} | {r['rate']:,} / {r['achieved']:,.0f} | {r['trained']:,.0f} | "
              f"{r['canaries']} "
              f"({r['never']}) | {r['p50'] * 1000:.0f} ms | {r['p99'] * 1000:.0f} ms | "
              f"{r['lag_p50'] * 1000:.0f} ms |")
    print("| an export reloaded every 10 min (computed) | any | | | 300 s + reload | "
          "594 s + reload | |")


if __name__ == "__main__":
    main()
