"""``zbus-spawn ROLE``: start the job's feeders, N shards, M workers or K aggregators, each its own
process, and supervise them (one Procfile line runs however many the job names). With
``[cluster] parts`` > 1 each worker leads a model-parallel group, and ``zbus-spawn worker``
starts the groups' members too.

SIGTERM/SIGINT are passed on to the children; it exits when they all have, with the first
non-zero exit status among them (0 when all ended well).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from roles.job.cli import count_of, integer, load_job_or_exit

ROLES = ("feeder", "ps", "worker", "aggregator")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-spawn", description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--count", type=integer, help="how many (default: from the job)")
    args = parser.parse_args(argv)
    job = load_job_or_exit(args.job, f"spawn {args.role}")
    count = args.count if args.count is not None else count_of(job, args.role)
    extra = ["--job", args.job] if args.job else []
    starts = [(args.role, i) for i in range(count)]
    if args.role == "worker":
        starts += [("member", i) for i in range(count * (job.cluster.parts - 1))]
    children = [subprocess.Popen([sys.executable, "-m", f"roles.{role}", "--index", str(i),
                                  *extra]) for role, i in starts]

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(child.poll() is None for child in children):
        time.sleep(0.2)
    for sig in (signal.SIGTERM, signal.SIGINT):  # done: a signal now (honcho stopping the
        signal.signal(sig, signal.SIG_IGN)       # other roles) must not change the status
    # a child ended by a signal has returncode -N: report it as a shell would, 128 + N
    codes = [c if c >= 0 else 128 - c for c in (child.returncode for child in children)]
    sys.exit(next((c for c in codes if c != 0), 0))


if __name__ == "__main__":
    main()
