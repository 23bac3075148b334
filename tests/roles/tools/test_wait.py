"""``zbus-ctl wait`` (``roles.tools.wait``), what the zbus-wait Job of deploy/kubernetes runs:
its verdict on how a job ended, the summary in the checkpoint store for a waiter that came
after the end, and a real job followed to its end over control's status."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from roles.checkpoint.files import SUMMARY
from roles.job.settings import parse_job
from roles.tools import wait


def test_the_verdict_is_completed_or_not_and_a_supervised_wait_goes_through_a_resumable_end():
    assert wait.verdict("completed", None, supervised=False) == wait.COMPLETED == 0
    for status in ("failed", "stopped", "interrupted"):
        assert wait.verdict(status, None, supervised=True) == wait.ENDED == 1
        assert wait.verdict(status, 3, supervised=False) == wait.ENDED
        assert wait.verdict(status, 3, supervised=True) is None   # zbus-pod resumes it


def job_with_store(tmp_path: Path, node: str = "127.0.0.1"):
    text = (f'[data]\nsource = "synthetic"\n[cluster]\nhost = "{node}"\nbase_port = 47900\n'
            f'[checkpoint]\ndir = "{tmp_path / "store"}"\n')
    return parse_job(text, "job.toml", tmp_path, environ={})


@pytest.mark.parametrize(("summary", "code"), [
    ({"status": "completed", "auc": 0.8, "logloss": 0.4, "wall_s": 12.0,
      "resume_from": None}, 0),
    ({"status": "failed", "reason": "bad rows in day_3.tsv", "resume_from": None}, 1)])
def test_a_waiter_that_comes_after_the_end_reads_the_summary_in_the_store(tmp_path, summary,
                                                                          code):
    """Control is gone (nothing at its status endpoint): the run's summary.json, which control
    wrote beside the checkpoints, says how the job ended."""
    job = job_with_store(tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / SUMMARY).write_bytes(orjson.dumps(summary))
    said: list[str] = []
    assert wait.Waiter(job, supervised=True, timeout_s=30.0, say=said.append).run() == code
    assert said[-1].startswith(f"job {job.name} {summary['status']}")
    if code:
        assert said[-1].endswith(": bad rows in day_3.tsv")


def test_a_supervised_waiter_waits_through_a_resumable_end_until_it_cannot_tell(tmp_path):
    job = job_with_store(tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / SUMMARY).write_bytes(orjson.dumps(
        {"status": "interrupted", "reason": "a shard was not back", "resume_from": 4}))
    said: list[str] = []
    assert wait.Waiter(job, supervised=True, timeout_s=1.5, say=said.append).run() == \
        wait.UNKNOWN
    assert any("resumable from checkpoint 4: waiting for it to go on" in s for s in said)
    assert "cannot tell how the job ended" in said[-1]
    assert wait.Waiter(job, supervised=False, timeout_s=1.5, say=said.append).run() == \
        wait.ENDED


@pytest.mark.integration
def test_a_waiter_follows_a_job_to_its_end_over_controls_status(cluster):
    """zbus-ctl wait, started before the job, exits 0 once control says it completed (the
    final status it publishes before it exits). The command is a process; the job's roles run
    in this one (what the waiter hears is control's status socket either way)."""
    c = cluster(data__synthetic__rows=20000, train__epochs=1, in_process=True)
    said = c.workdir / "wait.log"
    with open(said, "wb") as out:
        waiter = subprocess.Popen([sys.executable, "-m", "roles.tools.ctl", "wait"],
                                  cwd=c.workdir, env=c.env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        # the job starts once the waiter listens (its first line): a job of seconds could
        # otherwise end, control's final figures said and gone, while the waiter's Python
        # still starts on a loaded host (a fresh clone's run once saw it wait on for ever)
        deadline = time.monotonic() + 60
        while b"waiting for job" not in said.read_bytes():
            assert waiter.poll() is None and time.monotonic() < deadline, said.read_text()
            time.sleep(0.05)
        assert c.run_job() == 0, c.logs()
        assert waiter.wait(timeout=60) == 0, said.read_text()
    finally:
        waiter.kill()
        waiter.wait()
    lines = said.read_text().splitlines()
    assert lines[0].startswith("zbus ctl: waiting for job synthetic to end")
    assert lines[-1].startswith("zbus ctl: job synthetic completed in ")
    assert f"auc {c.summary()['auc']:.4f}" in lines[-1]
