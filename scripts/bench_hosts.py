#!/usr/bin/env python
"""Where the time goes across hosts: the Adult job on loopback and across three namespaces.

The same job (jobs/adult.toml: 2 workers, 2 shards, a fixed number of epochs) runs (1) with
every role on this host over TCP 127.0.0.1, and (2) in three network namespaces in the layout of
the many-hosts walk-through (``tests/processes/test_hosts.py``: control and the aggregator on
host a, the
feeder and shard 0 on b, shard 1 and both workers on c), the roles started with
``scripts/run-<role> --cluster cluster.toml``. The hosts' links meet in a hub namespace: the
kernel's bridge for RTT 0, else a user-space delay bridge (``roles/testbed/delay_bridge.py``; this
kernel has no ``tc netem``) that holds every frame RTT/2; ``--rates`` adds ``tc tbf`` on each
link. Each cell runs with CURVE on and off; the cells are interleaved, ``--repeats`` times.

Per cell: samples/s (median), its ratio to loopback (CURVE off), batches/s, what a worker waited
for per batch (its sample, grant, embeddings, weights: the summary's ``worker_waits``), bytes per
sample on each host's link (the hub's counters, up + down) and by channel (zbus's own counters).
First, the bridge's own ceiling: one TCP stream through it with no delay (MB/s).

    .venv/bin/python scripts/bench_hosts.py [--epochs 2] [--repeats 1] [--rtts 0,0.1,1]
        [--curve on,off] [--rates none,1gbit] [--vary train__grants_ahead=1,2]
        [--out bench_hosts.json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
from roles.job.settings import load_job  # noqa: E402
from roles.job.summary import read_summary  # noqa: E402
from roles.testbed.local_cluster import LocalCluster, clean_environ  # noqa: E402  (the test harness)
from roles.testbed.netns import HOSTS, Hosts, namespaces_allowed  # noqa: E402
from roles.tools.keys import make_keys  # noqa: E402
from zbus.security import OPERATOR  # noqa: E402

JOB = REPO / "jobs" / "adult.toml"
A, B, C = HOSTS["a"], HOSTS["b"], HOSTS["c"]
ENDPOINTS = {"control": f"{A}:47100", "control_pub": f"{A}:47101", "control_req": f"{A}:47106",
             "status": f"{A}:47107", "aggregator": f"{A}:47104", "aggregator_pub": f"{A}:47105",
             "samples": f"{B}:47102", "ledger": f"{B}:47103", "ps-0": f"{B}:47110",
             "ps-1": f"{C}:47111"}
STARTS = [("a", "control", []), ("a", "aggregator", ["--index", "0"]),
          ("b", "feeder", ["--index", "0"]), ("b", "ps", ["--index", "0"]),
          ("c", "ps", ["--index", "1"]), ("c", "worker", ["--index", "0"]),
          ("c", "worker", ["--index", "1"])]
WAITS = ("samples", "grant", "embeddings", "weights")
TIMEOUT_S = 900


def figures(s: dict, links: dict[str, dict[str, int]] | None) -> dict:
    """One run's figures from its summary (and its links' byte counts)."""
    if not s.get("ok"):
        raise RuntimeError(f"the job failed: {s.get('status')} {s.get('reason')}")
    processed = s["samples_trained"] + (s.get("eval_samples") or 0) * s["epochs"]
    batches = max(1, s["worker_waits"]["batches"])
    per_sample = {ch: round(n / processed, 1) for ch, n in s["bytes"].items() if n}
    out = {"samples_per_s": s["samples_per_s"], "train_s": s["train_s"], "auc": s["auc"],
           "batches_per_s": s["samples_per_s"] / load_job(JOB).train.batch_size,
           "wait_ms_per_batch": s["worker_waits"]["ms_per_batch"],
           "compute_ms_per_batch": round(1000 * sum(
               w["compute_s"] for w in s["worker_time_s"].values()) / batches, 3),
           "worker_batches": batches,
           "channel_bytes_per_sample": per_sample,
           "embedding_wait_median_ms": s["embeddings"]["median_ms"],
           "busy": s["busy"], "rejected_messages": s["rejected_messages"],
           "take_windows": s.get("take_windows", {})}
    if links is not None:
        out["link_bytes_per_sample"] = {h: round((v["up"] + v["down"]) / processed, 1)
                                        for h, v in links.items()}
    return out


def run_loopback(workdir: Path, epochs: int, curve: str, threads: int,
                 settings: dict[str, str]) -> dict:
    keys = workdir / "keys"
    with LocalCluster(workdir, JOB, transport="tcp", train__epochs=epochs, cluster__curve=curve,
                      cluster__keys_dir=str(keys), **settings,
                      **({"train__torch_threads": threads} if threads else {})) as c:
        make_keys(keys, [*c.job.cluster.expected_nodes(), "control-0", OPERATOR])
        if c.run_job(timeout=TIMEOUT_S) != 0:
            raise RuntimeError(f"loopback run failed:\n{c.logs()}")
        return figures(c.summary(), None)


def run_namespaces(workdir: Path, epochs: int, curve: str, rtt_ms: float, rate: str | None,
                   mtu: int, threads: int, settings: dict[str, str]) -> dict:
    workdir.mkdir(parents=True)
    cluster_file = workdir / "cluster.toml"
    cluster_file.write_text("[endpoints]\n" + "".join(
        f'"{n}" = "{v}"\n' for n, v in ENDPOINTS.items()))
    env = {**clean_environ(), "ZBUS_CLUSTER__KEYS_DIR": str(workdir / "keys"),
           "ZBUS_RUN_DIR": str(workdir / "run"), "ZBUS_TRAIN__EPOCHS": str(epochs),
           "ZBUS_CLUSTER__CURVE": curve, "ZBUS_CLUSTER_FILE": str(cluster_file),
           "ZBUS_JOB": str(JOB),
           **({"ZBUS_TRAIN__TORCH_THREADS": str(threads)} if threads else {}),
           **{f"ZBUS_{k.upper()}": v for k, v in settings.items()}}
    job = load_job(None, environ=env)
    make_keys(workdir / "keys", [*job.cluster.expected_nodes(), "control-0", OPERATOR])
    procs: dict[str, subprocess.Popen] = {}
    with Hosts(rtt_ms=rtt_ms or None, rate=rate, mtu=mtu, workdir=workdir) as hosts:
        try:
            for host, role, args in STARTS:
                name = f"{role}-{args[-1] if args else 0}"
                with open(workdir / f"{name}.log", "wb") as log:
                    procs[name] = hosts.popen(
                        host, [str(REPO / "scripts" / f"run-{role}"), "--cluster",
                               str(cluster_file), "--job", str(JOB), *args],
                        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
            if procs["control-0"].wait(timeout=TIMEOUT_S) != 0:
                raise RuntimeError("control failed:\n" + "\n".join(
                    f"--- {n}\n{(workdir / f'{n}.log').read_text()[-1500:]}" for n in procs))
            links = hosts.link_bytes()
        finally:
            stop(procs)
    out = figures(read_summary(workdir / "run"), links)
    if hosts.bridge_stats:
        out["bridge"] = {k: hosts.bridge_stats[k]
                         for k in ("frames", "super_frames", "largest", "send_errors")}
    return out


def stop(procs: dict[str, subprocess.Popen]) -> None:
    """SIGTERM every role's process group, then SIGKILL what is left."""
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def ceilings(mtu: int, rates: list[str | None], seconds: float) -> dict:
    """MB/s of one TCP stream a -> c: the kernel's bridge, the delay bridge with no delay, and
    the delay bridge under each rate (whether it reaches the rate)."""
    out = {}
    with Hosts(mtu=mtu) as hosts:
        out["kernel_bridge"] = hosts.probe("a", "c", "stream", str(seconds))["mb_per_s"]
    for rate in [None, *(r for r in rates if r)]:
        with Hosts(rtt_ms=0.0, rate=rate, mtu=mtu) as hosts:
            out[f"delay_bridge{'' if rate is None else ' ' + rate}"] = \
                hosts.probe("a", "c", "stream", str(seconds))["mb_per_s"]
    return {k: round(v, 1) for k, v in out.items()}


