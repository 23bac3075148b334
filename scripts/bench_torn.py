#!/usr/bin/env python
"""Never torn, at scale: ``--probes`` answers of a server that follows a live job (serving cuts
every ``--publish-ms``) while ps-1 and then the aggregator are SIGKILLed mid-publish and
started again, every answer checked against the version it names, rebuilt offline from the
published deltas alone (``roles.testbed.live_oracle``, the oracle of
``tests/roles/serving/test_live.py``).

The Adult job runs in this process (its roles in-process, the workers slowed 6×, so that it
trains through the probes), followed by ``zbus-serve``'s application on a loopback port;
``--clients`` threads ask it the same 8 rows over and over. ps-1 is killed once a third of the
probes are in, the aggregator at two thirds; the job is stopped once all are. Prints the
probes, the versions they named, the answers that are not their version's (the figure: 0), the
server's joins and resyncs.

    .venv/bin/python scripts/bench_torn.py [--probes 100000] [--clients 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.serving.model import ExportedModel
from roles.testbed.jobs import ADULT_JOB, adult_rows
from roles.testbed.live_oracle import Asking, Patches, Recorder, expected_answers
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.serving import ServerThread


def until(answers: list[list], count: int, c: LocalCluster, timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(len(a) for a in answers) < count:
        if time.monotonic() > deadline or c.procs["control-0"].poll() is not None:
            raise SystemExit(f"{count:,} probes not in (the job ended?)\n{c.logs()[-3000:]}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--publish-ms", type=int, default=50)
    args = ap.parse_args()
    patches = Patches()
    recorder = Recorder(patches.set)
    table = adult_rows(8)
    asking = Asking(table)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-torn-") as tmp:
        c = LocalCluster(Path(tmp) / "job", ADULT_JOB, in_process=True, train__epochs=4000,
                         checkpoint__every_s=1.0, checkpoint__keep=1000,
                         serving__publish_ms=args.publish_ms, cluster__node_timeout_s=2.0)
        try:
            (c.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            with ServerThread(follow=str(c.run_dir), poll_s=0.05) as server:
                answers = [asking.start(server.url) for _ in range(args.clients)]
                c.start_all(slowdown={0: 6.0, 1: 6.0})
                c.wait_for_event(lambda e: e["event"] == "epoch_start")
                c.checkpoint()
                until(answers, args.probes // 3, c)
                c.procs["ps-1"].kill()
                c.wait_for_event(lambda e: e["event"] == "shard_lost" and e["node"] == "ps-1")
                c.start_role("ps", 1, name="ps-1-again")
                recovered = c.wait_for_event(lambda e: e["event"] == "shard_recovered")
                until(answers, 2 * args.probes // 3, c)
                c.procs["aggregator-0"].kill()
                c.start_role("aggregator", 0, name="aggregator-0-again")
                c.wait_for_event(lambda e: e["event"] == "restore")
                until(answers, args.probes, c)
                asking.stop()
                follower = getattr(server.follower, "inner", None) or server.follower
                joins, resyncs = follower.joins, list(follower.resyncs)
            c.kill_all()
            probed_s = time.monotonic() - started
            every = [a for client in answers for a in client]
            _, again = recorder.incarnations(1)   # ps-1's rows went back to a checkpoint
            restored = ExportedModel(c.run_dir / "checkpoints"
                                     / f"{recovered['checkpoint']:06d}")
            theirs = restored.owners.owner_of(restored.keys) == 1
            bases = {again: dict(zip(restored.keys[theirs].tolist(), restored.rows[theirs],
                                     strict=True))}
            versions = {v for v, _ in every}
            checking = time.monotonic()
            expected = expected_answers(c, recorder, versions, table, Path(tmp) / "rows.csv",
                                        bases)
            torn = sum(not np.allclose(got, expected[v], rtol=0, atol=1e-6)
                       for v, got in every)
            checked_s = time.monotonic() - checking
        finally:
            asking.stop()
            c.close()
            patches.undo()
    live = sum(v.count(".") == 2 for v in versions)
    print(f"CPU: {cpu_name()}; Adult, cuts every {args.publish_ms} ms, {args.clients} clients")
    print(f"{len(every):,} probes in {probed_s:.0f} s ({len(every) / probed_s:,.0f}/s), naming "
          f"{len(versions):,} versions ({live:,} live cuts), checked in {checked_s:.0f} s")
    print(f"ps-1 and the aggregator killed and started again; the server joined {joins} "
          f"times, resynced {len(resyncs)}: {'; '.join(resyncs[:3])}")
    print(f"answers not their version's: {torn}")


if __name__ == "__main__":
    main()
