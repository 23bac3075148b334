"""A soak: run a job for a set time and check that no role's memory, queues or descriptors grow.

    .venv/bin/python scripts/soak.py --minutes 60               # the benchmark (one hour)
    .venv/bin/python scripts/soak.py --minutes 0.3 --epochs 20 --sample-s 1 --warmup-s 12 \
        --set data__synthetic__rows=10000          # CI-sized (tests/scripts/test_soak.py)

Every process of the job (control, feeders, shards, workers, aggregators) is its own OS process
on this host (``roles/testbed/local_cluster.py``); the job is the built-in one (synthetic data,
``roles/job/default_job.toml``) unless ``--job`` names another, with the most epochs a job may have
(4,095: more than any soak lasts); the soak stops it with ``zbus-ctl stop``. Every ``--sample-s``
seconds from the start of training it records, per process, its resident memory, open file
descriptors, sockets and threads (psutil), and per node the queue control's status shows (the
console's "queue" column: a feeder's batches in flight, a worker's batches in its pipeline, a
shard's training batches waiting for their gradients plus look-ups waiting for their keys).

The verdict, after ``--warmup`` (a fraction of the run, or ``--warmup-s``):
  * memory: every process's largest RSS after warm-up within ``--rss-bound`` (10 %) of its
    largest in the second half of warm-up (a feeder's RSS swings with the parts it reads, so
    the value "after warm-up" is that swing's top, not one sample);
  * descriptors and sockets: never more than ``--fd-slack`` (4: a shard's forked checkpoint
    writer holds a pipe while it writes) above their most in the second half of warm-up; a
    broken bound names the descriptors that were new, each as /proc shows it (a file, a pipe,
    an eventfd, a socket with its two ends), from the samples' ``open`` records;
  * queues: bounded, i.e. the largest length in the second half of the run after warm-up is
    at most 1.25x the largest in the first half plus 16 (a queue that grows with the job
    fails; one that swings within its window does not).
It prints a table and writes every sample to ``--out`` (JSON); exit status 1 when a bound is
broken, 2 when the job ended or failed before the soak did.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import zmq

from roles.protocol.operator import Status  # noqa: E402
from roles.testbed.local_cluster import LocalCluster, setting_pair  # noqa: E402  (the test harness)
from roles.tools.ctl import request  # noqa: E402
from zbus import sockets  # noqa: E402

QUEUE_GROWTH, QUEUE_SLACK = 1.25, 16


def process_sample(proc: psutil.Process) -> dict[str, Any] | None:
    try:
        with proc.oneshot():
            connections = proc.net_connections(kind="all")
            return {"rss": proc.memory_info().rss, "fds": proc.num_fds(),
                    "sockets": len(connections), "threads": proc.num_threads(),
                    "open": open_descriptors(proc.pid, connections)}
    except psutil.Error:
        return None


def open_descriptors(pid: int, connections: list[Any]) -> dict[str, str]:
    """What each open descriptor is (Linux: /proc/<pid>/fd), a socket with its two ends, so
    that descriptors that grew say what opened them ({} where /proc cannot tell)."""
    ends = {c.fd: f"{c.laddr or '-'} -> {c.raddr or '-'}" for c in connections if c.fd >= 0}
    found = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            found[fd] = f"{target} {ends[int(fd)]}" if int(fd) in ends else target
    except OSError:
        return {}
    return found


def new_descriptors(before: dict[str, Any], after: dict[str, Any], most: int = 10) -> str:
    """The descriptors open in ``after`` that ``before`` did not have (sample records)."""
    was, now = before.get("open") or {}, after.get("open") or {}
    added = [f"{fd}: {what}" for fd, what in sorted(now.items(), key=lambda kv: int(kv[0]))
             if was.get(fd) != what]
    if not added:
        return ""
    more = f"; {len(added) - most} more" if len(added) > most else ""
    return " (new: " + "; ".join(added[:most]) + more + ")"


class StatusReader:
    """The newest status control published (a SUB socket on its status endpoint)."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.sock = sockets.connect(self.ctx, zmq.SUB, endpoint, rcvhwm=16)
        self.traffic = sockets.Traffic()
        self.newest: dict[str, Any] | None = None

    def poll(self) -> dict[str, Any] | None:
        while True:
            try:
                _, env = sockets.recv(self.sock, router=False, traffic=self.traffic)
            except zmq.Again:
                return self.newest
            if isinstance(env.msg, Status):
                self.newest = env.msg.snapshot()

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def queues_of(status: dict[str, Any] | None) -> dict[str, int]:
    if not status:
        return {}
    return {row["id"]: row["backlog"] for row in status.get("nodes", [])
            if row.get("backlog") is not None}


