"""Benchmark: zbus's graph partitioner (roles.model.partitioner) against METIS (pymetis) and a
random balanced partition, in one run, on the traced networks of the example jobs and on random
layered DAGs of 1k and 10k nodes, k = 2, 4, 8. zbus runs twice: the default choice of which
boundary sub-task moves first (the largest gain, ``pick = "gain"``) and the method's (flow
order, ``pick = "flow"``); both with the default target ``every``.

Each figure is over ``--seeds`` graphs: cut critical edges summed, balance (max part load /
mean) the worst, run time the median. METIS gets the same balance bound (ufactor) and edge
weights that make a critical edge cost 1000 and any other 1, so it minimises the same thing.
Targets: cut critical edges within 1.1x of METIS at the balance bound; a 10k-node graph in
under 5 s.

    .venv/bin/pip install pymetis        # benchmark-only dependency
    .venv/bin/python scripts/bench_partition.py [--seeds 3] [--balance 1.2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from roles.job.settings import load_job  # noqa: E402
from roles.model.graph import example_inputs, task_graph, trace  # noqa: E402
from roles.model.network import build_model  # noqa: E402
from roles.model.partitioner import PartitionSettings, balance_of, cut_counts, partition  # noqa: E402
from roles.model.task_graph import TaskGraph, layered_dag  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def metis(g: TaskGraph, k: int, balance: float) -> tuple[np.ndarray, float]:
    """METIS cannot pin: sub-tasks pinned to one part (a traced network's inputs and output)
    are merged into one vertex, whose part is then called 0."""
    import pymetis

    vertex = np.arange(g.n)
    for part in set(g.pinned.values()):
        pinned = [node for node, p in g.pinned.items() if p == part]
        vertex[pinned] = pinned[0]
    _, vertex = np.unique(vertex, return_inverse=True)
    n = int(vertex.max()) + 1
    keep = vertex[g.src] != vertex[g.dst]
    src, dst = vertex[g.src][keep], vertex[g.dst][keep]
    a, b = np.concatenate([src, dst]), np.concatenate([dst, src])
    crit = g.critical[keep]
    w = np.concatenate([crit, crit]).astype(np.int64) * 999 + 1
    pair, inverse = np.unique(a * n + b, return_inverse=True)
    w = np.bincount(inverse, weights=w).astype(np.int64)
    a, b = pair // n, pair % n
    xadj = np.concatenate([[0], np.cumsum(np.bincount(a, minlength=n))])
    cost = np.bincount(vertex, weights=g.cost, minlength=n)
    weights = np.maximum(1, np.round(cost / max(cost.max(), 1e-12) * 10_000)).astype(int)
    started = time.perf_counter()
    with quiet_stdout():  # METIS prints when k exceeds what a tiny graph can give
        _, parts = pymetis.part_graph(
            k, adjacency=pymetis.CSRAdjacency(xadj.tolist(), b.tolist()),
            vweights=weights.tolist(), eweights=w.tolist(),
            options=pymetis.Options(ufactor=int(round((balance - 1) * 1000))))
    took = time.perf_counter() - started
    parts = np.asarray(parts, dtype=np.int64)[vertex]
    if g.pinned:
        node, part = next(iter(g.pinned.items()))
        swap = {part: int(parts[node]), int(parts[node]): part}
        parts = np.array([swap.get(int(p), int(p)) for p in parts], dtype=np.int64)
    return parts, took


@contextlib.contextmanager
def quiet_stdout():
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def random_balanced(g: TaskGraph, k: int, seed: int) -> tuple[np.ndarray, float]:
    """Sub-tasks in random order, each to the part with the least load so far."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    assign = np.zeros(g.n, dtype=np.int64)
    loads = np.zeros(k)
    for i in rng.permutation(g.n):
        p = int(np.argmin(loads))
        assign[i] = p
        loads[p] += g.cost[i]
    return assign, time.perf_counter() - started


def traced(job_file: str) -> TaskGraph:
    job = load_job(str(REPO / job_file))
    g = task_graph(trace(build_model(job), example_inputs(job)))
    g.mark_critical(job.partition.critical_bytes, job.partition.critical_path)
    return g


def measure(graphs: list[TaskGraph], k: int, balance: float) -> dict[str, tuple]:
    rows: dict[str, list] = {"zbus": [], "flow": [], "metis": [], "random": []}
    for seed, g in enumerate(graphs):
        for name, pick in (("zbus", "gain"), ("flow", "flow")):
            result = partition(g, PartitionSettings(parts=k, balance=balance, seed=seed,
                                                    pick=pick))
            rows[name].append((result.assign, result.seconds))
        rows["metis"].append(metis(g, k, balance))
        rows["random"].append(random_balanced(g, k, seed))
    out = {}
    for name, runs in rows.items():
        cut = sum(cut_counts(g, a)[0] for g, (a, _) in zip(graphs, runs, strict=True))
        worst = max(balance_of(g, a, k) for g, (a, _) in zip(graphs, runs, strict=True))
        out[name] = (cut, worst, statistics.median(t for _, t in runs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--balance", type=float, default=1.2)
    args = parser.parse_args()
    try:
        import pymetis  # noqa: F401
    except ImportError:
        sys.exit("pymetis is a benchmark-only dependency: .venv/bin/pip install pymetis")
    cases: list[tuple[str, list[TaskGraph]]] = [
        (f"traced {name}", [traced(name)]) for name in ("jobs/adult.toml", "jobs/adult_mp.toml")]
    cases += [(f"layered {n // 1000}k", [layered_dag(n, seed=s) for s in range(args.seeds)])
              for n in (1000, 10_000)]
    print(f"balance bound {args.balance}; cut = cut critical edges summed over the graphs; "
          "bal = worst max/mean load; s = median seconds; zbus = pick gain (the default), "
          "flow = pick flow (the method's)\n")
    print(f"{'graph':<18}{'k':>2} {'edges':>6} {'crit':>5}  {'zbus cut':>8} {'bal':>5} "
          f"{'s':>5}  {'flow cut':>8} {'bal':>5} {'s':>5}  {'metis cut':>9} {'bal':>5} "
          f"{'s':>6}  {'random':>6}  {'zbus/metis':>10} {'flow/metis':>10}")
    met = True
    totals = {"zbus": 0, "flow": 0, "metis": 0}
    for name, graphs in cases:
        for k in (2, 4, 8):
            r = measure(graphs, k, args.balance)
            (zc, zb, zt), (fc, fb, ft) = r["zbus"], r["flow"]
            (mc, mb, mt), (rc, _, _) = r["metis"], r["random"]
            ratio, fratio = ratio_of(zc, mc), ratio_of(fc, mc)
            edges = sum(g.m for g in graphs) // len(graphs)
            crit = sum(int(g.critical.sum()) for g in graphs) // len(graphs)
            print(f"{name:<18}{k:>2} {edges:>6} {crit:>5}  {zc:>8} {zb:>5.2f} {zt:>5.2f}  "
                  f"{fc:>8} {fb:>5.2f} {ft:>5.2f}  {mc:>9} {mb:>5.2f} {mt:>6.3f}  {rc:>6}  "
                  f"{ratio:>10.2f} {fratio:>10.2f}")
            if name.startswith("layered"):
                met &= ratio <= 1.1 and zb <= args.balance + 1e-9
                met &= not (name == "layered 10k" and zt >= 5.0)
                totals["zbus"] += zc
                totals["flow"] += fc
                totals["metis"] += mc
    print(f"\nlayered DAGs, cut critical edges summed: zbus (pick gain) {totals['zbus']}, "
          f"pick flow {totals['flow']}, METIS {totals['metis']}: flow / gain "
          f"{ratio_of(totals['flow'], totals['zbus']):.2f}")
    print(f"targets (layered DAGs: zbus/metis <= 1.10 within the bound; 10k nodes < 5 s): "
          f"{'met' if met else 'NOT met'}")


def ratio_of(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == 0 else float("inf"))


if __name__ == "__main__":
    main()
