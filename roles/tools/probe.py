"""``zbus-probe live|ready``: a role's health for a supervisor's probes (Kubernetes' liveness
and readiness probes), read from the file its loop writes (``ZBUS_HEALTH_FILE``,
``zbus.health``).

    zbus-probe live     the role's loop wrote its health within --max-age seconds (60), and
                        its process runs or ended normally
    zbus-probe ready    live, and the role is ready: a node admitted by control, control
                        running the job

Exits 0 when the probe passes, else 1 with the reason in one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from zbus import health


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-probe", description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=("live", "ready"))
    parser.add_argument("--file", default=os.environ.get(health.ENV) or health.DEFAULT_PATH,
                        help=f"the health file (default: ${health.ENV}, else "
                             f"{health.DEFAULT_PATH})")
    parser.add_argument("--max-age", type=float, default=health.MAX_AGE_S, metavar="S",
                        help="live only if the role wrote its health within S seconds "
                             f"(default {health.MAX_AGE_S:g})")
    args = parser.parse_args(argv)
    record = health.read(args.file)
    why = health.verdict(record, args.probe, time.time(), args.max_age)
    if why is not None:
        if record is None:
            why += f": {args.file}"
        print(f"zbus-probe {args.probe}: {why}", file=sys.stderr)
        raise SystemExit(1)
    assert record is not None
    print(f"zbus-probe {args.probe}: {record['node']} is {record['state']} (pid {record['pid']})")


if __name__ == "__main__":
    main()
