"""``zbus-replay FILE --to URL --topic T``: a data file's rows published as JSON events, in file
order, to NATS JetStream or Kafka: what a stream job (``[stream]``) trains on, from data a user
already has.

Each row becomes one JSON object keyed by column name (a text file's values as text, as the
file holds them, so a stream job decodes them exactly as it would read the file; a Parquet
file's typed), with an id (``--id-field``, default ``event_id``: the row's number from 0,
unless the file has that column); ``--per-message K`` events go in one message, one per line.
``--rate N`` paces it to N events per second (default: as fast as the broker takes them).

``--synthetic ROWS`` publishes the built-in generator's rows instead of a file's (columns
``label``, ``I1``-``I4``, ``C1``-``C8``, ``ts``; ``--drift`` radians a day turns its planted
model, ``--days`` spreads ``ts`` over that many days): what ``jobs/online.toml`` trains on.

``--labels-topic L --label COLUMN --label-delay-s D``: impressions without their label on the
topic, and each label as its own event (``{id: ..., COLUMN: value}``) on ``L``, D seconds after
its impression: the late labels a stream job's join (``[stream.labels]``) waits for.

The file is read in blocks (memory does not grow with it); the labels waiting for their time
are rate x delay at most. Every message is on the broker when the command returns (JetStream's
PubAck, Kafka's delivery report). Exits 0, or 2 with one line: a file that cannot be read, a
broker that cannot be reached or refuses.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from roles.data.synthetic import BLOCK_ROWS, Generator, SyntheticBlock
from roles.events import BrokerError
from roles.events.publish import Publisher, open_publisher

BLOCK_BYTES = 1 << 20
SYNTHETIC_VOCAB = [10, 20, 50, 100, 200, 500, 1000, 2000]   # the built-in job's fields
SYNTHETIC_DENSE = 4


class ReplayError(Exception):
    """What stops a replay: one line."""


def _text_format(path: Path) -> str | None:
    name = path.name.removesuffix(".gz")
    for ext, fmt in ((".csv", ","), (".tsv", "\t"), (".txt", "\t")):
        if name.endswith(ext):
            return fmt
    return None


def rows(path: Path) -> Iterator[list[dict[str, object]]]:
    """The file's rows, a block at a time, each a dict keyed by column name."""
    if not path.is_file():
        raise ReplayError(f"{path}: no such file")
    if path.name.endswith(".parquet"):
        try:
            source = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ReplayError(f"{path}: not a Parquet file ({exc})") from None
        for batch in source.iter_batches(batch_size=8192):
            yield batch.to_pylist()
        return
    sep = _text_format(path)
    if sep is None:
        raise ReplayError(f"{path}: a .csv, .tsv (optionally .gz) or .parquet file is "
                          "replayed")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            header = f.readline().rstrip("\r\n").split(sep)
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: {exc}") from None
    if sep == ",":
        header = [h.strip().strip('"') for h in header]
    try:
        reader = pacsv.open_csv(
            path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=sep),
            convert_options=pacsv.ConvertOptions(
                column_types={h: pa.string() for h in header}, strings_can_be_null=False,
                quoted_strings_can_be_null=False))
        for batch in reader:
            yield batch.to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ReplayError(f"{path}: {str(exc).splitlines()[0]}") from None


class Pace:
    """Sleeps so that ``rate`` events a second leave (0: no pacing)."""

    def __init__(self, rate: float):
        self.rate, self.started, self.sent = rate, time.monotonic(), 0

    def __call__(self, events: int) -> None:
        self.sent += events
        if self.rate > 0:
            ahead = self.sent / self.rate - (time.monotonic() - self.started)
            if ahead > 0:
                time.sleep(ahead)


def synthetic_table(block: SyntheticBlock) -> pa.Table:
    """A generated block as columns: label, I1.., C1.., ts."""
    columns = {"label": pa.array(block.labels.astype(np.int8))}
    for j in range(SYNTHETIC_DENSE):
        columns[f"I{j + 1}"] = pa.array(np.nan_to_num(block.dense[:, j]))
    for f in range(len(SYNTHETIC_VOCAB)):
        columns[f"C{f + 1}"] = pa.array(block.values[:, f])
    columns["ts"] = pa.array(block.timestamps)
    return pa.table(columns)


def synthetic_generator(rows: int, drift: float = 0.0, days: int = 30,
                        seed: int = 1) -> Generator:
    return Generator(rows, SYNTHETIC_VOCAB, SYNTHETIC_DENSE, 1.1, 0.6, days, seed, drift=drift)


