"""Lazy aggregation, backups, recovery, export and live settings: whole jobs on loopback."""

from __future__ import annotations

import gzip
import signal
import subprocess
from pathlib import Path

import orjson
import pytest
import zmq
from harness import ADULT_JOB, BIN, REPO, recv_within

from roles.protocol.datapath import Idle
from roles.tools import ctl as zbus_ctl
from roles.tools import predict as zbus_predict
from zbus.codec import decode

ADULT = REPO / "data" / "adult.csv.gz"
ADULT_TRAIN_ROWS = 39074


def tool(main, capsys, *argv: str) -> tuple[int, str, str]:
    """A command run in this process (its ``main``): its exit status, stdout and stderr."""
    capsys.readouterr()
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.inprocess
def test_lazy_matches_step_with_far_fewer_dense_bytes_and_its_export_predicts_the_same(
        cluster, tmp_path, capsys):
    step = cluster(ADULT_JOB, train__sync="step")
    assert step.run_job() == 0, step.logs()
    lazy = cluster(ADULT_JOB, train__sync="lazy")
    assert lazy.run_job() == 0, lazy.logs()
    s, z = step.summary(), lazy.summary()
    assert abs(z["auc"] - s["auc"]) <= 0.005, (z["auc"], s["auc"])
    assert z["bytes_received"]["dense_sync"] * 10 <= s["bytes_received"]["dense_sync"], \
        (z["bytes_received"], s["bytes_received"])
    assert z["samples_trained"] == ADULT_TRAIN_ROWS * 3
    assert z["aggregation_decisions"]["aggregate"] >= 1 and z["backups"] >= 1
    decisions = [e for e in lazy.events() if e["event"] == "aggregate"]
    assert any(e["reason"].startswith("aggregate: network") for e in decisions), decisions
    backups = sorted((lazy.run_dir / "backups").glob("dense-r*.npz"))
    assert 1 <= len(backups) <= 3  # backups_kept
    # the export scores the eval split exactly as the job did
    out = tmp_path / "scores.tsv"
    code, said, err = tool(zbus_predict.main, capsys, z["export"], str(ADULT), "--split",
                           "eval", "--out", str(out), "--json")
    assert code == 0, err
    figures = orjson.loads(said.strip().splitlines()[-1])
    assert figures["scored"] == z["eval_samples"] == 9768
    assert abs(figures["auc"] - z["auc"]) < 1e-6, (figures, z["auc"])
    assert len(out.read_text().splitlines()) == 9768 + 1
    # bad input: one line each, a status that says so, no traceback (exit 2: unreadable)
    text = gzip.decompress(ADULT.read_bytes())
    damaged = tmp_path / "damaged.csv.gz"
    whole = gzip.compress(text)
    damaged.write_bytes(whole[:len(whole) // 2])

    def predict(data: Path, *args: str) -> tuple[int, str, str]:
        return tool(zbus_predict.main, capsys, z["export"], str(data), *args)

    code, _, err = predict(damaged)   # an exception other than SystemExit fails the test
    assert code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and "damaged.csv.gz is damaged" in err, err
    lines = text.decode().splitlines()
    half = tmp_path / "half.csv"  # every other row has a field too few: above the limit
    half.write_text("\n".join([lines[0], *(row if i % 2 else row.rsplit(",", 1)[0]
                                           for i, row in enumerate(lines[1:2001]))]) + "\n")
    code, said, err = predict(half)
    assert code == 3 and "Traceback" not in err, err
    assert "more than max_rejected_fraction" in err, err
    assert said.count("\n") == 1  # the figures, in one line
    assert "2,000 rows read, 1,000 rejected" in said, said


@pytest.mark.inprocess
def test_killed_aggregator_restarts_from_the_latest_backup_and_the_job_finishes(cluster):
    c = cluster(ADULT_JOB, train__sync="lazy", train__epochs=3,
                aggregation__min_local_rounds=2)
    c.start_all()
    c.wait_for_event(lambda e: e["event"] == "round_done" and e["round"] >= 3)
    c.procs["aggregator-0"].kill()
    c.procs["aggregator-0"].wait()
    c.start_role("aggregator", 0, name="aggregator-0-again")
    assert c.wait(timeout=240) == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["recoveries"] == 1, s["recovery"]
    assert s["auc"] >= 0.89, s["auc"]
    assert s["samples_trained"] == ADULT_TRAIN_ROWS * 3  # the remaining data, once
    (restore,) = [e for e in c.events() if e["event"] == "restore"]
    assert restore["path"].endswith(".npz") and "dense-r" in restore["path"]
    assert "restored" in c.log("aggregator-0-again")
    assert "Traceback" not in c.log("aggregator-0-again") + c.log("control-0")


@pytest.mark.inprocess
def test_a_killed_worker_blocks_lazy_aggregation_until_the_failure_window_passes(cluster):
    """A worker SIGKILLed mid-epoch is a failed node of the job for failure_window_s after its
    death is found: no round is decided in that time (the failure rate, 1 of 6 nodes, is over
    failure_rate_max), and once the window has passed the cluster aggregates again."""
    window = 6.0
    c = cluster(ADULT_JOB, train__sync="lazy", train__epochs=2,
                aggregation__min_local_rounds=2, aggregation__failure_window_s=window,
                cluster__node_timeout_s=1.5)
    c.start_all(slowdown={0: 10.0, 1: 10.0})   # epochs of seconds
    c.wait_for_event(lambda e: e["event"] == "round_done" and e["round"] >= 2)
    c.procs["worker-1"].send_signal(signal.SIGKILL)
    assert c.wait(timeout=240) == 0, c.logs()
    events = c.events()
    (failed,) = [e for e in events if e["event"] == "membership" and e["node"] == "worker-1"
                 and e["change"] == "failed"]
    decided = [e["t"] for e in events if e["event"] == "aggregate"
               and e["reason"].startswith("aggregate: network")]
    blocked = [e for e in events if e["event"] == "decision" and "failure rate" in e["reason"]]
    assert blocked and all(e["failure_rate"] >= 1 / 6 - 1e-9 for e in blocked), blocked
    assert not [t for t in decided if failed["t"] <= t < failed["t"] + window], \
        (failed, decided)
    assert [t for t in decided if t >= failed["t"] + window], (failed, decided)  # again
    s = c.summary()
    assert s["ok"] and s["samples_trained"] == ADULT_TRAIN_ROWS * 2


@pytest.mark.inprocess
def test_hierarchical_aggregation_trains_adult(cluster):
    c = cluster(ADULT_JOB, train__sync="lazy", train__epochs=2, cluster__workers=3,
                cluster__aggregators=2, cluster__shards=1)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["auc"] >= 0.895, s["auc"]
    assert s["samples_trained"] == ADULT_TRAIN_ROWS * 2
    rounds = [e for e in c.events() if e["event"] == "round_done"]
    # the root's RoundDone names the leaf's worker (worker-1) among the contributors
    assert any("worker-1" in e["samples_by"] and "worker-0" in e["samples_by"]
               for e in rounds), rounds


@pytest.mark.inprocess
def test_decayed_and_merged_samples_train_once_each(cluster):
    c = cluster(None, data__synthetic__rows=20000, data__synthetic__dense=0,
                data__synthetic__vocab=[3, 4, 5], data__synthetic__days=60,
                data__decay_base=1.1, data__drop_below=0.05, data__merge=True,
                train__epochs=1, train__sync="lazy", cluster__workers=2, cluster__shards=1)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert s["dropped_rows"] > 0 and s["merged_rows"] > 0, s
    assert s["samples_in_data"] + s["dropped_rows"] + s["merged_rows"] == 16000
    assert s["samples_trained"] == s["samples_in_data"]


@pytest.mark.inprocess
def test_live_settings_are_validated_applied_and_recorded(cluster, capsys):
    c = cluster(ADULT_JOB)
    c.start_role("control")  # no nodes needed: settings are control's
    endpoint = c.job.cluster.endpoint("control_req")

    def ctl(*args: str) -> subprocess.CompletedProcess:
        """zbus-ctl, run in this process: its status and output, as its process's."""
        code, out, err = tool(zbus_ctl.main, capsys, "--endpoint", endpoint, "--timeout", "20",
                              *args)
        return subprocess.CompletedProcess(args, code, out, err)

    ctx = zmq.Context()
    try:  # garbage and a wrong message type on the request endpoint are only counted
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        sock.send_multipart([b"\x00 garbage"])
        sock.send_multipart(Idle().to_frames("intruder"))
        assert not decode(recv_within(sock)).msg.ok  # "Idle is not a request"
    finally:
        ctx.destroy(linger=0)
    ok = ctl("set", "net_util_max=0.5", "max_local_rounds=20")
    assert ok.returncode == 0 and "applied" in ok.stdout, ok.stdout + ok.stderr
    refused = ctl("set", "net_util_max=1.5", "min_local_rounds=3")
    assert refused.returncode == 1
    assert "net_util_max must be in [0.001, 1.0], got 1.5" in refused.stdout
    crossed = ctl("set", "min_local_rounds=30")
    assert crossed.returncode == 1 and "must be <= max_local_rounds (20)" in crossed.stdout
    now = ctl("settings")
    assert "net_util_max = 0.5 " in now.stdout and "min_local_rounds = 4 " in now.stdout
    assert "min_local_rounds = 4   (integer in [1, 10000])" in now.stdout
    whole = ctl("set", "min_local_rounds=2.5")
    assert whole.returncode == 1 and "min_local_rounds must be an integer" in whole.stdout
    quiet = ctl("backup")  # one line by default; the whole answer with --json
    assert quiet.stdout.count("\n") == 1 and quiet.stdout.startswith(("ok: ", "refused: "))
    early = ctl("checkpoint")  # not training yet: refused, in one line
    assert early.returncode == 1 and early.stdout.count("\n") == 1, early.stdout
    assert early.stdout.startswith("refused: not now: the job is not training"), early.stdout
    assert orjson.loads(ctl("--json", "checkpoint").stdout)["ok"] is False
    described = ctl("checkpoint", "--help")
    assert "take a whole-job checkpoint now" in described.stdout, described.stdout
    answer = orjson.loads(ctl("--json", "settings").stdout)
    assert answer["ok"] and answer["settings"]["net_util_max"] == 0.5
    usage = ctl("set", "net_util_max")
    assert usage.returncode == 2 and "is not name=value" in usage.stderr
    changes = [e for e in c.events() if e["event"] == "setting"]
    assert [e["changes"] for e in changes] == [{"net_util_max": 0.5, "max_local_rounds": 20}]
    assert "[aggregation] net_util_max = 0.5" in (c.run_dir / "config.toml").read_text()


@pytest.mark.integration  # zbus-ctl's process: its exit status and what the interpreter says
@pytest.mark.inprocess    # control, which answers it, in this one
def test_zbus_ctl_whose_reader_has_gone_away_ends_quietly(cluster):
    """``zbus-ctl ... | true``: the reader gone before the answer comes, the process exits
    with status 141 and says nothing (not the interpreter's complaint about its last flush)."""
    c = cluster(ADULT_JOB)
    c.start_role("control")
    endpoint = c.job.cluster.endpoint("control_req")
    piped = subprocess.run(f"'{BIN / 'zbus-ctl'}' --endpoint '{endpoint}' settings | true; "
                           "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash",
                           capture_output=True, text=True, timeout=60, env=c.env)
    assert piped.stdout.strip() == "141" and piped.stderr == "", piped.stderr
