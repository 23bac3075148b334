#!/usr/bin/env python
"""The cluster against the strong single process (``zbus-reference --preload``), end to end.

Each repeat runs, back to back, the preloaded single process restricted to the cluster worker's
torch threads (``[train] torch_threads``, else what zbus gives a worker on this host: "one"),
the same on every core ("all"; ``--sides`` picks), and the cluster on this host over TCP
loopback (no checkpoints), each from its command's start to the evaluated model. Every run reads
the data as if for the first time: a cache directory of its own (the index, the statistics),
unless ``--cached``. The table gives
medians over the repeats of samples/s (training only), end to end (s), AUC and peak RSS, and
the medians of the paired ratios (each cluster run against the runs just before it).

Cases (``--case``):

- ``adult``: ``jobs/adult.toml``, 1 worker and 1 shard, batch 1024 (the job's 3 epochs): the
  small model, where the bus's overhead weighs most; the figure is samples/s.
- ``criteo``: a Criteo-layout file (``scripts/make_criteo.py``; ``--file``), 26 categorical and
  13 dense fields, embedding dim 16, MLP ``--hidden``, batch 1024, 1 epoch, 2 workers and 2
  shards, eval the last 20 %: the figure is the end-to-end time (load, train, evaluate).

    .venv/bin/python scripts/bench_e2e.py --case adult [--repeats 3]
    .venv/bin/python scripts/bench_e2e.py --case criteo --file /tmp/big/criteo-10m.tsv
        [--repeats 1] [--sides all] [--hidden 256,128] [--set train__sync_every=16 ...]
        [--cached] [--dir DIR] [--out r.json]
    .venv/bin/python scripts/bench_e2e.py --case criteo --file /tmp/big/criteo-45m.tsv \
        --sides none --repeats 1      # the cluster alone: every role's peak RSS, first batch
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psutil

from roles.job.settings import load_job
from roles.model.network import auto_threads

REPO = Path(__file__).resolve().parent.parent
from roles.testbed.local_cluster import (  # noqa: E402  (the test harness)
    LocalCluster,
    clean_environ,
    setting_pair,
    toml_value,
)

TIMES = ("end_to_end_s", "load_s", "train_s", "eval_s")   # seconds: fewer is faster
TOLERANCE = 0.003   # the cluster's AUC within this of the single process's (Criteo)
FIRST_BATCH = re.compile(r"first batch acknowledged: ([0-9.]+) s after start")   # feeder's log


def adult_case(args, work: Path) -> tuple[Path, dict]:
    return REPO / "jobs" / "adult.toml", {"cluster__workers": 1, "cluster__shards": 1,
                                          "train__batch_size": 1024}


def criteo_case(args, work: Path) -> tuple[Path, dict]:
    if not Path(args.file).exists():
        raise SystemExit(f"{args.file} does not exist: make it with scripts/make_criteo.py "
                         "--rows N --out FILE")
    job = work / "criteo.toml"
    hidden = [int(h) for h in args.hidden.split(",")]
    job.write_text(f'name = "e2e-criteo"\n[data]\npath = "{Path(args.file).absolute()}"\n'
                   f'format = "criteo"\neval_fraction = 0.2\n\n[model]\nembedding_dim = 16\n'
                   f"hidden = {toml_value(hidden)}\n\n[train]\nepochs = 1\nbatch_size = 1024\n"
                   f"\n[cluster]\nworkers = 2\nshards = 2\nfeeders = 1\n")
    return job, {}


CASES = {"adult": adult_case, "criteo": criteo_case}


def preloaded(job: Path, settings: dict, threads: int, cache: Path) -> dict:
    env = {**clean_environ(), **{f"ZBUS_{k.upper()}": toml_value(v) for k, v in
                                 settings.items()}, "ZBUS_CACHE_DIR": str(cache)}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "roles.tools.reference", "--preload",
                          "--threads", str(threads), "--job", str(job)], capture_output=True,
                         text=True, env=env, cwd=REPO)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"zbus-reference --preload failed:\n{out.stderr[-3000:]}")
    got = orjson.loads(out.stdout)
    return {"auc": got["auc"], "samples_per_s": got["samples_per_s"], "end_to_end_s": wall,
            "load_s": got["load_s"], "train_s": got["train_s"], "eval_s": got["eval_s"],
            "peak_rss_mb": got["peak_rss_mb"], "threads": threads,
            "samples_trained": got["samples_trained"]}


def high_water(pid: int) -> int:
    """The process's peak RSS so far (the kernel's VmHWM: exact, also between two polls), in
    bytes; 0 where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cluster(job: Path, settings: dict, workdir: Path, cache: Path) -> dict:
    """A run of the cluster, its end to end from the first process's start to control's exit,
    and the peak RSS of its largest process (the kernel's high-water mark, read every 0.2 s
    until the process ends)."""
    peak: dict[str, int] = {}
    with LocalCluster(workdir, job, transport="tcp", **settings,
                      data__cache_dir=str(cache)) as c:
        started = time.monotonic()
        c.start_all()
        while c.procs["control-0"].poll() is None and time.monotonic() - started < 3600:
            for name, proc in c.procs.items():
                try:
                    rss = max(psutil.Process(proc.pid).memory_info().rss, high_water(proc.pid))
                    peak[name] = max(peak.get(name, 0), rss)
                except psutil.Error:
                    continue
            time.sleep(0.2)
        if c.wait(timeout=60) != 0:
            raise SystemExit(f"cluster run failed: {c.summary().get('reason')}\n{c.logs()}")
        wall = time.monotonic() - started
        s = c.summary()
        first = FIRST_BATCH.search((workdir / "feeder-0.log").read_text(errors="replace"))
    return {"auc": s["auc"], "samples_per_s": s["samples_per_s"], "end_to_end_s": wall,
            "peak_rss_mb": max(peak.values(), default=0) / 2**20,
            "peak_rss_mb_by_role": {name: round(rss / 2**20) for name, rss in
                                    sorted(peak.items())},
            "first_batch_s": float(first.group(1)) if first else None,
            "samples_trained": s["samples_trained"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="adult")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--file", default="/tmp/big/criteo-10m.tsv", help="criteo's data")
    parser.add_argument("--hidden", default="256,128", help="criteo's MLP")
    parser.add_argument("--sides", default="", help="the preloaded runs: one (the worker's "
                        "threads), all (every core), or one,all (default: adult one,all, "
                        "criteo all); none: the cluster alone (data too large for one "
                        "process's memory)")
    parser.add_argument("--cached", action="store_true",
                        help="keep one cache directory (index, statistics) for every run")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION__KEY=VALUE",
                        help="a job setting for every run, e.g. train__epochs=1")
    parser.add_argument("--dir", default="", help="where the runs go (default: a temporary "
                        "directory)")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()
    sides = (args.sides or ("one,all" if args.case == "adult" else "all")).split(",")
    sides = [] if sides == ["none"] else sides
    if not set(sides) <= {"one", "all"}:
        parser.error(f"--sides: one, all or one,all, not {args.sides!r}")
    result: dict = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "command": " ".join(sys.argv), "case": args.case,
                    "load_average": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.dir or tmp).absolute()
        work.mkdir(parents=True, exist_ok=True)
        job_file, settings = CASES[args.case](args, work)
        settings = {"checkpoint__every_s": 0, **settings,
                    **dict(setting_pair(kv) for kv in args.set)}
        env = {**clean_environ(), **{f"ZBUS_{k.upper()}": toml_value(v)
                                     for k, v in settings.items()}}
        job = load_job(str(job_file), environ=env)
        cpus = os.cpu_count() or 1
        worker_threads = job.train.torch_threads or auto_threads(job.cluster, cpus)
        result.update(worker_threads=worker_threads, cpus=cpus)
        for r in range(args.repeats):
            def cache(name: str, r: int = r) -> Path:
                return work / ("cache" if args.cached else f"cache-{name}-{r}")

            threads = {"one": worker_threads, "all": cpus}
            run = {side: preloaded(job_file, settings, threads[side], cache(side))
                   for side in sides}
            run["cluster"] = cluster(job_file, settings, work / f"cluster-{r}", cache("cluster"))
            result["runs"].append(run)
            print(f"run {r + 1}: " + "; ".join(
                f"{side} auc {g['auc']:.4f} {g['samples_per_s']:,.0f}/s end to end "
                f"{g['end_to_end_s']:.1f} s" for side, g in run.items()), flush=True)
    report(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))


