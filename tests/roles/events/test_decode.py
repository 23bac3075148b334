"""A stream's messages as rows of the job's schema (``roles.events.decode``): the same values as
the same rows read from a file, every malformed event set aside with its message and line."""

from __future__ import annotations

import json

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
            "timestamps": None if block.timestamps is None else block.timestamps.tolist()}


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


# -- the whole batch at once (roles.events.json_block) gives what event by event gives --------
def decoded(got) -> dict:
    b = got.block
    return {**columns(b), "labels": np.nan_to_num(b.labels, nan=-1).tolist(),
            "timestamps": None if b.timestamps is None else b.timestamps.tolist(),
            "weights": None if b.weights is None else b.weights.tolist(),
            "rows_read": b.rows_read, "bytes": b.bytes_read, "events": got.events,
            "rejected": [(r.file, r.line, r.reason, r.text) for r in got.rejected],
            "message": got.message.tolist(), "line": got.line.tolist(),
            "time": got.event_time_s.tolist(),
            "ids": None if got.ids is None else got.ids.tolist()}


def same_either_way(decoder: EventDecoder, deliveries: list[Delivery]) -> None:
    """The batch path, where it does not decline, and ``decode`` give what event by event
    gives."""
    fast = decoder._decode_table(deliveries)
    slow = decoded(decoder._decode_rows(deliveries))
    if fast is not None:
        assert decoded(fast) == slow
    assert decoded(decoder.decode(deliveries)) == slow


TYPED = [{"y": int(r[0]), "age": int(r[1]) if r[1] else None,
          "hours": float(r[2]) if r[2] not in ("", "?") else None, "city": r[3] or None,
          "tags": r[4].split("|") if r[4] else [], "t": int(r[5])} for r in ROWS]


@pytest.mark.parametrize("events", [[as_json(r) for r in ROWS], list(map(orjson.dumps, TYPED))],
                         ids=["as-text", "typed"])
def test_a_batch_of_well_formed_json_events_is_parsed_at_once_and_gives_the_same(events):
    """Not a vacuous equality below: the events a publisher sends, as a file's text or typed
    (numbers, nulls, lists as arrays), take the batch path."""
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    deliveries = [message(3, *events[:3]), message(4, events[3], time_s=6.0)]
    fast = decoder._decode_table(deliveries)
    assert fast is not None
    assert decoded(fast) == decoded(decoder._decode_rows(deliveries))
    assert decoded(fast)["sparse"][1] == [["a", "b"], [], ["c"], ["a", "c", "d"]]


ID_SCHEMA = Schema(label="y", dense=["age"], sparse=["city", "tags"], lists={"tags": "|"},
                   weight="w", positive=("yes",))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.floats(),
                    st.sampled_from(["", "?", "1", "0", "yes", "no", "1.0", "-3", " 7 ", "x|y",
                                     "1e5", "nan", "2023-11-14T22:13:20", "é"]),
                    st.text(max_size=5))
VALUES = st.one_of(SCALARS, st.lists(st.one_of(st.text(max_size=3), st.integers(0, 10**20),
                                               st.none()), max_size=3),
                   st.dictionaries(st.just("k"), st.integers(), max_size=1))


def dumps(event: dict) -> bytes:
    """As publishers write it: numbers past 64 bits too, and NaN as Python's json does."""
    return json.dumps(event, ensure_ascii=False).encode()


def json_events(keys: list[str]):
    row = st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys))
    # a column that keeps one type across the batch is what the batch path takes: lean on it
    same = st.fixed_dictionaries({k: st.sampled_from(["1", 2, 2.5, "a|b", ["a", 3], True])
                                  for k in keys})
    line = st.one_of(row.map(dumps), same.map(dumps),
                     st.sampled_from([b"[1]", b'{"y": NaN}', b"{", b'{"y": 1}\r', b"  ",
                                      b'{"y": 1, "y": 0}', b'{"y": "\xff"}', b'"x"']))
    return st.lists(st.lists(line, min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_events(COLUMNS + ["zz"]))
def test_the_batch_path_gives_what_event_by_event_gives_or_declines(messages):
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    deliveries = [Delivery(1, i, b"\n".join(events), 2.0 + i) for i, events in enumerate(messages)]
    same_either_way(decoder, deliveries)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_events(["y", "age", "city", "tags", "w", "id"]))
