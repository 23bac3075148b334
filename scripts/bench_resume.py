#!/usr/bin/env python
"""Benchmark: a whole job killed and resumed, as an operator would do it, with ``honcho
start`` on the Procfile (Adult, ``jobs/adult.toml``: 2 workers, 2 shards, 3 epochs, a
checkpoint every second).

Three cases, ``--repeats`` runs each, interleaved, all in one run of this script:

- **uninterrupted**: the job as it is;
- **killed mid-epoch**: once a checkpoint of epoch 1 (the second) is complete and the next
  batches are under way, every process of the job is SIGKILLed (honcho and every role), then
  ``ZBUS_RESUME=<run> honcho start`` goes on with it;
- **killed mid-checkpoint**: the same, the kill landing right after a checkpoint began (while
  it drains, flushes or is written): the previous complete one must be used.

Reported per case: the median AUC and its difference to the uninterrupted median (the target:
within 0.003), whether every row was trained exactly once per epoch counted from the cut
(``rows_once`` = rows in every epoch), the samples trained again, and the checkpoint the job
went back to.

    .venv/bin/python scripts/bench_resume.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from roles.job.summary import read_summary

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ADULT_TRAIN_ROWS = 39074


def environ(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZBUS_")}
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ZBUS_JOB=str(REPO / "jobs" / "adult.toml"),
               ZBUS_RUN_DIR=str(run_dir), ZBUS_CHECKPOINT__EVERY_S="1",
               ZBUS_MODEL__HIDDEN="[512, 256]", PYTHONUNBUFFERED="1")
    return env


def honcho(run_dir: Path, log: Path, resume: bool = False) -> subprocess.Popen:
    env = environ(run_dir)
    if resume:
        env["ZBUS_RESUME"] = str(run_dir)
    with open(log, "ab") as out:
        return subprocess.Popen([str(BIN / "honcho"), "start"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def wait_for(run_dir: Path, proc: subprocess.Popen, predicate, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = next((e for e in events(run_dir) if predicate(e)), None)
        if found is not None:
            return found
        if proc.poll() is not None:
            raise SystemExit(f"the job ended before the moment to kill it ({run_dir})")
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting in {run_dir}")


def kill_everything(run_dir: Path, proc: subprocess.Popen) -> None:
    """SIGKILL honcho and every process of the run (found by their run directory)."""
    victims = [psutil.Process(proc.pid)]
    for p in psutil.process_iter():
        try:
            if p.environ().get("ZBUS_RUN_DIR") == str(run_dir):
                victims.append(p)
        except (psutil.Error, OSError):
            continue
    for p in victims:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=10)


def run(case: str, work: Path, n: int) -> dict:
    run_dir = work / f"{case}-{n}"
    log = work / f"{case}-{n}.log"
    proc = honcho(run_dir, log)
    back_to = None
    if case != "uninterrupted":
        second = wait_for(run_dir, proc, lambda e: e["event"] == "epoch_start"
                          and e["epoch"] == 1)
        if case == "killed mid-epoch":
            wait_for(run_dir, proc, lambda e: e["event"] == "checkpoint"
                     and e["status"] == "complete" and e["t"] > second["t"])
            time.sleep(0.3)  # batches after the cut, to be trained again
        else:
            wait_for(run_dir, proc, lambda e: e["event"] == "checkpoint_begin"
                     and e["t"] > second["t"])
        kill_everything(run_dir, proc)
        proc = honcho(run_dir, log, resume=True)
    if proc.wait(timeout=600) != 0:
        raise SystemExit(f"{case} run {n} failed: see {log}")
    s = read_summary(run_dir)
    rollbacks = s["checkpoints"].get("rollbacks", [])
    if rollbacks:
        back_to = rollbacks[0]
    once = all(r["rows"] == r["rows_once"] == ADULT_TRAIN_ROWS
               for r in s["parts"]["rows_per_epoch"])
    return {"auc": s["auc"], "rows_once_per_epoch": once,
            "retrained_samples": back_to["retrained_samples"] if back_to else 0,
            "back_to": back_to["checkpoint"] if back_to else None,
            "wall_s": s["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cases = ("uninterrupted", "killed mid-epoch", "killed mid-checkpoint")
    results: dict[str, list[dict]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        for n in range(args.repeats):
            for case in cases:
                results[case].append(run(case, Path(tmp), n))
                print(json.dumps({"case": case, "run": n, **results[case][-1]}), flush=True)
    base = statistics.median(r["auc"] for r in results["uninterrupted"])
    for case in cases:
        runs = results[case]
        auc = statistics.median(r["auc"] for r in runs)
        print(json.dumps({"case": case, "median_auc": round(auc, 4),
                          "auc_minus_uninterrupted": round(auc - base, 4),
                          "aucs": [round(r["auc"], 4) for r in runs],
                          "every_row_once_per_epoch": all(r["rows_once_per_epoch"]
                                                          for r in runs),
                          "retrained_samples": [r["retrained_samples"] for r in runs],
                          "back_to": [r["back_to"] for r in runs]}), flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