def median_of(runs: list[dict], side: str, key: str) -> float:
    values = [r[side][key] for r in runs if r[side].get(key) is not None]
    return statistics.median(values) if values else float("nan")


def paired_ratio(runs: list[dict], side: str, key: str) -> float:
    """How many times the cluster's figure ``side``'s is, each run against its pair, median:
    samples/s as the cluster's over ``side``'s, a time (``TIMES``) as ``side``'s over the
    cluster's (above 1: the cluster is the faster either way)."""
    return statistics.median(r[side][key] / r["cluster"][key] if key in TIMES else
                             r["cluster"][key] / r[side][key] for r in runs)


def report(result: dict) -> None:
    runs = result["runs"]

    def med(side: str, key: str) -> float:
        return median_of(runs, side, key)

    one, n = result["worker_threads"], result["cpus"]
    print(f"\n{result['case']}, medians of {len(runs)} interleaved runs; load average at the "
          f"start {', '.join(f'{x:.1f}' for x in result['load_average'])}")
    print("| run | AUC | samples/s | end to end (s) | peak RSS (MB, largest process) |")
    print("|---|---|---|---|---|")
    names = {"one": f"preloaded, {one} thread(s)", "all": f"preloaded, {n} threads",
             "cluster": "cluster"}
    sides = [side for side in names if side in runs[0]]
    for side in sides:
        name = names[side]
        print(f"| {name} | {med(side, 'auc'):.4f} | {med(side, 'samples_per_s'):,.0f} | "
              f"{med(side, 'end_to_end_s'):.1f} | {med(side, 'peak_rss_mb'):,.0f} |")
    for side in sides[:-1]:
        print(f"cluster against {names[side]}: samples/s "
              f"{paired_ratio(runs, side, 'samples_per_s'):.2f}x, end to end "
              f"{paired_ratio(runs, side, 'end_to_end_s'):.2f}x as fast (medians of the paired "
              f"ratios); AUC {med('cluster', 'auc') - med(side, 'auc'):+.4f}")
    cluster_runs = [r["cluster"] for r in runs]
    print("cluster's first batch (s after the feeder's start): " + ", ".join(
        f"{r['first_batch_s']}" for r in cluster_runs))
    for r in cluster_runs:
        print("cluster's peak RSS by role (MB): " + ", ".join(
            f"{name} {mb:,}" for name, mb in r["peak_rss_mb_by_role"].items()))
    for side in sides[:-1]:
        print(f"{names[side]}: load {med(side, 'load_s'):.1f} s, train "
              f"{med(side, 'train_s'):.1f} s, eval {med(side, 'eval_s'):.1f} s")
    if result["case"] == "criteo" and len(sides) > 1:
        gap = abs(med("cluster", "auc") - med(sides[-2], "auc"))
        print(f"AUC within {TOLERANCE} of the preloaded process: "
              f"{'yes' if gap <= TOLERANCE else 'no'} ({gap:.4f})")


if __name__ == "__main__":
    main()