def test_with_text_labels_weights_and_ids_too(messages):
    decoder = EventDecoder(ID_SCHEMA, "json", "clicks", id_field="id")
    deliveries = [Delivery(0, i, b"\n".join(events), 1.0) for i, events in enumerate(messages)]
    same_either_way(decoder, deliveries)



KINDS = {"label": st.sampled_from([0, 1]), "flag": st.booleans(),
         "yes": st.sampled_from(["yes", "no"]),
         "int": st.integers(-2**63, 2**63 - 1), "small": st.integers(-5, 5),
         "float": st.floats(-1e6, 1e6), "half": st.sampled_from([0.5, 0.0, 2.5]),
         "number": st.sampled_from(["1", "-2", "3.5", " 7 ", "1e5", "?", ""]),
         "text": st.text("ab|,é1", max_size=4),
         "ids": st.lists(st.text("abé|", max_size=3), max_size=3),
         "numbers": st.lists(st.integers(0, 2**63 - 1), max_size=3),
         "time": st.integers(0, 4_000_000_000), "when": st.floats(0, 4e9)}
# the kinds each column may take in one batch: each batch picks one a column
PLAIN = {"y": ["label", "flag", "half", "number"], "age": ["small", "float", "number", "int"],
         "hours": ["half", "float", "number"], "city": ["text", "int", "small", "flag", "float"],
         "tags": ["ids", "numbers", "text"], "t": ["time", "when", "number"]}
WITH_IDS = {"y": ["yes", "label"], "age": ["small", "float"], "city": ["text", "int"],
            "tags": ["ids", "numbers", "text"], "w": ["half", "small", "number"],
            "id": ["int", "text", "small"]}

NEEDED = {"y", "t", "id", "w"}   # without one, the event is rejected


def uniform_events(kinds: dict[str, list[str]]):
    """Batches in which each column keeps one kind of value (or is missing or null): what
    publishers send, and what the batch path takes."""
    def batches(kind: dict[str, str]):
        value = {k: KINDS[v] if k in NEEDED else st.one_of(st.none(), KINDS[v])
                 for k, v in kind.items()}
        event = st.fixed_dictionaries({k: v for k, v in value.items() if k in NEEDED},
                                      optional={k: v for k, v in value.items()
                                                if k not in NEEDED}).map(dumps)
        return st.lists(st.lists(event, min_size=1, max_size=5), min_size=1, max_size=3)
    return st.fixed_dictionaries({k: st.sampled_from(v) for k, v in kinds.items()}
                                 ).flatmap(batches)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["plain", "ids"]).flatmap(
    lambda s: st.tuples(st.just(s), uniform_events(PLAIN if s == "plain" else WITH_IDS))))
def test_columns_of_one_kind_each_give_what_event_by_event_gives(case):
    schema, messages = case
    decoder = EventDecoder(SCHEMA, "json", "clicks") if schema == "plain" else \
        EventDecoder(ID_SCHEMA, "json", "clicks", id_field="id")
    deliveries = [Delivery(0, i, b"\n".join(events), 1.0) for i, events in enumerate(messages)]
    same_either_way(decoder, deliveries)


def test_a_first_line_that_is_not_an_object_never_reaches_arrow():
    """Arrow 26's JSON reader crashes the process (a segmentation fault) on a first line
    ``null``: the batch path declines any line that does not open an object, and the event
    by event path names it (a hypothesis test above found the crash)."""
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    deliveries = [message(1, b"null", b"null"), message(2, as_json(ROWS[0]))]
    assert decoder._decode_table(deliveries) is None
    got = decoder.decode(deliveries)
    assert [(r.file, r.line) for r in got.rejected] == [("clicks[0]@1", 1), ("clicks[0]@1", 2)]
    assert len(got.block) == 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(uniform_events(PLAIN), min_size=2, max_size=4))
def test_one_decoder_across_batches_whose_kinds_change_gives_what_event_by_event_gives(batches):
    """The batch path tells Arrow the types of the batch before: a batch whose columns changed
    kind (a number where text was, a fraction where whole numbers were, a column gone) is read
    again with inference, and every batch still gives what event by event gives."""
    decoder = EventDecoder(SCHEMA, "json", "clicks")
    for b, messages in enumerate(batches):
        deliveries = [Delivery(0, 10 * b + i, b"\n".join(events), 1.0)
                      for i, events in enumerate(messages)]
        same_either_way(decoder, deliveries)
