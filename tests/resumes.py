"""Checks shared by the tests of whole-job resume (``test_resume``, ``test_bounded_resume``):
every process killed, the job resumed from the newest complete checkpoint, every row trained
once per epoch, and a checkpoint that serves."""

from __future__ import annotations

import time
from pathlib import Path

from harness import REPO

from roles.checkpoint.files import latest_complete
from roles.serving.model import ExportedModel
from roles.tools.ctl import request
from roles.tools.predict import predict


def is_complete(e: dict, at_least: int = 1) -> bool:
    return e["event"] == "checkpoint" and e["status"] == "complete" and e["number"] >= at_least


def trained_past_a_checkpoint(c, after_t: float) -> None:
    """Return once the job has trained for a while after a checkpoint completed (later than
    ``after_t``) with no checkpoint begun since: a kill then loses training to retrain."""
    for _ in range(60):
        c.wait_for_event(lambda e, t=after_t: is_complete(e) and e["t"] > t)
        newest = max((e for e in c.events() if is_complete(e)), key=lambda e: e["t"])
        time.sleep(0.5)  # training goes on after the cut
        if not any(e["event"] == "checkpoint_begin" and e["t"] > newest["t"]
                   for e in c.events()):
            return
        after_t = newest["t"]
    raise AssertionError("every checkpoint was followed by another within 0.5 s")


def checkpointed_while_paused(c, after: int) -> None:
    """In a resumed run just started: feeding paused, a checkpoint asked (again while control
    refuses it, waiting for the nodes to join again) and waited for, numbered past ``after``,
    then feeding again. The resumed run then checkpoints on whatever the host's speed (what is
    left of an epoch after the cut can take less than ``every_s``)."""
    endpoint = c.job.cluster.endpoint("control_req")
    assert request(endpoint, "pause", timeout_s=20).ok
    for _ in range(20):   # (a cut begun as the job syncs a round is abandoned: asked again)
        for _ in range(600):
            answer = request(endpoint, "checkpoint", timeout_s=20)
            if answer.ok:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"no checkpoint taken in the resumed run: {answer.message}")
        number = int(answer.message.split()[1])   # "checkpoint <n> begins"
        ended = c.wait_for_event(lambda e, n=number: e["event"] == "checkpoint"
                                 and e["number"] == n and e["status"] != "begun")
        if is_complete(ended, after + 1):
            break
    else:
        raise AssertionError("every checkpoint asked in the resumed run was abandoned")
    assert request(endpoint, "resume", timeout_s=20).ok


def killed_and_resumed(c, slowdown: float, checkpoint_again: bool = False) -> dict:
    """Every process SIGKILLed, then the job resumed: its summary, once it went back to the
    newest checkpoint complete at the kill and finished. ``checkpoint_again``: the resumed run
    takes a checkpoint (``checkpointed_while_paused``)."""
    c.kill_all()
    before = latest_complete(c.run_dir)
    assert before is not None, "no complete checkpoint at the kill"
    c.start_all(resume=True, slowdown={0: slowdown, 1: slowdown})
    if checkpoint_again:
        checkpointed_while_paused(c, before[0])
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"], s["reason"]
    (back,) = s["checkpoints"]["rollbacks"]
    assert back["checkpoint"] == before[0], (back, before[0])
    return s


def every_row_once(s: dict, rows: int, epochs: int) -> None:
    """Every row trained once in every epoch, counted from the cut."""
    for epoch in s["parts"]["rows_per_epoch"]:
        assert epoch["rows"] == epoch["rows_once"] == rows, epoch
    assert s["samples_trained"] == epochs * rows, s["samples_trained"]


def checkpoint_auc(run_dir: Path) -> float:
    """``zbus-predict``'s scoring of the newest checkpoint on Adult's evaluation rows (its
    ``predict``, in this process): the AUC."""
    model = ExportedModel(run_dir / "checkpoints")
    scored = predict(model, str(REPO / "data" / "adult.csv.gz"), model.job.data.format, "eval")
    return float(scored["auc"])
