#!/usr/bin/env python
"""A stream job against the one process that trains the same events, test-then-train.

Publishes ``--file``'s rows as JSON events (``--per-message`` a message) to a local
``nats-server -js``, then runs the stream job ``--job`` over them, every role its own process
over loopback TCP, until every event is trained; and trains the same events in the same order
in one process (``zbus-reference --events``: ``roles.tools.stream_reference``), the comparator
a user would pick; and runs the same job over the same rows read from the file (one epoch):
what the stream costs against a file. Each ``--repeats`` times; the table gives medians:
events a second while training (the feeders' pass), the progressive AUC and log loss, the lag
at the end, and the ratios. Defaults: UCI Adult's 48,842 rows (``jobs/adult_stream.toml``:
2 workers, 2 shards, batch 256, sync step).

``--labels``: the impressions without their label, and the labels as events of their own on a
second subject (published just after each block of impressions), joined by the job's feeder
(``[stream.labels]``, a window of 10 s): what the join costs against the same job's labels in
the events (run both, and compare the ratios to the file job, each paired in its run).

    .venv/bin/python scripts/bench_stream.py [--repeats 3] [--job jobs/adult_stream.toml]
        [--file data/adult.csv.gz] [--per-message 100] [--labels] [--set train__sync=every ...]
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
LABELS = "bench.labels"


def run_job(workdir: Path, job: Path, url: str, events: int, settings: dict) -> dict:
    with LocalCluster(workdir, job, transport="tcp", stream__url=url, stream__topic=TOPIC,
                      stream__group=workdir.name.replace("-", "_"),
                      train__until_events=events, **settings) as c:
        if c.run_job(timeout=1800) != 0:
            raise SystemExit(f"the stream job failed:\n{c.logs()}")
        s = c.summary()
    st = s["stream"]
    assert st is not None
    if st["join"] is not None:
        print(f"  the join: {st['join']}", flush=True)
    train_s = s["per_epoch"][0]["train_s"]
    return {"events": st["events_trained"], "twice": st["events_trained_twice"],
            "events_per_s": st["events_trained"] / train_s, "wall_s": s["wall_s"],
            "auc": st["progressive_auc"], "logloss": st["progressive_logloss"],
            "lag": st["lag_events"], "windows": st["windows"]}


def run_file_job(workdir: Path, job: Path, path: Path, settings: dict) -> dict:
    """The same job over the same rows read from the file: one epoch, the stream job's sync
    mode (step unless ``--set train__sync=...``), the smallest eval split (1 %)."""
    settings = {"train__sync": "step", **settings}   # (a stream job's default; a file's: every)
    with LocalCluster(workdir, job, transport="tcp", stream__url="", data__path=str(path),
                      data__eval_fraction=0.01, train__until_events=0, train__epochs=1,
                      **settings) as c:
        if c.run_job(timeout=1800) != 0:
            raise SystemExit(f"the file job failed:\n{c.logs()}")
        s = c.summary()
    epoch = s["per_epoch"][0]
    return {"events": s["samples_trained"],
            "events_per_s": s["samples_trained"] / epoch["train_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job", type=Path, default=REPO / "jobs" / "adult_stream.toml")
    parser.add_argument("--file", type=Path, default=REPO / "data" / "adult.csv.gz")
    parser.add_argument("--per-message", type=int, default=100)
    parser.add_argument("--labels", action="store_true",
                        help="labels on a subject of their own, joined by the feeder")
    parser.add_argument("--set", action="append", default=[], type=setting_pair,
                        metavar="SECTION__KEY=VALUE", help="a job setting for the stream job "
                        "(and the one process: the same network and learning rates)")
    args = parser.parse_args()
    settings = dict(args.set)
    job = load_job(str(args.job), environ={f"ZBUS_{k.upper()}": v for k, v in args.set})
    if args.labels:
        settings.update(stream__labels__topic=LABELS, stream__labels__window_s=10.0)
    cores = os.cpu_count() or 1
    dist, alone, files = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        nats = NatsServer(Path(tmp) / "nats")
        try:
            out = open_publisher(nats.url, TOPIC)
            labels = open_publisher(nats.url, LABELS) if args.labels else None
            try:
                events, messages, _ = replay(args.file, out, per_message=args.per_message,
                                             labels=labels, label=job.data.label)
            finally:
                out.close()
                if labels is not None:
                    labels.close()
            print(f"{events} events in {messages} messages on {nats.url}", flush=True)
            for r in range(args.repeats):
                got = run_job(Path(tmp) / f"job-{r}", args.job, nats.url, events, settings)
                dist.append(got)
                files.append(run_file_job(Path(tmp) / f"file-{r}", args.job, args.file,
                                          settings))
                one = score_then_train(job, str(args.file), cores)
                one["events_per_s"] = one["events"] / one["seconds"]
                alone.append(one)
                print(f"run {r + 1}: stream job {got['events_per_s']:,.0f} events/s, auc "
                      f"{got['auc']:.4f}, lag {got['lag']}, twice {got['twice']}; from the file "
                      f"{files[-1]['events_per_s']:,.0f} samples/s; one process "
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
    f_rate = med(files, "events_per_s")
    paired = statistics.median(d["events_per_s"] / f["events_per_s"]
                               for d, f in zip(dist, files, strict=True))
    print(f"| the same job over the file (1 epoch) | {f_rate:,.0f} | - | - | - |")
    print(f"| one process, test-then-train ({cores} threads) | {a_rate:,.0f} | {a_auc:.4f} | "
          f"{med(alone, 'progressive_logloss'):.4f} | - |")
    print(f"\nstream job / one process: {d_rate / a_rate:.2f}x events/s, AUC "
          f"{d_auc - a_auc:+.4f}; stream job / the same job over the file: {paired:.2f}x "
          "(paired)")

if __name__ == "__main__":
    main()
