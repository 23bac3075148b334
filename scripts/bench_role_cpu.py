#!/usr/bin/env python
"""Where a job's CPU goes: each role process's threads, in cores, over a window of training.

Runs the built-in synthetic job on this host over TCP loopback (``--workers`` x ``--shards``,
one epoch of ``--rows`` rows, batch ``--batch``), waits ``--after-s`` seconds into the job (start-up
is about 5 s), then reads every role process's per-thread CPU time (psutil) twice,
``--window-s`` apart. Prints, per role, the cores it used and each thread that used more than
0.01 core (by its name: ``python`` is the loop or a Python or BLAS thread, ``ZMQbg/IO/0``
ZeroMQ's I/O thread), and the job's samples/s. Cores, not ratios: read it for a thread that
should be idle and is not (the spinning BLAS pool of docs/benchmarks.md), not as a speed.

    .venv/bin/python scripts/bench_role_cpu.py [--workers 1] [--shards 1] [--rows 5000000]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import psutil

from roles.testbed.local_cluster import LocalCluster  # noqa: E402  (the test harness)

Times = dict[str, dict[str, float]]   # role -> thread "name#id" -> CPU seconds


def thread_times(root: int) -> Times:
    """CPU seconds of every thread of each role process under ``root`` (this process)."""
    out: Times = {}
    for proc in psutil.Process(root).children(recursive=True):
        try:
            cmdline = proc.cmdline()
            if "-m" not in cmdline:
                continue
            module = cmdline[cmdline.index("-m") + 1]
            if not module.startswith("roles."):
                continue
            index = cmdline[cmdline.index("--index") + 1] if "--index" in cmdline else "0"
            threads = {}
            for t in proc.threads():
                try:
                    name = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
                except OSError:
                    name = "?"
                threads[f"{name}#{t.id}"] = t.user_time + t.system_time
            out[f"{module.removeprefix('roles.')}-{index}"] = threads
        except (psutil.Error, ValueError, IndexError):
            continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rows", type=int, default=5_000_000, help="synthetic rows")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--after-s", type=float, default=8.0)
    parser.add_argument("--window-s", type=float, default=5.0)
    args = parser.parse_args()
    seen: dict[str, object] = {}

    def sample() -> None:
        time.sleep(args.after_s)
        started = time.monotonic()
        seen["before"] = thread_times(psutil.Process().pid)
        time.sleep(args.window_s)
        seen["after"] = thread_times(psutil.Process().pid)
        seen["seconds"] = time.monotonic() - started

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
            Path(tmp) / "job", transport="tcp", cluster__workers=args.workers,
            cluster__shards=args.shards, train__epochs=1, train__batch_size=args.batch,
            data__synthetic__rows=args.rows, checkpoint__every_s=0) as c:
        if c.run_job(timeout=1200) != 0:
            raise SystemExit(f"the job failed:\n{c.logs()}")
        summary = c.summary()
    sampler.join()
    if "after" not in seen:
        raise SystemExit("the job ended before the window closed: more --rows, or less "
                         "--after-s / --window-s")
    before, after = seen["before"], seen["after"]
    assert isinstance(before, dict) and isinstance(after, dict)
    seconds = float(seen["seconds"])  # type: ignore[arg-type]
    print(f"{args.workers}w/{args.shards}s, batch {args.batch}: "
          f"{summary['samples_per_s']:,.0f} samples/s; cores over {seconds:.1f} s of training")
    total = 0.0
    for role in sorted(after):
        used = {name: (cpu - before.get(role, {}).get(name, 0.0)) / seconds
                for name, cpu in after[role].items()}
        cores = sum(used.values())
        total += cores
        busy = " ".join(f"{name.split('#')[0]} {u:.2f}" for name, u in
                        sorted(used.items(), key=lambda kv: -kv[1]) if u > 0.01)
        print(f"  {role:14s} {cores:5.2f}  ({busy})")
    print(f"  {'all roles':14s} {total:5.2f} of {psutil.cpu_count()} cores")


if __name__ == "__main__":
    main()
