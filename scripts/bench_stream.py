#!/usr/bin/env python
"""A stream job against the one process that trains the same events, test-then-train.

Publishes ``--file``'s rows as JSON events (``--per-message`` a message) to a local
``nats-server -js``, then runs the stream job ``--job`` over them, every role its own process
over loopback TCP, until every event is trained; and trains the same events in the same order
in one process (``zbus-reference --events``: ``roles.tools.stream_reference``), the comparator
a user would pick. Each ``--repeats`` times; the table gives medians: events a second while
training (the feeders' pass), the progressive AUC and log loss, the lag at the end, and the
ratios against the one process. Defaults: UCI Adult's 48,842 rows (``jobs/adult_stream.toml``:
2 workers, 2 shards, batch 256, sync step).

    .venv/bin/python scripts/bench_stream.py [--repeats 3] [--job jobs/adult_stream.toml]
        [--file data/adult.csv.gz] [--per-message 100] [--set train__sync=every ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from roles.events.publish import open_publisher
from roles.job.settings import load_job
from roles.testbed.local_cluster import LocalCluster, setting_pair
from roles.testbed.nats_server import NatsServer
from roles.tools.replay import replay
from roles.tools.stream_reference import score_then_train

REPO = Path(__file__).resolve().parent.parent
TOPIC = "bench.events"


def run_job(workdir: Path, job: Path, url: str, events: int, settings: dict) -> dict:
    with LocalCluster(workdir, job, transport="tcp", stream__url=url, stream__topic=TOPIC,
                      stream__group=workdir.name.replace("-", "_"),
                      train__until_events=events, **settings) as c:
        if c.run_job(timeout=1800) != 0:
            raise SystemExit(f"the stream job failed:\n{c.logs()}")
        s = c.summary()
    st = s["stream"]
    assert st is not None
    train_s = s["per_epoch"][0]["train_s"]
    return {"events": st["events_trained"], "twice": st["events_trained_twice"],
            "events_per_s": st["events_trained"] / train_s, "wall_s": s["wall_s"],
            "auc": st["progressive_auc"], "logloss": st["progressive_logloss"],
            "lag": st["lag_events"], "windows": st["windows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job", type=Path, default=REPO / "jobs" / "adult_stream.toml")
    parser.add_argument("--file", type=Path, default=REPO / "data" / "adult.csv.gz")
    parser.add_argument("--per-message", type=int, default=100)
    parser.add_argument("--set", action="append", default=[], type=setting_pair,
                        metavar="SECTION__KEY=VALUE", help="a job setting for the stream job")
    args = parser.parse_args()
    settings = dict(args.set)
    job = load_job(str(args.job), environ={})
    cores = os.cpu_count() or 1
    dist, alone = [], []
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        nats = NatsServer(Path(tmp) / "nats")
        try:
            out = open_publisher(nats.url, TOPIC)
            try:
                events, messages, _ = replay(args.file, out, per_message=args.per_message)
            finally:
                out.close()
            print(f"{events} events in {messages} messages on {nats.url}", flush=True)
            for r in range(args.repeats):
                got = run_job(Path(tmp) / f"job-{r}", args.job, nats.url, events, settings)
                dist.append(got)
                one = score_then_train(job, str(args.file), cores)
                one["events_per_s"] = one["events"] / one["seconds"]
                alone.append(one)
                print(f"run {r + 1}: stream job {got['events_per_s']:,.0f} events/s, auc "
                      f"{got['auc']:.4f}, lag {got['lag']}, twice {got['twice']}; one process "
                      f"{one['events_per_s']:,.0f} events/s, auc "
                      f"{one['progressive_auc']:.4f}", flush=True)
        finally:
            nats.close()

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(x[key] for x in rows)

    shown = ", ".join(f"{k}={v}" for k, v in settings.items()) or "as the job says"
    d_rate, a_rate = med(dist, "events_per_s"), med(alone, "events_per_s")
    d_auc, a_auc = med(dist, "auc"), med(alone, "progressive_auc")
    print()
    print("| | events/s | progressive AUC | log loss | lag at end |")
    print("|---|---|---|---|---|")
    print(f"| stream job ({shown}) | {d_rate:,.0f} | {d_auc:.4f} | {med(dist, 'logloss'):.4f} "
          f"| {med(dist, 'lag'):.0f} events |")
    print(f"| one process, test-then-train ({cores} threads) | {a_rate:,.0f} | {a_auc:.4f} | "
          f"{med(alone, 'progressive_logloss'):.4f} | - |")
    print(f"\nstream job / one process: {d_rate / a_rate:.2f}x events/s, AUC "
          f"{d_auc - a_auc:+.4f}")

if __name__ == "__main__":
    main()
