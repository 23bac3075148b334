#!/usr/bin/env python
"""Stand-in nodes for console tests and benchmarks (``roles.testbed.sim_nodes``): one process that
plays every node of a job (feeder, aggregators, shards, workers) towards a real control over its
real socket; with ``--windows N`` they also drive control's placement. SIGTERM ends it.

    python scripts/sim_nodes.py [--seconds N] [--windows N --window-rate R]
                                job from ZBUS_JOB / ZBUS_* as for roles
"""

from __future__ import annotations

import argparse
import signal

from roles.job.settings import load_job
from roles.testbed.sim_nodes import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--windows", type=int, default=0)
    parser.add_argument("--window-rate", type=float, default=20.0)
    args = parser.parse_args(argv)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    run(load_job(None), args.seconds, args.windows, args.window_rate, lambda: bool(stop))


if __name__ == "__main__":
    main()
