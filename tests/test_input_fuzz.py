"""Malformed input rows (hypothesis): the readers and the feeder's preparation never crash, and
every row is accounted for: accepted (then trained, scored, dropped or merged) or rejected with
its line number."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roles.data.dataset import load_dataset
from roles.data.readers import CRITEO_COLUMNS, DataError
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
            d = load_dataset(job)
        except DataError as exc:  # too many rejected rows, or too few to split: said clearly
            assert str(exc)
            return
    # every line read is accepted or set aside with its line number
    accepted = d.n_train + d.n_eval + d.dropped_rows + d.merged_rows
    assert accepted + len(d.rejected) == d.rows_read
    numbers = [r.line for r in d.rejected]
    assert len(set(numbers)) == len(numbers) and all(n >= 1 for n in numbers)
    assert all(r.reason for r in d.rejected)
    # what is fed is well-formed: finite features and weights, labels 0/1
    assert np.isfinite(d.dense).all() and np.isfinite(d.weights).all()
    assert set(np.unique(d.labels).tolist()) <= {0.0, 1.0}
    assert d.keys.shape == (len(d.labels), len(d.fields))


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
