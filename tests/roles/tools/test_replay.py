"""``zbus-replay`` (``roles.tools.replay``): a file's rows on a real nats-server and on
librdkafka's mock cluster as JSON events, in file order, each with its id, several a message;
labels on their own topic, later; a stream job's decoder reads back the rows the file holds."""

from __future__ import annotations

import gzip

import orjson
import pytest

from roles.data.readers import Schema
from roles.events import open_consumer
from roles.events.decode import EventDecoder
from roles.testbed.consuming import drain
from roles.tools import replay

ROWS = [f"{i % 2},{20 + i},city{i % 3},t{i % 5}|u" for i in range(25)]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "rows.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("y,age,city,tags\n" + "".join(r + "\n" for r in ROWS))
    return path


@pytest.mark.integration
def test_a_files_rows_reach_nats_in_order_several_a_message_and_decode_as_the_file(
        nats, data, capsys):
    assert replay.main([str(data), "--to", nats.url, "--topic", "clicks",
                        "--per-message", "10"]) == 0
    assert "25 events in 3 messages" in capsys.readouterr().out
    consumer = open_consumer(nats.url, "clicks", "reader")
    try:
        got = drain(consumer, 3)
        consumer.done(got)
    finally:
        consumer.close()
    events = [orjson.loads(line) for d in got for line in d.payload.splitlines()]
    assert [e["event_id"] for e in events] == list(range(25))
    assert events[3] == {"y": "1", "age": "23", "city": "city0", "tags": "t3|u",
                         "event_id": 3}
    schema = Schema(label="y", dense=["age"], sparse=["city", "tags"], lists={"tags": "|"})
    decoded = EventDecoder(schema, "json", "clicks").decode(got)
    assert decoded.events == 25 and decoded.rejected == []
    assert decoded.block.dense[:, 0].tolist() == [20.0 + i for i in range(25)]


@pytest.mark.integration
def test_labels_go_on_their_own_topic_after_their_impressions(nats, data, capsys):
    assert replay.main([str(data), "--to", nats.url, "--topic", "impressions",
                        "--labels-topic", "labels", "--label", "y",
                        "--label-delay-s", "0.5"]) == 0
    assert "25 labels to labels, 0.5 s later" in capsys.readouterr().out
    impressions = open_consumer(nats.url, "impressions", "a")
    labels = open_consumer(nats.url, "labels", "a")
    try:
        seen = drain(impressions, 25)
        told = drain(labels, 25)
    finally:
        impressions.close()
        labels.close()
    assert all("y" not in orjson.loads(d.payload) for d in seen)
    assert [orjson.loads(d.payload) for d in told] == [
        {"event_id": i, "y": str(i % 2)} for i in range(25)]
    # each label is published at least the delay after its impression (the broker's clock)
    assert all(t.time_s - s.time_s >= 0.45 for s, t in zip(seen, told, strict=True))


@pytest.mark.integration
def test_a_files_rows_reach_kafka_in_order(data, capsys):
    from roles.testbed.kafka_mock import MockKafka
    kafka = MockKafka()
    try:
        assert replay.main([str(data), "--to", kafka.url, "--topic", "clicks",
                            "--per-message", "5"]) == 0
        consumer = open_consumer(kafka.url, "clicks", "reader")
        try:
            got = drain(consumer, 5)
        finally:
            consumer.close()
    finally:
        kafka.close()
    # a topic's partitions each keep their order; the producer sends a key-less topic's
    # messages partition by partition, so the ids within each partition rise
    ids = {}
    for d in got:
        ids.setdefault(d.partition, []).extend(orjson.loads(x)["event_id"]
                                               for x in d.payload.splitlines())
    assert sorted(i for part in ids.values() for i in part) == list(range(25))
    assert all(part == sorted(part) for part in ids.values())


def test_what_cannot_be_replayed_is_one_line(tmp_path, capsys):
    assert replay.main([str(tmp_path / "none.csv"), "--to", "nats://127.0.0.1:1",
                        "--topic", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zbus-replay: NATS at nats://127.0.0.1:1")
    bad = tmp_path / "rows.json"
    bad.write_text("{}")
    with pytest.raises(replay.ReplayError, match="a .csv, .tsv"):
        next(replay.rows(bad))
    with pytest.raises(replay.ReplayError, match="no such file"):
        next(replay.rows(tmp_path / "none.csv"))
    for argv in ([], [str(bad), "--synthetic", "10"], ["--synthetic", "0"]):
        with pytest.raises(SystemExit) as exit_:
            replay.main([*argv, "--to", "nats://127.0.0.1:1", "--topic", "x"])
        assert exit_.value.code == 2, argv


def test_the_synthetic_rows_are_the_generator_s_in_blocks():
    blocks = list(replay.synthetic_rows(70_000, drift=0.1, days=3))
    rows = [r for b in blocks for r in b]
    assert len(rows) == 70_000 and len(blocks) > 1
    assert set(rows[0]) == {"label", "ts", *(f"I{j}" for j in range(1, 5)),
                            *(f"C{f}" for f in range(1, 9))}
    assert {r["label"] for r in rows} == {0, 1}
    assert rows == [r for b in replay.synthetic_rows(70_000, drift=0.1, days=3) for r in b]