def cell_name(rtt: float | None, curve: str, rate: str | None, variant: str = "") -> str:
    where = "loopback" if rtt is None else f"namespaces, RTT {rtt:g} ms" + (
        " (kernel bridge)" if rtt == 0 else "") + (f", {rate}" if rate else "")
    return f"{where}, CURVE {curve}" + (f", {variant}" if variant else "")


def variants(vary: str | None) -> list[tuple[str, dict[str, str]]]:
    """``--vary train__grants_ahead=1,2``: each value a variant of every cell (its name, its
    setting); none: one variant, the job as it is."""
    if not vary:
        return [("", {})]
    key, _, values = vary.partition("=")
    return [(f"{key.split('__')[-1]} {v}", {key: v}) for v in values.split(",")]


def table(cells: dict[str, list[dict]], baselines: dict[str, str]) -> str:
    """Medians per cell; × loopback: the ratio of medians, then the median of the ratios of
    each run to the loopback run of its repeat (the sturdier figure on a noisy machine), the
    loopback of the cell's own variant (``baselines``: cell -> its loopback cell)."""
    rows = ["| cell | samples/s | × loopback (paired) | batches/s | worker compute ms/batch "
            "| worker wait ms/batch: sample, grant, embeddings, weights "
            "| link bytes/sample a, b, c |",
            "|---|---|---|---|---|---|---|"]
    for name, runs in cells.items():
        if not runs:
            continue
        loopback = cells[baselines[name]]
        baseline = statistics.median(r["samples_per_s"] for r in loopback)
        sps = statistics.median(r["samples_per_s"] for r in runs)
        mid = min(runs, key=lambda r: abs(r["samples_per_s"] - sps))
        waits = ", ".join(f"{mid['wait_ms_per_batch'].get(w, 0):.2f}" for w in WAITS)
        links = mid.get("link_bytes_per_sample")
        linked = ", ".join(f"{links[h]:,.0f}" for h in HOSTS) if links else "—"
        paired = statistics.median(r["samples_per_s"] / base["samples_per_s"]
                                   for r, base in zip(runs, loopback, strict=False))
        rows.append(f"| {name} | {sps:,.0f} | {sps / baseline:.2f} ({paired:.2f}) | "
                    f"{mid['batches_per_s']:.1f} | {mid['compute_ms_per_batch']:.2f} | "
                    f"{waits} | {linked} |")
    return "\n".join(rows)


def interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def reprint(path: Path) -> None:
    """The table again from a JSON report."""
    report = orjson.loads(path.read_bytes())
    print(f"bridge ceiling (one TCP stream, MB/s): {report['ceiling_mb_per_s']}")
    print(table(report["cells"], report.get("baselines") or baselines_of(report["cells"], [""])))


def baselines_of(cells: dict[str, list[dict]], names: list[str]) -> dict[str, str]:
    """Each cell's loopback baseline: loopback with CURVE off of its variant, else the first
    cell of its variant."""
    out = {}
    for variant in names:
        own = [c for c in cells if c.endswith(f", {variant}")] if variant else \
            [c for c in cells if c.endswith(("CURVE on", "CURVE off"))]
        base = cell_name(None, "off", None, variant)
        for c in own:
            out[c] = base if base in cells else own[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rtts", default="0,0.1,1", help="ms; 0: the kernel's bridge")
    parser.add_argument("--curve", default="on,off")
    parser.add_argument("--rates", default="none", help="tc tbf rates, e.g. none,1gbit")
    parser.add_argument("--mtu", type=int, default=65535)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="per worker, in every cell (0: zbus's choice, which differs: "
                             "across hosts a worker takes every core of what is one machine)")
    parser.add_argument("--vary", help="a job setting to compare, each value a variant of "
                                       "every cell, interleaved: train__grants_ahead=1,2")
    parser.add_argument("--ceiling-s", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("bench_hosts.json"))
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--table", type=Path, help="print the table of this JSON report")
    args = parser.parse_args()
    if args.table:
        reprint(args.table)
        return
    why = namespaces_allowed()
    if why:
        raise SystemExit(f"cannot run across namespaces here: {why}")
    signal.signal(signal.SIGTERM, interrupted)  # cleaned up as on Ctrl-C
    curves = args.curve.split(",")
    rates = [None if r == "none" else r for r in args.rates.split(",")]
    where: list[tuple[float | None, str, str | None]] = [(None, c, None) for c in curves] + [
        (float(rtt), c, rate) for rate in rates for rtt in args.rtts.split(",") for c in curves]
    kinds = variants(args.vary)
    plan = [(*w, v) for w in where for v in kinds]
    cells: dict[str, list[dict]] = {cell_name(*p[:3], p[3][0]): [] for p in plan}
    report: dict = {"epochs": args.epochs, "repeats": args.repeats, "mtu": args.mtu,
                    "torch_threads": args.torch_threads, "vary": args.vary,
                    "load": os.getloadavg(), "cells": cells}
    report["ceiling_mb_per_s"] = ceilings(args.mtu, rates, args.ceiling_s)
    print(f"bridge ceiling (one TCP stream, MB/s): {report['ceiling_mb_per_s']}", flush=True)
    kept = contextlib.nullcontext(tempfile.mkdtemp(prefix="bench-hosts-", dir=args.keep)) \
        if args.keep else tempfile.TemporaryDirectory(prefix="bench-hosts-")
    with kept as tmp:
        for r in range(args.repeats):
            for i, (rtt, curve, rate, (variant, settings)) in enumerate(plan):
                workdir = Path(tmp) / f"{r}-{i}"
                got = run_loopback(workdir, args.epochs, curve, args.torch_threads, settings) \
                    if rtt is None else run_namespaces(workdir, args.epochs, curve, rtt, rate,
                                                       args.mtu, args.torch_threads, settings)
                name = cell_name(rtt, curve, rate, variant)
                cells[name].append(got)
                print(f"  run {r + 1}, {name}: "
                      f"{got['samples_per_s']:,.0f} samples/s, auc {got['auc']:.4f}, waits "
                      f"{got['wait_ms_per_batch']}, sample links "
                      f"{[w.get('sample_links') for w in got['take_windows'].values()]}",
                      flush=True)
    report["baselines"] = baselines_of(cells, [v for v, _ in kinds])
    report["load_after"] = os.getloadavg()
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(f"\nAdult, {args.epochs} epochs, medians of {args.repeats}; JSON in {args.out}")
    print(table(cells, report["baselines"]))


if __name__ == "__main__":
    main()
