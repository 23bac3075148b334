#!/usr/bin/env python
"""Progressive validation on a drifting stream: a stream job's AUC window by window against
the oracle's, against the same network frozen after warm-up, and against one process.

Generates ``--rows`` rows of the built-in job's synthetic data with ``[data.synthetic] drift``
(``--drift`` radians a day over ``--days`` days: the planted weights turn with event time, so
the best model changes as the stream goes; ``roles/data/synthetic.py``) to a CSV file in event
time order, keeping each window's oracle AUC (the true probabilities of its ``--window``
events: the best any model can score there); publishes them as JSON events (``--per-message``
a message) to a local ``nats-server -js``; runs the stream job over them, every role its own
process over loopback TCP, until every event is trained; then, in this process, trains the same
events test-then-train (``zbus-reference --events``), and the same again frozen after the first
``--freeze-after`` events (a model that stops learning). Prints each window's AUC for the four,
and the medians, over the windows after the freeze, of each one's gap to the oracle.

    .venv/bin/python scripts/bench_drift.py [--rows 1000000] [--drift 0.1] [--days 30]
        [--window 10000] [--freeze-after 20000] [--per-message 100]

The stream job's windows close in the order its batches are acknowledged (batches of two
workers), the oracle's and the one process's in file order: the same events but for a batch
or two at each edge.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stream import TOPIC, run_job  # noqa: E402  (scripts/ beside this one)

from roles.algorithms.shared.metrics import auc  # noqa: E402
from roles.data.synthetic import BLOCK_ROWS  # noqa: E402
from roles.events.publish import open_publisher  # noqa: E402
from roles.job.settings import load_job  # noqa: E402
from roles.testbed.nats_server import NatsServer  # noqa: E402
from roles.tools.replay import (  # noqa: E402
    SYNTHETIC_DENSE,
    SYNTHETIC_VOCAB,
    replay,
    synthetic_generator,
    synthetic_table,
)
from roles.tools.stream_reference import score_then_train  # noqa: E402

VOCAB, DENSE = SYNTHETIC_VOCAB, SYNTHETIC_DENSE


def job_text(topic: str, window: int, timestamp: bool = True) -> str:
    """The stream job over those columns (without ``timestamp``: an event's time is its
    message's, the broker's)."""
    text = JOB.format(dense=", ".join(f'"I{j + 1}"' for j in range(DENSE)),
                      sparse=", ".join(f'"C{f + 1}"' for f in range(len(VOCAB))),
                      topic=topic, window=window)
    return text if timestamp else text.replace('timestamp = "ts"\n', "")


def write_drifting(path: Path, rows: int, drift: float, days: int, window: int,
                   seed: int = 1) -> list[float]:
    """The rows to ``path`` (CSV, a header); each whole window's oracle AUC."""
    gen = synthetic_generator(rows, drift, days, seed)
    oracle: list[float] = []
    labels: list[np.ndarray] = []
    probs: list[np.ndarray] = []
    held = 0
    with open(path, "wb") as sink:
        for b in range(-(-rows // BLOCK_ROWS)):
            block = gen.block(b)
            pacsv.write_csv(synthetic_table(block), sink,
                            pacsv.WriteOptions(include_header=b == 0, quoting_style="none"))
            labels.append(block.labels)
            probs.append(block.probs)
            held += len(block.labels)
            while held >= window:   # whole windows only, as the job closes them
                y, p = np.concatenate(labels), np.concatenate(probs)
                oracle.append(auc(y[:window], p[:window]))
                labels, probs, held = [y[window:]], [p[window:]], held - window
    return oracle


JOB = """name = "drift"
[data]
format = "csv"
label = "label"
positive = ["1"]
negative = ["0"]
dense = [{dense}]
sparse = [{sparse}]
timestamp = "ts"
[stream]
url = "nats://127.0.0.1:4222"
topic = "{topic}"
format = "json"
window_events = {window}
warmup_events = 2000
[model]
embedding_dim = 16
hidden = [128, 64]
[train]
batch_size = 256
[cluster]
workers = 2
shards = 2
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--drift", type=float, default=0.1, help="radians a day")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--window", type=int, default=10_000)
    parser.add_argument("--freeze-after", type=int, default=20_000)
    parser.add_argument("--per-message", type=int, default=100)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-drift-") as tmp:
        data, job_file = Path(tmp) / "drift.csv", Path(tmp) / "drift.toml"
        oracle = write_drifting(data, args.rows, args.drift, args.days, args.window)
        job_file.write_text(job_text(TOPIC, args.window))
        job = load_job(str(job_file), environ={})
        nats = NatsServer(Path(tmp) / "nats")
        try:
            out = open_publisher(nats.url, TOPIC)
            try:
                events, messages, _ = replay(data, out, per_message=args.per_message)
            finally:
                out.close()
            print(f"{events} events in {messages} messages on {nats.url}", flush=True)
            got = run_job(Path(tmp) / "job", job_file, nats.url, events, {})
        finally:
            nats.close()
        one = score_then_train(job, str(data), cores)
        frozen = score_then_train(job, str(data), cores, freeze_after=args.freeze_after)
    stream = [w["auc"] for w in got["windows"]]
    alone = [w["auc"] for w in one["windows"]]
    still = [w["auc"] for w in frozen["windows"]]
    n = min(len(oracle), len(stream), len(alone), len(still))
    print(f"\n{got['events']} events trained by the stream job ({got['twice']} twice), "
          f"{got['events_per_s']:,.0f} events/s, lag at the end {got['lag']}; drift "
          f"{args.drift} rad/day over {args.days} days: weights {args.drift * args.days:.1f} rad "
          f"apart from first to last event")
    print("\n| window | oracle | stream job | one process | frozen after "
          f"{args.freeze_after:,} |")
    print("|---|---|---|---|---|")
    for i in range(n):
        print(f"| {i} | {oracle[i]:.4f} | {stream[i]:.4f} | {alone[i]:.4f} | {still[i]:.4f} |")
    after = range(-(-args.freeze_after // args.window), n)

    def gap(aucs: list[float]) -> float:
        return statistics.median(aucs[i] - oracle[i] for i in after)

    print(f"\nmedian gap to the oracle over windows {after.start}-{n - 1}: stream job "
          f"{gap(stream):+.4f}, one process {gap(alone):+.4f}, frozen {gap(still):+.4f}")


if __name__ == "__main__":
    main()