def synthetic_rows(rows: int, drift: float = 0.0, days: int = 30,
                   seed: int = 1) -> Iterator[list[dict[str, object]]]:
    """The built-in generator's rows, a block at a time."""
    gen = synthetic_generator(rows, drift, days, seed)
    for b in range(-(-rows // BLOCK_ROWS)):
        yield synthetic_table(gen.block(b)).to_pylist()


def replay(path: Path | Iterable[list[dict[str, object]]], out: Publisher,
           per_message: int = 1, rate: float = 0.0,
           id_field: str = "event_id", labels: Publisher | None = None, label: str = "",
           label_delay_s: float = 0.0, first_id: int = 0) -> tuple[int, int, int]:
    """Publishes the file's rows, a row without ``id_field`` numbered from ``first_id``;
    (events, messages, labels) sent."""
    pace = Pace(rate)
    waiting: collections.deque[tuple[float, bytes]] = collections.deque()  # due, label event
    events = messages = labels_sent = 0
    pending: list[bytes] = []

    def send_due(now: float) -> None:
        nonlocal labels_sent
        due = []
        while waiting and waiting[0][0] <= now:
            due.append(waiting.popleft()[1])
        if due and labels is not None:
            labels.publish(due)
            labels_sent += len(due)

    def flush(batch: list[bytes]) -> None:
        nonlocal messages
        payloads = [b"\n".join(batch[i:i + per_message])
                    for i in range(0, len(batch), per_message)]
        out.publish(payloads)
        messages += len(payloads)
        pace(len(batch))
        send_due(time.monotonic())

    for block in rows(path) if isinstance(path, Path) else path:
        for row in block:
            row.setdefault(id_field, first_id + events)
            if labels is not None:
                if label not in row:
                    raise ReplayError(f"{path if isinstance(path, Path) else 'the rows'}: "
                                      f"no column {label!r} (--label)")
                value = row.pop(label)
                waiting.append((time.monotonic() + label_delay_s,
                                orjson.dumps({id_field: row[id_field], label: value})))
            pending.append(orjson.dumps(row))
            events += 1
            if len(pending) >= per_message * 64:
                flush(pending)
                pending = []
    if pending:
        flush(pending)
    while waiting:   # the last labels, each at its time
        time.sleep(max(0.0, min(waiting[0][0] - time.monotonic(), 0.5)))
        send_due(time.monotonic())
    return events, messages, labels_sent


def opened(url: str, topic: str, wait_s: float) -> Publisher:
    """A publisher, the broker tried again every 0.2 s for ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_publisher(url, topic)
        except BrokerError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="zbus-replay", description=__doc__.split("\n\n")[0])
    p.add_argument("file", type=Path, nargs="?", help="a .csv, .tsv (optionally .gz) or "
                   ".parquet file (or --synthetic)")
    p.add_argument("--synthetic", type=int, metavar="ROWS",
                   help="the built-in generator's rows instead of a file's")
    p.add_argument("--drift", type=float, default=0.0,
                   help="with --synthetic: radians a day the planted model turns")
    p.add_argument("--days", type=int, default=30, help="with --synthetic: days of event time")
    p.add_argument("--seed", type=int, default=1, help="with --synthetic")
    p.add_argument("--wait-s", type=float, default=0.0,
                   help="try the broker again this long while it cannot be reached (a broker "
                        "started beside this command)")
    p.add_argument("--to", required=True, help="nats://host:port or kafka://host:port")
    p.add_argument("--topic", required=True, help="the JetStream subject or Kafka topic")
    p.add_argument("--per-message", type=int, default=1, help="events in one message")
    p.add_argument("--rate", type=float, default=0.0, help="events a second (0: no pacing)")
    p.add_argument("--id-field", default="event_id")
    p.add_argument("--first-id", type=int, default=0,
                   help="number the rows without an id from this one (a file replayed in parts)")
    p.add_argument("--labels-topic", default="")
    p.add_argument("--label", default="", help="the label column (with --labels-topic)")
    p.add_argument("--label-delay-s", type=float, default=0.0)
    a = p.parse_args(argv)
    if a.per_message < 1:
        p.error("--per-message must be at least 1")
    if (a.file is None) == (a.synthetic is None):
        p.error("give a FILE or --synthetic ROWS (one of them)")
    if a.synthetic is not None and a.synthetic < 1:
        p.error("--synthetic takes at least 1 row")
    if bool(a.labels_topic) != bool(a.label):
        p.error("--labels-topic and --label go together")
    out = labels = None
    started = time.monotonic()
    try:
        out = opened(a.to, a.topic, a.wait_s)
        if a.labels_topic:
            labels = open_publisher(a.to, a.labels_topic)
        source = a.file if a.file is not None else synthetic_rows(a.synthetic, a.drift, a.days,
                                                                  a.seed)
        events, messages, label_events = replay(
            source, out, a.per_message, a.rate, a.id_field, labels, a.label, a.label_delay_s,
            a.first_id)
    except (ReplayError, BrokerError) as exc:
        print(f"zbus-replay: {exc}", file=sys.stderr)
        return 2
    finally:
        for publisher in (out, labels):
            if publisher is not None:
                publisher.close()
    took = time.monotonic() - started
    line = (f"zbus-replay: {events:,} events in {messages:,} messages to {a.to} {a.topic} in "
            f"{took:.1f} s ({events / max(took, 1e-9):,.0f} events/s)")
    if labels is not None:
        line += f"; {label_events:,} labels to {a.labels_topic}, {a.label_delay_s:g} s later"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
