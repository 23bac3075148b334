#!/usr/bin/env python
"""Console responsiveness with 32 nodes reporting, in one run.

A real control process and 32 stand-in nodes (``scripts/sim_nodes.py``: 1 feeder,
1 aggregator, 3 shards, 27 workers, heartbeating every 0.25 s) on loopback; the console runs
headless at 80x24 on the Nodes tab (the heaviest panel: the table is rebuilt on every status).
Measured over ``--seconds``:

- UI updates per second: statuses shown, counted in 1-s windows (median), against the statuses
  control published (its rate: 1 / status_s);
- the handler's time per status (median and 95th percentile, ms);
- the event loop's lag: a task that sleeps 20 ms and records how late it wakes, which bounds
  how long a key press waits. Baseline, same run: the same console with no control to talk to;
- the console's CPU time per status shown (all of it: the handler, the layout and the
  painting), which other processes on a busy machine inflate far less than the lag.

    .venv/bin/python scripts/bench_console.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from console.app import ZbusConsole
from console.bus import Endpoints, StatusArrived
from roles.testbed.local_cluster import LocalCluster  # noqa: E402  (the test harness)

REPO = Path(__file__).resolve().parent.parent
TICK_S = 0.02


class TimedConsole(ZbusConsole):
    def __init__(self, endpoints: Endpoints | None) -> None:
        super().__init__(endpoints)
        self.handled_at: list[float] = []
        self.handler_s: list[float] = []

    def on_status_arrived(self, message: StatusArrived) -> None:
        started = time.perf_counter()
        super().on_status_arrived(message)
        self.handler_s.append(time.perf_counter() - started)
        self.handled_at.append(time.monotonic())


async def measure(endpoints: Endpoints | None, seconds: float) -> dict:
    app = TimedConsole(endpoints)
    lags: list[float] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        if endpoints is not None:
            deadline = time.monotonic() + 60
            while len(app.snapshot["nodes"] if app.snapshot else []) < 32 \
                    or app.snapshot["phase"] != "training":
                if time.monotonic() > deadline:
                    raise SystemExit("the 32 nodes did not all report within 60 s")
                await pilot.pause(0.1)
        start = time.monotonic()
        cpu_start = time.process_time()
        shown_before = len(app.handled_at)
        while time.monotonic() - start < seconds:
            t = time.monotonic()
            await asyncio.sleep(TICK_S)
            lags.append(time.monotonic() - t - TICK_S)
        end = time.monotonic()
        cpu_s = time.process_time() - cpu_start
        rows = len(app.query_one("NodeTable").rows_shown)
    at = [t for t in app.handled_at[shown_before:] if start <= t < end]
    windows = [sum(1 for t in at if start + i <= t < start + i + 1) for i in range(int(seconds))]
    return {"updates_per_s": statistics.median(windows) if windows else 0.0,
            "handler_ms": sorted(s * 1000 for s in app.handler_s[shown_before:]) or [0.0],
            "lag_ms": sorted(x * 1000 for x in lags), "rows": rows,
            "cpu_ms_per_status": 1000 * cpu_s / len(at) if at else None,
            "cpu_share": cpu_s / (end - start)}


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    baseline = asyncio.run(measure(None, args.seconds))
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        with LocalCluster(Path(tmp), REPO / "jobs" / "adult.toml", cluster__workers=27,
                          cluster__shards=3, cluster__heartbeat_s=0.25,
                          train__stall_timeout_s=3600) as c:
            c.start_role("control")
            c.start("sim-nodes", [sys.executable, str(REPO / "scripts" / "sim_nodes.py")])
            endpoints = Endpoints(c.job.cluster.endpoint("status"),
                                  c.job.cluster.endpoint("control_req"))
            loaded = asyncio.run(measure(endpoints, args.seconds))
            published = 1 / c.job.cluster.status_s
    print(f"{loaded['rows']} nodes in the table, control publishing {published:.1f} "
          f"statuses/s, {args.seconds:.0f} s each\n")
    print("| console | UI updates/s (median of 1-s windows) | shown ÷ published | "
          "handler ms p50 / p95 | loop lag ms p50 / p95 | CPU ms per status (share of a "
          "core) |\n|---|---|---|---|---|---|")
    for name, r, rate in (("idle, no control (baseline)", baseline, None),
                          ("32 nodes reporting", loaded, published)):
        ratio = f"{r['updates_per_s'] / rate:.2f}" if rate else "-"
        handler = (f"{pct(r['handler_ms'], 0.5):.1f} / {pct(r['handler_ms'], 0.95):.1f}"
                   if rate else "-")
        cpu = r["cpu_ms_per_status"]
        print(f"| {name} | {r['updates_per_s']:.1f} | {ratio} | {handler} | "
              f"{pct(r['lag_ms'], 0.5):.1f} / {pct(r['lag_ms'], 0.95):.1f} | "
              f"{'-' if cpu is None else f'{cpu:.1f}'} ({r['cpu_share']:.0%}) |")
    print(f"\nload average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
