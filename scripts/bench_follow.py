#!/usr/bin/env python
"""How fresh ``zbus-serve --follow`` is: a job checkpoints every ``--every-s`` while a server
follows its run directory; for each checkpoint, the time from its completion (its manifest
written) until the server first answers with its version, and the served version's age as
requests see it (now minus when its checkpoint completed), sampled every 50 ms.

The job: Adult, ``--epochs`` epochs in this process (``roles.testbed``); the server:
``zbus-serve --follow RUN --poll-ms P`` as a process; a client asks it for one row every 50 ms.
The strongest alternative a user has today is the same server reloading an export by hand; the
figure to beat is the issue's: an event served within a second (docs/serving.md, Not yet).

    .venv/bin/python scripts/bench_follow.py [--every-s 1] [--poll-ms 100] [--epochs 20]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import orjson
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.serving.client import Client, request_body
from roles.testbed.jobs import ADULT_JOB, REPO
from roles.testbed.local_cluster import BIN, LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every-s", type=float, default=1.0)
    parser.add_argument("--poll-ms", type=float, default=100.0)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    with gzip.open(REPO / "data" / "adult.csv.gz", "rt") as f:
        row = next(csv.DictReader(f))
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        c = LocalCluster(Path(tmp), ADULT_JOB, in_process=True, train__epochs=args.epochs,
                         checkpoint__every_s=args.every_s, checkpoint__keep=1000)
        server = subprocess.Popen([str(BIN / "zbus-serve"), "--follow", str(c.run_dir),
                                   "--port", "0", "--poll-ms", str(args.poll_ms)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        seen: dict[str, float] = {}      # version -> when first served
        ages: list[tuple[float, str]] = []   # (when asked, version answered)
        done = threading.Event()
        try:
            url = server.stdout.readline().split(" on ")[1].split()[0]

            def ask() -> None:
                client, meta = Client(url), None
                while not done.is_set():
                    try:
                        if meta is None:
                            status, meta = client.call("GET", "/v2/models/adult")
                            meta = meta if status == 200 else None
                        if meta is not None:
                            status, reply = client.infer("adult", request_body(meta, [row]))
                            if status == 200:
                                now = time.time()
                                seen.setdefault(reply["model_version"], now)
                                ages.append((now, reply["model_version"]))
                    except OSError:
                        client = Client(url)
                    time.sleep(0.05)

            asker = threading.Thread(target=ask, daemon=True)
            asker.start()
            assert c.run_job(timeout=1200) == 0, c.logs()
            time.sleep(max(1.0, 3 * args.poll_ms / 1000))   # the last one served too
            done.set()
            asker.join(timeout=10)
        finally:
            server.terminate()
            server.wait(timeout=30)
            c.close()
        completed = {}   # version (round) -> when its checkpoint completed
        for manifest in sorted(Path(c.run_dir, "checkpoints").glob("*/manifest.json")):
            m = orjson.loads(manifest.read_bytes())
            completed[str(m["round"])] = m["created"]
    delays = [seen[v] - t for v, t in completed.items() if v in seen]
    missed = [v for v in completed if v not in seen]
    age = [now - completed[v] for now, v in ages if v in completed]
    print(f"zbus-serve --follow on {cpu_name()}: Adult, {args.epochs} epochs, a checkpoint "
          f"every {args.every_s} s, --poll-ms {args.poll_ms:.0f}, one request every 50 ms")
    print(f"{len(completed)} checkpoints, {len(delays)} served ({len(missed)} replaced by a "
          "newer one before the server loaded them)")
    if delays:
        q = statistics.quantiles(delays, n=100, method="inclusive") if len(delays) > 1 \
            else delays * 99
        print(f"checkpoint complete -> first served: median {statistics.median(delays):.3f} s, "
              f"p99 {q[98]:.3f} s, max {max(delays):.3f} s")
    if age:
        q = statistics.quantiles(age, n=100, method="inclusive")
        print(f"age of the parameters served ({len(age)} requests): median "
              f"{statistics.median(age):.3f} s, p99 {q[98]:.3f} s (the checkpoint interval "
              "included)")


if __name__ == "__main__":
    main()
