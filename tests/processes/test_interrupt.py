"""A job interrupted before it finished (Ctrl-C: SIGINT to the terminal's foreground process
group; honcho then SIGTERMs every role) can be resumed as a killed one can: control writes
its summary as ``interrupted`` but leaves the run resumable, and ``--resume`` goes back to the
newest complete checkpoint, every row then trained once per epoch (real processes, loopback).
"""

from __future__ import annotations

import os
import signal

import orjson
import pytest
from harness import ADULT_JOB, BIN
from resumes import every_row_once, trained_past_a_checkpoint

from roles.checkpoint.files import latest_complete

pytestmark = pytest.mark.integration

ADULT_TRAIN_ROWS = 39074
EPOCHS = 2   # interrupted in the second, after a checkpoint in it
SLOWED = 14.0   # the workers idle 13 x each batch's time: epochs of seconds, little CPU


def interrupted_mid_epoch(c, interrupt, proc: str) -> int:
    """Once a checkpoint of the second epoch is complete and training has gone on past it,
    ``interrupt()``; ``proc`` (the process that was interrupted first) ends, the summary says
    ``interrupted`` and names the checkpoint to go back to: its number."""
    second = c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 1)
    trained_past_a_checkpoint(c, second["t"])
    interrupt()
    code = c.wait(proc, timeout=60)
    s = c.summary()
    assert s["status"] == "interrupted" and not s["ok"], (s["status"], s["reason"])
    newest = latest_complete(c.run_dir)
    assert newest is not None
    assert s["resume_from"] == newest[0], (s.get("resume_from"), newest[0])
    state = orjson.loads((c.run_dir / "control-state.json").read_bytes())
    assert state["course"]["phase"] == "training", state["course"]
    assert code == (130 if proc == "honcho" else 128 + signal.SIGINT), code
    return newest[0]


def resumed_once_per_epoch(c, checkpoint: int, out: str = "control-0") -> dict:
    """The resumed job went back to ``checkpoint`` once, trained every row once per epoch and
    said so in its last lines (in the log of ``out``)."""
    s = c.summary()
    assert s["ok"], s["reason"]
    (back,) = s["checkpoints"]["rollbacks"]
    assert back["checkpoint"] == checkpoint and back["epoch"] == 1, back
    every_row_once(s, ADULT_TRAIN_ROWS, EPOCHS)
    assert f"zbus: recovered from 1 whole-job restart (back to checkpoint {checkpoint}: " \
        in c.log(out), c.log(out)[-2000:]
    assert s["duplicates_refused"]["embedding_updates"] == 0
    return s


def test_sigint_to_the_process_group_of_every_role_mid_epoch_then_resume(cluster):
    """Every role in one process group, as a shell's foreground job: Ctrl-C signals each."""
    c = cluster(ADULT_JOB, train__epochs=EPOCHS, checkpoint__every_s=1.0)
    c.start_all(slowdown={0: SLOWED, 1: SLOWED}, one_group=True)
    group = c.procs["control-0"].pid

    number = interrupted_mid_epoch(c, lambda: os.killpg(group, signal.SIGINT), "control-0")
    assert "received SIGINT" in c.log("control-0")
    for name, proc in c.procs.items():  # every role ends on the interrupt, none killed
        assert proc.wait(timeout=30) >= 0, (name, c.log(name)[-3000:])
    c.start_all(resume=True, slowdown={0: SLOWED, 1: SLOWED})
    assert c.wait() == 0, c.logs()
    resumed_once_per_epoch(c, number)


PROCFILE = """control: exec zbus-control
feeder: exec zbus-spawn feeder
ps: exec zbus-spawn ps
worker0: exec zbus-worker --index 0 --slowdown 14
worker1: exec zbus-worker --index 1 --slowdown 14
aggregator: exec zbus-spawn aggregator
"""


def test_ctrl_c_of_honcho_start_mid_epoch_then_resume_with_zbus_resume(cluster):
    """Ctrl-C of ``honcho start``: the terminal's SIGINT reaches honcho (each role runs in a
    session of its own), which SIGTERMs every role: the job says it was a Ctrl-C, and
    ``ZBUS_JOB=<run>/config.toml ZBUS_RESUME=<run> honcho start`` then goes on with the run,
    none of the job's ZBUS_* settings given again."""
    c = cluster(ADULT_JOB, train__epochs=EPOCHS, checkpoint__every_s=1.0)
    procfile = c.workdir / "Procfile"
    procfile.write_text(PROCFILE)  # the repository's, with slowed workers
    honcho = [str(BIN / "honcho"), "-d", str(c.workdir), "-f", str(procfile), "start"]
    c.start("honcho", honcho)
    c.watched = "honcho"

    def ctrl_c() -> None:
        os.killpg(c.procs["honcho"].pid, signal.SIGINT)

    number = interrupted_mid_epoch(c, ctrl_c, "honcho")
    out = c.log("honcho")
    assert "SIGINT received" in out and "SIGKILL" not in out, out[-3000:]
    # the headline says how to go on, and is the last thing but honcho's word on control
    assert "zbus: job adult interrupted: Ctrl-C: honcho stopped every process (SIGTERM) " \
           "before the job finished" in out, out[-3000:]
    assert f"zbus: to go on from checkpoint {number}: ZBUS_JOB=run/config.toml " \
           "ZBUS_RESUME=run scripts/start" in out, out[-3000:]
    said = [line.split(" | ", 1)[1] for line in out.splitlines() if " | " in line]
    assert said[-1] == "control.1 stopped (rc=143)" and said[-2].startswith("zbus: summary in"), \
        said[-12:]
    assert not c.strays(), c.strays()
    # as the headline says: the run's own job file, none of the job's ZBUS_* settings
    c.env = {k: v for k, v in c.env.items()
             if not (k.startswith("ZBUS_") and "__" in k) and k != "ZBUS_JOB"}
    c.env.update(ZBUS_JOB=str(c.run_dir / "config.toml"), ZBUS_RESUME=str(c.run_dir))
    c.start("honcho-resumed", honcho)
    assert c.wait("honcho-resumed") == 0, c.log("honcho-resumed")[-5000:]
    resumed_once_per_epoch(c, number, "honcho-resumed")
