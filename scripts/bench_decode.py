#!/usr/bin/env python
"""A stream feeder's reader alone: messages fetched from a local ``nats-server -js`` and decoded
into rows of the job's schema (``roles.events.reader.EventReader``), with JSON batches parsed
whole by Arrow (``roles.events.json_block``, the default) against event by event with orjson
(the path a batch that Arrow cannot read exactly takes), in one run.

Publishes ``--file``'s rows as JSON events (``--per-message`` a message, as ``zbus-replay``
does: every value as the file's text, the event id a number), then reads them all
``--repeats`` times with each path, each time with a new durable consumer; and decodes the same
messages in memory, without the broker, 100 messages a call. Prints medians (events/s).

    .venv/bin/python scripts/bench_decode.py [--file data/adult.csv.gz] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.data.readers import Schema
from roles.events import Delivery, open_consumer
from roles.events.decode import Decoded, EventDecoder
from roles.events.publish import open_publisher
from roles.events.reader import EventReader
from roles.job.settings import Job, load_job
from roles.testbed.nats_server import NatsServer
from roles.tools.replay import replay

REPO = Path(__file__).resolve().parent.parent
TOPIC = "bench.decode"


class EventByEvent(EventDecoder):
    """The decoder with the batch path declined, as for a batch Arrow cannot read exactly."""

    def _decode_table(self, deliveries: list[Delivery]) -> Decoded | None:
        return None


def schema_of(job: Job) -> Schema:
    d = job.data
    return Schema(label=job.tasks[0], dense=job.dense_fields, sparse=job.sparse_fields,
                  positive=tuple(d.positive), negative=tuple(d.negative),
                  timestamp=d.timestamp, lists=job.list_fields)


def read_all(url: str, group: str, decoder: EventDecoder, events: int) -> tuple[float, list]:
    """Seconds to read and decode ``events`` events, and the messages read."""
    consumer = open_consumer(url, TOPIC, group, "earliest")
    reader = EventReader(consumer, decoder, max_messages=1000, fetch_messages=100)
    got, kept = 0, []
    started = time.perf_counter()
    try:
        while got < events:
            taken = reader.take()
            if not taken:
                time.sleep(0.001)
            for deliveries, decoded in taken:
                got += decoded.events
                kept.extend(deliveries)
                reader.done(deliveries)
        return time.perf_counter() - started, kept
    finally:
        reader.shut("the bench's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, default=REPO / "jobs" / "adult_stream.toml")
    parser.add_argument("--file", type=Path, default=REPO / "data" / "adult.csv.gz")
    parser.add_argument("--per-message", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    schema = schema_of(load_job(str(args.job), environ={}))
    paths = {"batch (Arrow)": EventDecoder(schema, "json", TOPIC),
             "event by event (orjson)": EventByEvent(schema, "json", TOPIC)}
    broker: dict[str, list[float]] = {name: [] for name in paths}
    memory: dict[str, list[float]] = {name: [] for name in paths}
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        nats = NatsServer(Path(tmp) / "nats")
        try:
            out = open_publisher(nats.url, TOPIC)
            try:
                events, messages, _ = replay(args.file, out, per_message=args.per_message)
            finally:
                out.close()
            print(f"{events:,} events in {messages:,} messages; {cpu_name()}", flush=True)
            kept: list[Delivery] = []
            for r in range(args.repeats):
                for name, decoder in paths.items():
                    seconds, kept = read_all(nats.url, f"g{r}_{len(broker[name])}_"
                                             f"{name.split()[0]}", decoder, events)
                    broker[name].append(events / seconds)
                    started = time.perf_counter()
                    for i in range(0, len(kept), 100):
                        decoder.decode(kept[i:i + 100])
                    memory[name].append(events / (time.perf_counter() - started))
                print(f"run {r + 1}: " + ", ".join(f"{n} {broker[n][-1]:,.0f} events/s"
                                                   for n in paths), flush=True)
        finally:
            nats.close()
    print("\n| decoding | from the broker (events/s) | in memory (events/s) |\n|---|---|---|")
    for name in paths:
        print(f"| {name} | {statistics.median(broker[name]):,.0f} | "
              f"{statistics.median(memory[name]):,.0f} |")
    fast, slow = paths

    def ratio(rates: dict[str, list[float]]) -> float:
        return statistics.median(rates[fast]) / statistics.median(rates[slow])

    print(f"\nbatch / event by event: {ratio(broker):.2f}x from the broker, {ratio(memory):.2f}x "
          "in memory")


if __name__ == "__main__":
    main()
