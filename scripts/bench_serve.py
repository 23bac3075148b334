#!/usr/bin/env python
"""``zbus-serve``'s latency and throughput on one host: single-row requests at rising
concurrency, and batched requests, by wrk (Debian's ``wrk``), against the strongest
alternative a user would pick: the same model scored in the caller's own process
(``ExportedModel.score`` on rows already prepared, no HTTP, no JSON), measured in the same run.

For each number of connections (``--connections``, closed loop: each sends its next request
when the last is answered, so the load rises with them) wrk reports requests/s and the
latency's p50 and p99; the server's CPU (its processes' user + system time over the run)
gives the CPU per 1,000 rows. Batched: ``--batch`` rows a request over 4 connections a
worker process. The model: the Adult
job's export, trained first (1 epoch, in this process), or ``--export``.

    .venv/bin/python scripts/bench_serve.py [--seconds 10] [--workers 1]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from roles.data.stream import Tally
from roles.serving.client import Client, request_body
from roles.serving.inference import rows_of
from roles.serving.model import ExportedModel
from roles.serving.served import Served
from roles.testbed.jobs import ADULT_JOB, REPO
from roles.testbed.local_cluster import BIN, LocalCluster

UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def train(work: Path) -> Path:
    c = LocalCluster(work, ADULT_JOB, in_process=True, train__epochs=1,
                     checkpoint__every_s=0)
    try:
        assert c.run_job(timeout=300) == 0, c.logs()
    finally:
        c.close()
    return c.run_dir / "export"


def adult_rows(n: int) -> list[dict[str, str]]:
    with gzip.open(REPO / "data" / "adult.csv.gz", "rt") as f:
        reader = csv.DictReader(f)
        return [next(reader) for _ in range(n)]


def in_process(model: ExportedModel, meta: dict, rows: list[dict[str, str]], batch: int,
               seconds: float) -> tuple[float, float]:
    """(median seconds per call, rows/s) of scoring ``batch`` prepared rows in this process:
    the model alone, as a user's own service would run it."""
    served = Served.of(model)
    block = rows_of(request_body(meta, rows[:batch]), served.signature, batch).block
    samples = served.prepare(block, False, Tally())
    times = []
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        t = time.perf_counter()
        model.score(samples.keys, samples.dense)
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return median, batch / median


def wrk(url: str, body: Path, connections: int, seconds: float) -> dict[str, float]:
    script = body.with_suffix(".lua")
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f'local f = io.open("{body}", "rb")\nwrk.body = f:read("*all")\n'
                      'f:close()\n')
    out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:.0f}s",
                          "--latency", "-s", str(script), f"{url}/v2/models/adult/infer"],
                         capture_output=True, text=True, check=True).stdout
    got = {}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert m, out
        got[f"p{pct}_ms"] = float(m.group(1)) * UNITS[m.group(2)]
    got["rps"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    assert bad is None, out
    return got


def server_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="an export to serve (default: train Adult's)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--connections", default="1,2,4,8,16,32")
    parser.add_argument("--batch", type=int, default=256, help="rows per batched request")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        work = Path(tmp)
        export = Path(args.export) if args.export else train(work / "train")
        model = ExportedModel(export)
        rows = adult_rows(max(args.batch, 1))
        server = subprocess.Popen([str(BIN / "zbus-serve"), str(export), "--port", "0",
                                   "--workers", str(args.workers)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            url = line.split(" on ")[1].split()[0]
            client = Client(url)
            client.wait_ready()
            meta = client.metadata("adult")
            one, many = work / "one.json", work / "many.json"
            one.write_bytes(request_body(meta, rows[:1]))
            many.write_bytes(request_body(meta, rows[:args.batch]))
            proc = psutil.Process(server.pid)
            results = []
            for c in [int(x) for x in args.connections.split(",")]:
                cpu = server_cpu(proc)
                got = wrk(url, one, c, args.seconds)
                got["cpu_per_1k_rows_s"] = (server_cpu(proc) - cpu) / (
                    got["rps"] * args.seconds) * 1000
                results.append((c, 1, got))
            cpu = server_cpu(proc)
            batched = 4 * args.workers   # (several: the kernel spreads them by address)
            got = wrk(url, many, batched, args.seconds)
            got["cpu_per_1k_rows_s"] = (server_cpu(proc) - cpu) / (
                got["rps"] * args.batch * args.seconds) * 1000
            results.append((batched, args.batch, got))
        finally:
            server.terminate()
            server.wait(timeout=30)
        alone_1, _ = in_process(model, meta, rows, 1, args.seconds / 2)
        alone_b_s, alone_b_rows = in_process(model, meta, rows, args.batch, args.seconds / 2)
    print(f"zbus-serve on {cpu_name()} ({psutil.cpu_count()} cores), {args.workers} worker "
          f"process(es), wrk -t 1, {args.seconds:.0f} s each, the Adult export")
    print(f"in this process (the model alone): 1 row {alone_1 * 1e3:.3f} ms a call; "
          f"{args.batch} rows {alone_b_s * 1e3:.2f} ms a call = {alone_b_rows:,.0f} rows/s")
    print("connections  rows/request  requests/s  rows/s    p50 ms  p99 ms  CPU s/1k rows  "
          "rows/s vs alone")
    for c, n, got in results:
        alone = alone_b_rows if n > 1 else 1 / alone_1
        print(f"{c:>11}  {n:>12}  {got['rps']:>10,.0f}  {got['rps'] * n:>8,.0f}  "
              f"{got['p50_ms']:>6.2f}  {got['p99_ms']:>6.2f}  {got['cpu_per_1k_rows_s']:>13.3f}"
              f"  {got['rps'] * n / alone:>7.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
