"""A stream's messages as rows of the job's schema (``roles.events.decode``): the same values as
the same rows read from a file, every malformed event set aside with its message and line."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roles.data.readers import Schema
from roles.events import Delivery
from roles.events.decode import EventDecoder

SCHEMA = Schema(label="y", dense=["age", "hours"], sparse=["city", "tags"], timestamp="t",
                lists={"tags": "|"})
COLUMNS = ["y", "age", "hours", "city", "tags", "t"]
ROWS = [  # as a file holds them
    ["1", "39", "40", "Paris", "a|b", "1700000000"],
    ["0", "", "12.5", "Lyon", "", "1700000060"],
    ["1", "50", "?", "", "c", "1700000120"],
    ["0", "7", "3", "Nice", "a|c|d", "1700000180"],
]


def message(position: int, *events: bytes, partition: int = 0, time_s: float = 5.0) -> Delivery:
    return Delivery(partition, position, b"\n".join(events) + b"\n", time_s)


def as_json(row: list[str]) -> bytes:
    return orjson.dumps(dict(zip(COLUMNS, row, strict=True)))


def columns(block) -> dict[str, list]:
    return {"labels": block.labels.tolist(), "dense": np.nan_to_num(block.dense, nan=-1).tolist(),
            "sparse": [pa.chunked_array([c]).combine_chunks().to_pylist()
                       if isinstance(c, pa.Array) else c.combine_chunks().to_pylist()
                       for c in block.sparse],
            "timestamps": block.timestamps.tolist()}


@pytest.mark.parametrize("fmt", ["json", "tsv", "csv"])
def test_events_decode_to_what_the_same_rows_read_from_a_file_give(fmt):
    decoder = EventDecoder(SCHEMA, fmt, "clicks", COLUMNS)
    encode = {"json": as_json, "tsv": lambda r: "\t".join(r).encode(),
              "csv": lambda r: ",".join(r).encode()}[fmt]
    got = decoder.decode([message(7, *map(encode, ROWS[:3])), message(8, encode(ROWS[3]))])
    assert got.events == 4 and got.rejected == []
    assert got.message.tolist() == [0, 0, 0, 1] and got.line.tolist() == [0, 1, 2, 0]
    assert got.event_time_s.tolist() == [1700000000.0, 1700000060.0, 1700000120.0,
                                         1700000180.0]
    c = columns(got.block)
    assert c["labels"] == [1.0, 0.0, 1.0, 0.0]
    assert c["dense"] == [[39.0, 40.0], [-1.0, 12.5], [50.0, -1.0], [7.0, 3.0]]
    assert c["sparse"][0] == ["Paris", "Lyon", "", "Nice"]   # empty: missing, as a null
    assert c["sparse"][1] == [["a", "b"], [], ["c"], ["a", "c", "d"]]


def test_json_values_typed_or_as_text_lists_as_arrays_and_missing_keys_are_missing():
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    events = [orjson.dumps({"y": True, "age": 39, "hours": 40.5, "city": "Paris",
                            "tags": ["a", 12], "t": 1700000000, "other": {"x": 1}}),
              orjson.dumps({"y": 0, "city": None, "tags": "b|c", "t": "2023-11-14T22:13:20"})]
    got = decoder.decode([message(1, *events)])
    assert got.rejected == []
    c = columns(got.block)
    assert c["labels"] == [1.0, 0.0]
    assert c["dense"] == [[39.0, 40.5], [-1.0, -1.0]]
    assert c["sparse"] == [["Paris", None], [["a", "12"], ["b", "c"]]]
    assert c["timestamps"] == [1700000000, 1700000000]


def test_without_a_timestamp_column_an_event_is_as_old_as_its_message():
    schema = Schema(label="y", dense=["age"], sparse=["city"])
    decoder = EventDecoder(schema, "json", "clicks")
    got = decoder.decode([message(1, b'{"y": 1, "age": 3, "city": "a"}', time_s=10.5),
                          message(2, b'{"y": 0, "age": 4, "city": "b"}', time_s=11.0)])
    assert got.event_time_s.tolist() == [10.5, 11.0] and got.block.timestamps is None


def test_malformed_events_are_set_aside_with_their_message_and_line_and_the_rest_kept():
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    good = as_json(ROWS[0])
    got = decoder.decode([
        message(40, good, b'{"y": 1, "age": "old"}', b"[1, 2]", good, partition=3),
        message(41, b'{"y": 1', good, b'{"y": 1, "city": {"a": 1}}', b'\xff\xfe', partition=3),
        message(42, b'{"y": 2.5e400, "age": 1}', b'{"age": 1, "tags": [null]}', partition=3)])
    assert got.events == 10 and len(got.block) == 3
    assert [(r.file, r.line) for r in got.rejected] == [
        ("clicks[3]@40", 2), ("clicks[3]@40", 3), ("clicks[3]@41", 1), ("clicks[3]@41", 3),
        ("clicks[3]@41", 4), ("clicks[3]@42", 1), ("clicks[3]@42", 2)]
    reasons = [r.reason for r in got.rejected]
    assert reasons[0] == "column 'age': cannot parse 'old' as a number"
    assert reasons[1].startswith("a JSON list, not an object")
    assert reasons[2].startswith("not JSON")
    assert reasons[3] == "column 'city': a JSON dict where one value is expected"
    assert reasons[4].startswith("not JSON")
    assert reasons[5] == "not JSON (number is infinity when parsed as double)"
    assert reasons[6] == "column 'tags': a list of ids holds something else"
    assert got.message.tolist() == [0, 0, 1] and got.line.tolist() == [0, 3, 1]


def test_a_tsv_event_with_the_wrong_number_of_fields_is_named():
    decoder = EventDecoder(SCHEMA, "tsv", "clicks", COLUMNS)
    got = decoder.decode([message(5, b"1\t2\t3", "\t".join(ROWS[0]).encode())])
    (r,) = got.rejected
    assert (r.file, r.line, r.reason) == ("clicks[0]@5", 1, "3 fields, [stream] columns names 6")
    assert len(got.block) == 1


def test_a_text_format_needs_every_column_of_the_job_named():
    with pytest.raises(ValueError, match=r"\[stream\] columns lacks t"):
        EventDecoder(SCHEMA, "csv", "clicks", COLUMNS[:-1])
    with pytest.raises(ValueError, match="format must be one of json, tsv, csv"):
        EventDecoder(SCHEMA, "avro", "clicks")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.one_of(
    st.binary(max_size=60),
    st.dictionaries(st.sampled_from(COLUMNS + ["zz"]),
                    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                              st.floats(allow_nan=True), st.text(max_size=8),
                              st.lists(st.one_of(st.text(max_size=4), st.integers(0, 99)),
                                       max_size=3)),
                    max_size=7).map(orjson.dumps)), min_size=1, max_size=5),
    min_size=1, max_size=4))
def test_whatever_the_messages_hold_every_event_is_kept_or_set_aside_never_raised(messages):
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    deliveries = [Delivery(0, i, b"\n".join(e.replace(b"\n", b" ") for e in events), 1.0)
                  for i, events in enumerate(messages)]
    got = decoder.decode(deliveries)
    lines = sum(len([x for x in d.payload.split(b"\n") if x.strip()]) for d in deliveries)
    assert got.events == lines == len(got.block) + len(got.rejected)
    assert len(got.message) == len(got.line) == len(got.event_time_s) == len(got.block)
    assert all(r.file.startswith("clicks[0]@") and r.line >= 1 and r.reason
               for r in got.rejected)