START_TIMEOUT_S = 300.0    # from the processes' start to training
TRAINING = ("training", "syncing", "evaluating")   # the course's phases of a running job
EPOCHS_CAP = 10   # --epochs: a soak that has not seen them within 10x its minutes fails


def verdict(samples: list[dict[str, Any]], warmup_s: float, rss_bound: float,
            fd_slack: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Per process and per queue, the figures and the bounds broken (pure: tests use it)."""
    after = [s for s in samples if s["t"] >= warmup_s]
    late_warmup = [s for s in samples if warmup_s / 2 <= s["t"] < warmup_s] or after[:1]
    if len(after) < 3:
        raise ValueError(f"{len(after)} samples after warm-up: run longer or sample more often")
    rows, broken = [], []
    for name in sorted(after[0]["procs"]):
        series = [s["procs"][name] for s in after if s["procs"].get(name)]
        warm = [s["procs"][name] for s in late_warmup if s["procs"].get(name)] or series[:1]
        row = {"process": name, "rss_warm_mb": max(x["rss"] for x in warm) / 2**20,
               "rss_max_mb": max(x["rss"] for x in series) / 2**20,
               "fds_warm": max(x["fds"] for x in warm), "fds_max": max(x["fds"] for x in series),
               "sockets_warm": max(x["sockets"] for x in warm),
               "sockets_max": max(x["sockets"] for x in series),
               "threads_max": max(x["threads"] for x in series)}
        row["rss_ratio"] = row["rss_max_mb"] / row["rss_warm_mb"]
        rows.append(row)
        if row["rss_ratio"] > 1 + rss_bound:
            broken.append(f"{name}: RSS grew {row['rss_warm_mb']:.0f} -> "
                          f"{row['rss_max_mb']:.0f} MB (x{row['rss_ratio']:.3f})")
        for what in ("fds", "sockets"):
            if row[f"{what}_max"] > row[f"{what}_warm"] + fd_slack:
                first = max(warm, key=lambda x: x[what])
                most = max(series, key=lambda x: x[what])
                broken.append(f"{name}: {what} grew {row[f'{what}_warm']} -> "
                              f"{row[f'{what}_max']}" + new_descriptors(first, most))
    half = len(after) // 2
    for node in sorted({n for s in after for n in s["queues"]}):
        first = [s["queues"][node] for s in after[:half] if node in s["queues"]]
        second = [s["queues"][node] for s in after[half:] if node in s["queues"]]
        if not first or not second:
            continue
        row = {"process": f"queue {node}", "queue_first_max": max(first),
               "queue_second_max": max(second), "queue_median": statistics.median(first + second)}
        rows.append(row)
        if max(second) > QUEUE_GROWTH * max(first) + QUEUE_SLACK:
            broken.append(f"{node}: queue grew from at most {max(first)} to {max(second)}")
    return rows, broken


def epochs_short(samples: list[dict[str, Any]], warmup_s: float, epochs: int) -> bool:
    """Fewer than ``epochs`` epochs passed between the first sample after warm-up and the
    last (what grows by the epoch shows in epochs, whatever the machine's speed)."""
    after = [s["epoch"] for s in samples if s["t"] >= warmup_s and s["epoch"] is not None]
    return epochs > 0 and (not after or after[-1] - after[0] < epochs)


def soak(args: argparse.Namespace, workdir: Path,
         warmup_s: float) -> tuple[list[dict[str, Any]], str]:
    settings = {"train__epochs": 4095, **dict(setting_pair(p) for p in args.set)}
    samples: list[dict[str, Any]] = []
    with LocalCluster(workdir, job=args.job, **settings) as cluster:
        reader = StatusReader(cluster.job.cluster.endpoint("status"))
        try:
            cluster.start_all()
            procs = {name: psutil.Process(p.pid) for name, p in cluster.procs.items()}
            # the soak's clock starts with training: every role has started, made its
            # sockets and said Ready (a busy machine, or numba compiling a fresh clone's
            # loops, can take tens of seconds to get there, which is no part of a soak)
            deadline = time.monotonic() + START_TIMEOUT_S
            while ((status := reader.poll()) or {}).get("phase") not in TRAINING:
                if cluster.procs["control-0"].poll() is not None:
                    return samples, "the job ended before it trained:\n" + cluster.logs()
                if time.monotonic() > deadline:
                    return samples, (f"the job did not start training within "
                                     f"{START_TIMEOUT_S:g} s:\n" + cluster.logs())
                time.sleep(0.1)
            started, end = time.monotonic(), time.monotonic() + args.minutes * 60
            cap = started + max(args.minutes * 60, warmup_s) * EPOCHS_CAP
            next_sample = started
            while time.monotonic() < end or epochs_short(samples, warmup_s, args.epochs):
                if time.monotonic() > cap:
                    return samples, (f"fewer than {args.epochs} epochs after warm-up within "
                                     f"{cap - started:.0f} s (reached epoch "
                                     f"{samples[-1]['epoch'] if samples else None})")
                status = reader.poll()
                if cluster.procs["control-0"].poll() is not None:
                    return samples, "the job ended before the soak did:\n" + cluster.logs()
                if time.monotonic() >= next_sample:
                    samples.append({"t": round(time.monotonic() - started, 1),
                                    "procs": {n: process_sample(p) for n, p in procs.items()},
                                    "queues": queues_of(status),
                                    "epoch": (status or {}).get("epoch")})
                    next_sample += args.sample_s
                time.sleep(min(0.5, args.sample_s / 4))
            request(cluster.job.cluster.endpoint("control_req"), "stop")
            cluster.wait(timeout=120)
        finally:
            reader.close()
    return samples, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=0.25, help="fraction of the run")
    parser.add_argument("--warmup-s", type=float, help="warm-up in seconds (instead)")
    parser.add_argument("--epochs", type=int, default=0,
                        help="go on past --minutes until this many epochs after warm-up")
    parser.add_argument("--rss-bound", type=float, default=0.10)
    parser.add_argument("--fd-slack", type=int, default=4)
    parser.add_argument("--job", type=Path, help="job file (default: the built-in job)")
    parser.add_argument("--set", action="append", default=[],
                        help="a setting, section__key=value (e.g. checkpoint__every_s=30)")
    parser.add_argument("--out", type=Path, help="write the samples and verdict here (JSON)")
    parser.add_argument("--workdir", type=Path, help="keep the run here (default: a temp dir)")
    args = parser.parse_args(argv)
    warmup_s = args.warmup_s if args.warmup_s is not None else args.warmup * args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="zbus-soak-") as tmp:
        samples, failed = soak(args, args.workdir or Path(tmp), warmup_s)
    if failed:
        print(failed, file=sys.stderr)
        return 2
    rows, broken = verdict(samples, warmup_s, args.rss_bound, args.fd_slack)
    print(f"soak: {args.minutes:g} min, {len(samples)} samples every {args.sample_s:g} s, "
          f"warm-up {warmup_s:g} s, epochs reached {samples[-1]['epoch']}")
    for row in rows:
        print("  " + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()))
    print("soak: " + ("every bound held" if not broken else "BROKEN:\n  " + "\n  ".join(broken)))
    if args.out:
        args.out.write_bytes(orjson.dumps({"samples": samples, "rows": rows, "broken": broken,
                                           "args": {k: str(v) for k, v in vars(args).items()}},
                                          option=orjson.OPT_INDENT_2))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
