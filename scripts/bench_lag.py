#!/usr/bin/env python
"""A stream job's lag over time at a steady rate below what it trains: does it stay flat?

First (unless ``--rate`` is given) the job's rate: ``--probe-events`` events of the built-in
job's synthetic data published as fast as the broker takes them, then the stream job over them
until every one is trained (``bench_stream.run_job``). Then a fresh topic: a publisher thread
puts events on it at ``--share`` (0.8) of that rate, ``--per-message`` a message, for
``--minutes``, while the stream job (``[train] until_s``) trains them as they come; every
``--sample-s`` control's status gives the lag (events, and seconds since the newest event
trained; the events carry no timestamp column, so an event's time is the broker's) and the
events trained; the publisher starts once the job is training. Prints the samples, the lag's
least-squares slope after ``--warmup-s`` (events a minute; flat is about 0), its largest, and
where it ended. The
publisher cycles through one block of 65,536 generated rows (learning is not what is measured
here), so that it costs the host little. Every role its own process over loopback TCP.

    .venv/bin/python scripts/bench_lag.py [--minutes 10] [--share 0.8] [--rate N]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drift import job_text  # noqa: E402  (scripts/ beside it)
from bench_stream import TOPIC, run_job  # noqa: E402
from soak import StatusReader  # noqa: E402

from roles.events.publish import open_publisher  # noqa: E402
from roles.testbed.local_cluster import LocalCluster  # noqa: E402
from roles.testbed.nats_server import NatsServer  # noqa: E402
from roles.tools.replay import synthetic_generator, synthetic_table  # noqa: E402


def messages(per_message: int) -> list[bytes]:
    """One block of synthetic rows as JSON events of text values (as ``zbus-replay`` writes a
    text file's rows), ``per_message`` a message."""
    table = synthetic_table(synthetic_generator(65_536).block(0))
    text = pa.table({name: table[name].cast(pa.string()) for name in table.column_names})
    events = [orjson.dumps(row) for row in text.to_pylist()]
    whole = len(events) - len(events) % per_message   # full messages only: counted as such
    return [b"\n".join(events[i:i + per_message]) for i in range(0, whole, per_message)]


class Paced(threading.Thread):
    """Publishes ``payloads`` round and round at ``rate`` events a second until stopped."""

    def __init__(self, url: str, topic: str, payloads: list[bytes], per_message: int,
                 rate: float):
        super().__init__(daemon=True)
        self.out = open_publisher(url, topic)
        self.payloads, self.per_message, self.rate = payloads, per_message, rate
        self.stop = threading.Event()
        self.events = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        chunk = max(1, int(self.rate / self.per_message / 20))   # 20 sends a second
        try:
            cycle = itertools.cycle(self.payloads)
            while not self.stop.is_set():
                due = started + self.events / self.rate
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                self.out.publish([next(cycle) for _ in range(chunk)])
                self.events += chunk * self.per_message
        except BaseException as exc:   # said by the main thread
            self.error = exc
        finally:
            self.out.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--share", type=float, default=0.8)
    parser.add_argument("--rate", type=float, default=0.0, help="events/s (default: measured)")
    parser.add_argument("--probe-events", type=int, default=100_000)
    parser.add_argument("--per-message", type=int, default=100)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    args = parser.parse_args()
    payloads = messages(args.per_message)
    with tempfile.TemporaryDirectory(prefix="bench-lag-") as tmp:
        job_file = Path(tmp) / "lag.toml"
        job_file.write_text(job_text("probe", 10_000, timestamp=False))   # time: the broker's
        nats = NatsServer(Path(tmp) / "nats")
        try:
            rate = args.rate
            if not rate:
                out = open_publisher(nats.url, TOPIC)
                n = -(-args.probe_events // args.per_message)
                for i in range(0, n, 100):
                    out.publish([payloads[j % len(payloads)] for j in range(i, min(n, i + 100))])
                out.close()
                got = run_job(Path(tmp) / "probe", job_file, nats.url, n * args.per_message, {})
                rate = got["events_per_s"]
                print(f"the job trains {rate:,.0f} events/s unpaced (probe of "
                      f"{got['events']:,} events)", flush=True)
            paced_rate = args.share * rate if not args.rate else rate
            samples = paced(Path(tmp) / "paced", job_file, nats.url, payloads, args,
                            paced_rate)
        finally:
            nats.close()
    report(samples, paced_rate, args)


def paced(workdir: Path, job_file: Path, url: str, payloads: list[bytes],
          args: argparse.Namespace, rate: float) -> list[tuple[float, int, float, int, int]]:
    """(t, lag events, lag s, events trained, events published) every ``sample_s``."""
    publisher = Paced(url, "paced", payloads, args.per_message, rate)
    samples = []
    with LocalCluster(workdir, job_file, transport="tcp", stream__url=url,
                      stream__topic="paced", stream__group="paced", stream__start="earliest",
                      train__until_s=args.minutes * 60) as c:
        reader = StatusReader(c.job.cluster.endpoint("status"))
        try:
            c.start_all()
            deadline = time.monotonic() + 300
            while ((reader.poll() or {}).get("phase")) != "training":   # the clock starts
                if time.monotonic() > deadline or c.procs["control-0"].poll() is not None:
                    raise SystemExit(f"the paced job did not start training:\n{c.logs()}")
                time.sleep(0.2)
            publisher.start()
            started = time.monotonic()
            next_at = started + args.sample_s
            while c.procs["control-0"].poll() is None:
                if publisher.error is not None:
                    raise SystemExit(f"the publisher failed: {publisher.error}")
                status = reader.poll()
                if time.monotonic() >= next_at and status and status.get("stream"):
                    s = status["stream"]
                    samples.append((round(time.monotonic() - started, 1), s["lag_events"],
                                    s["lag_s"], s["events_trained"], publisher.events))
                    next_at += args.sample_s
                time.sleep(0.2)
            publisher.stop.set()
            publisher.join(timeout=30)
            if c.wait(timeout=600) != 0:
                raise SystemExit(f"the paced job failed:\n{c.logs()}")
        finally:
            publisher.stop.set()
            reader.close()
    return samples


def report(samples: list[tuple[float, int, float, int, int]], rate: float,
           args: argparse.Namespace) -> None:
    print(f"\npaced at {rate:,.0f} events/s for {args.minutes:g} min, {args.per_message} "
          "events a message")
    print("| s | lag (events) | lag (s) | trained | published |")
    print("|---|---|---|---|---|")
    for t, lag, lag_s, trained, published in samples:
        print(f"| {t:.0f} | {lag} | {lag_s} | {trained:,} | {published:,} |")
    after = [(t, lag) for t, lag, _, _, _ in samples if t >= args.warmup_s and lag is not None]
    if len(after) < 3:
        print("too few samples after warm-up for a slope")
        return
    t, lag = np.array([a[0] for a in after]), np.array([a[1] for a in after], dtype=float)
    slope = np.polyfit(t, lag, 1)[0] * 60
    print(f"\nafter {args.warmup_s:g} s: lag slope {slope:+,.0f} events a minute, largest "
          f"{lag.max():,.0f}, median {np.median(lag):,.0f}, last {lag[-1]:,.0f} events "
          f"({lag.max() / rate:.2f} s of events at most); trained {samples[-1][3]:,} of "
          f"{samples[-1][4]:,} published")


if __name__ == "__main__":
    main()
