"""Whole jobs: every role its own process, on real ZeroMQ sockets over loopback."""

from __future__ import annotations

import importlib
import re
import sys

import orjson
import pytest
from harness import ADULT_JOB, REPO

from roles.job.settings import load_job

ADULT_TRAIN_ROWS = 39074


@pytest.mark.inprocess
def test_adult_two_workers_two_shards_over_tcp(cluster):
    c = cluster(ADULT_JOB, transport="tcp")
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["auc"] >= 0.895, s
    assert s["samples_trained"] == ADULT_TRAIN_ROWS * 3
    assert s["samples_in_data"] == ADULT_TRAIN_ROWS and s["eval_samples"] == 9768
    assert sum(s["workers"].values()) == s["samples_trained"]
    assert min(s["workers"].values()) > 0.2 * s["samples_trained"]
    assert s["rejected_rows"] == 0 and s["rejected_messages"] == {}
    assert s["rounds"] >= 3  # at least the epoch-end rounds
    assert sum(v["updates"] for v in s["shards"].values()) > 0
    # push: the shards send each batch's rows to the worker granted it, unasked: a reply from
    # each of 2 shards per batch and no look-up (but one for rows 2 s overdue, if any)
    e = s["embeddings"]
    assert e["mode"] == "push" and 2.0 <= e["messages_per_batch"] < 2.05, e
    assert s["parts"]["owners"] == [0, 0]  # one gzipped file: a training and an eval part
    assert all(e["rows_once"] == ADULT_TRAIN_ROWS for e in s["per_epoch"])
    events = [orjson.loads(line) for line in (c.run_dir / "metrics.jsonl").open("rb")]
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [0, 1, 2]
    effective = load_job(str(c.run_dir / "config.toml"), environ={})
    assert effective.fingerprint() == c.job.fingerprint()
    for role in ("control-0", "feeder-0", "ps-0", "ps-1", "worker-0", "worker-1",
                 "aggregator-0"):
        assert "Traceback" not in c.log(role), c.log(role)


@pytest.mark.inprocess
def test_step_sync_trains_adult(cluster):
    c = cluster(ADULT_JOB, train__sync="step", train__epochs=1, cluster__workers=2,
                cluster__shards=1)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["sync"] == "step" and s["rounds"] == 1  # only the epoch-end round
    assert s["auc"] >= 0.895, s
    assert s["samples_trained"] == ADULT_TRAIN_ROWS


@pytest.mark.inprocess
def test_bad_rows_are_counted_and_set_aside_with_line_numbers(cluster, tmp_path):
    import gzip
    lines = gzip.open(REPO / "data" / "adult.csv.gz", "rt").read().splitlines()[:2001]
    bad = {5: "25,Private,226802,11th,7",                                    # too few fields
           9: lines[9].replace(",40,", ",forty,", 1),                        # not a number
           12: lines[12].replace(",40,", ",nan,", 1),                        # NaN
           20: lines[20].rsplit(",", 1)[0] + ",maybe",                       # unknown label
           1900: "25,Private,226802,11th,7"}                                 # in the eval part
    for number, text in bad.items():
        lines[number - 1] = text
    data = tmp_path / "adult-bad.csv"
    data.write_text("\n".join(lines) + "\n")
    # two epochs: the second's parts, and each evaluation's, are begun before their pass
    # (warmed): their rows and rejected rows are counted once, in their own pass
    c = cluster(ADULT_JOB, data__path=str(data), train__epochs=2, cluster__workers=1,
                cluster__shards=1)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["rejected_rows"] == 5 and s["rows_read"] == 2000
    assert s["samples_trained"] / 2 + s["eval_samples"] == 1995
    for rows in s["parts"]["rows_per_epoch"]:
        assert rows["rows"] == rows["rows_once"] == s["samples_trained"] / 2, rows
    # one training part, one eval part: each pass's but the first training's begun ahead
    # (the first: once the statistics are in, which is as the epoch starts here: 3 or 4)
    assert s["feeders"]["feeder-0"]["parts_begun_ahead"] >= 3, s["feeders"]
    rows = (c.run_dir / "rejected.tsv").read_text().splitlines()
    assert rows[0] == "file\tline\treason\trow"
    got = {int(r.split("\t")[1]): r.split("\t")[2] for r in rows[1:]}
    assert got == {5: "expected 15 fields, got 5",
                   9: "column 'hours-per-week': cannot parse 'forty' as a number",
                   12: "column 'hours-per-week': non-finite value 'nan'",
                   20: "label 'maybe' is not a known value", 1900: "expected 15 fields, got 5"}


@pytest.mark.parametrize("role", ["control", "feeder", "ps", "worker", "aggregator",
                                  "spawn worker"])
@pytest.mark.inprocess
def test_a_bad_job_file_fails_at_start_with_one_clear_line(tmp_path, role, monkeypatch, capsys):
    """Each role's command (its main, in this process, with its command line)."""
    job = tmp_path / "bad.toml"
    job.write_text(ADULT_JOB.read_text().replace("epochs = 3", "epoch = 3"))
    module, *args = role.split()
    main = importlib.import_module({"spawn": "roles.tools.spawn", "control": "roles.control.main",
                                    "feeder": "roles.feeder.process",
                                    "worker": "roles.worker.process"}.get(module,
                                                                           f"roles.{module}")).main
    monkeypatch.delenv("HONCHO_PROCESS_NAME", raising=False)
    monkeypatch.setattr(sys, "argv", [f"zbus-{module}", *args, "--job", str(job)])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == (f"zbus {role}: job error: unknown key [train] "
                                               "epoch (did you mean 'epochs'?)")


@pytest.mark.inprocess
def test_a_missing_column_fails_the_job_naming_it(cluster):
    c = cluster(ADULT_JOB, data__dense=["age", "salary"])
    c.start_role("control")
    c.start_role("feeder")
    assert c.wait(timeout=60) == 1
    s = c.summary()
    assert s["status"] == "failed" and "dense column 'salary' is not in" in s["reason"]
    assert c.wait("feeder-0", timeout=30) == 1
    assert "Traceback" not in c.log("feeder-0") + c.log("control-0")


@pytest.mark.inprocess
def test_a_damaged_gzip_file_fails_the_job_naming_the_file_with_no_traceback(cluster, tmp_path):
    import gzip
    whole = (REPO / "data" / "adult.csv.gz").read_bytes()
    text = gzip.decompress(whole)
    damaged = tmp_path / "adult-damaged.csv.gz"
    damaged.write_bytes(gzip.compress(text)[:len(whole) // 2])  # cut in the middle
    c = cluster(ADULT_JOB, data__path=str(damaged), cluster__workers=1, cluster__shards=1)
    c.start_all()
    assert c.wait(timeout=120) == 1, c.logs()
    s = c.summary()
    assert s["status"] == "failed", s["reason"]
    assert "adult-damaged.csv.gz is damaged" in s["reason"], s["reason"]
    assert re.search(r"after at least \d+ rows", s["reason"]), s["reason"]  # where it broke
    for node in ("control-0", "feeder-0", "ps-0", "worker-0", "aggregator-0"):
        assert "Traceback" not in c.log(node), c.log(node)
