"""Malformed input rows (hypothesis): the index, the readers and the feeder's preparation (the
statistics, the stream of batches) never crash, and every row is accounted for: accepted (then
trained, scored, dropped or merged) or rejected with its line number."""

from __future__ import annotations

import gzip
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roles.data.index import CRITEO_COLUMNS, DataError
from roles.data.readers import _shown
from roles.data.source import DataSource
from roles.data.stream import Tally, eval_batches, training_batches
from roles.job.settings import load_job

GOOD = st.one_of(st.integers(-10**6, 10**6).map(str),
                 st.floats(-1e6, 1e6, allow_nan=False).map(repr), st.sampled_from(["", "?"]))
NASTY = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e39", "-3.5e38", "1e308", "1e400", "0x1F", "1_000",
                     "\x00", '"', '""', '"a,b"', "\t", ",", "\ufeff", "2024-01-01T00:00:00",
                     "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1e19",
                     "-9223372036854775809", "\r", "\u2028"]),
    st.text(max_size=12))
LABEL = st.sampled_from(["0", "1", "yes", "no"])


def rows(width: int):
    """Rows of good cells with a few spoiled (a nasty cell, a nasty label), and ragged rows:
    enough good rows that most examples get through to training."""
    good = st.tuples(LABEL, st.lists(GOOD, min_size=width - 1, max_size=width - 1)).map(
        lambda t: [t[0], *t[1]])
    spoiled = st.tuples(good, st.lists(st.tuples(st.integers(0, width - 1), NASTY),
                                       min_size=1, max_size=2)).map(_spoil)
    ragged = st.lists(st.one_of(GOOD, NASTY), max_size=width + 2)
    return st.lists(st.one_of(good, good, good, spoiled, spoiled, ragged), min_size=10,
                    max_size=60)


def _spoil(t: tuple) -> list[str]:
    row, changes = t
    row = list(row)
    for where, cell in changes:
        row[where] = cell
    return row


def check(job_text: str, header: list[str] | None, table: list[list[str]], sep: str,
          gz: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        name = "data.gz" if gz else "data.txt"
        lines = ([sep.join(header)] if header else []) + [sep.join(r) for r in table]
        raw = ("\n".join(lines) + "\n").encode("utf-8", errors="surrogatepass")
        path = Path(tmp) / name
        path.write_bytes(gzip.compress(raw) if gz else raw)
        (Path(tmp) / "job.toml").write_text(job_text.replace("PATH", str(path)))
        job = load_job(str(Path(tmp) / "job.toml"), environ={})
        try:
            source = DataSource(job)
            source.cache_dir = Path(tmp) / "cache"
            files, parts, _ = source.index()
            source.files = files
        except DataError as exc:  # too few rows to split: said clearly
            assert str(exc)
            return
        prepare = source.preparer(parts)
        tally = Tally()
        batches = []
        rejected = []

        def blocks(part):   # each block read once: its rejected rows kept as it goes by
            for block in source.blocks(part):
                rejected.extend(block.rejected)
                yield block

        for part in parts:
            if part.eval:
                batches += list(eval_batches(blocks(part), prepare, tally, 7))
            else:
                batches += list(training_batches(blocks(part), prepare, tally,
                                                 buffer_rows=16, batch_size=7, seed=1,
                                                 epoch=0, part=part.number, by_label=False))
    # every line read is accepted or set aside with its line number
    assert tally.samples + tally.dropped + tally.merged + tally.rejected == tally.rows_read
    assert sum(len(b) for b in batches) == tally.samples
    assert len(rejected) == tally.rejected
    # each rejected row once, with its line: no (line, text) more often than that line holds
    # such a row (a lone \r ends a row within a line: its rows share the line's number, and
    # two of them may read alike, as "\t" and "\t" in "\t\r\t")
    for (line, text), times in Counter((r.line, r.text) for r in rejected).items():
        if times > 1:   # only a line that a lone \r cuts holds rows that read alike
            rows_there = lines[line - 1].split("\r") if 0 < line <= len(lines) else []
            assert times <= sum(text in (row, _shown(row)) for row in rows_there), \
                (line, text, times)
    assert all(r.line >= 1 for r in rejected)
    assert all(r.reason for r in rejected)
    # what is fed is well-formed: finite features and weights, labels 0/1
    for b in batches:
        assert np.isfinite(b.dense).all() and np.isfinite(b.weights).all()
        assert set(np.unique(b.labels).tolist()) <= {0.0, 1.0}
        assert b.keys.shape == (len(b), len(job.sparse_fields))


CSV_JOB = """
name = "fuzz"
[data]
source = "file"
path = "PATH"
format = "FORMAT"
label = "y"
positive = ["yes", "1"]
negative = ["no", "0"]
dense = ["a", "b"]
sparse = ["c", "d"]
timestamp = "ts"
decay_base = 1.5
max_rejected_fraction = 1.0
eval_fraction = 0.2
log1p = LOG1P
"""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows(6), st.sampled_from(["csv", "tsv"]), st.booleans(), st.booleans())
def test_malformed_csv_and_tsv_rows_are_all_accounted_for(table, fmt, gz, log1p):
    job = CSV_JOB.replace("FORMAT", fmt).replace("LOG1P", "true" if log1p else "false")
    check(job, ["y", "a", "b", "c", "d", "ts"], table, "," if fmt == "csv" else "\t", gz)


CRITEO_JOB = """
name = "fuzz"
[data]
source = "file"
path = "PATH"
format = "criteo"
max_rejected_fraction = 1.0
eval_fraction = 0.2
log1p = LOG1P
"""


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows(len(CRITEO_COLUMNS)), st.booleans())
def test_malformed_criteo_rows_are_all_accounted_for(table, log1p):
    check(CRITEO_JOB.replace("LOG1P", "true" if log1p else "false"), None, table, "\t", False)


def test_two_rows_alike_on_one_line_cut_by_a_lone_cr_are_both_set_aside():
    # found by the fuzzing above: "\t\r\t" is two rows "\t", each rejected, on one line
    good = ["0"] * len(CRITEO_COLUMNS)
    table = [good] * 20 + [["", "\r", ""]] + [good] * 2
    check(CRITEO_JOB.replace("LOG1P", "false"), None, table, "\t", False)
