"""Benchmark: zbus's graph partitioner (roles.model.partitioner) against METIS (pymetis) and a
random balanced partition, in one run, on the traced networks of the example jobs, of the
built-in ``dlrm`` and ``dcn`` on a Criteo-like layout (26 categorical fields, 13 dense) and of
``din`` on synthetic items with a history sequence, and on random layered DAGs of 1k and 10k
nodes, k = 2, 4, 8. zbus runs twice: the default choice of which
boundary sub-task moves first (the largest gain, ``pick = "gain"``) and the method's (flow
order, ``pick = "flow"``); both with the default target ``every``.

Each figure is over ``--seeds`` graphs: cut critical edges summed, balance (max part load /
mean) the worst, run time the median. METIS gets the same balance bound (ufactor) and edge
weights that make a critical edge cost 1000 and any other 1, so it minimises the same thing.
A traced network's edges whose value is not a float tensor must stay uncut: every method gets
the sub-tasks they join as one unit (zbus contracts them itself; METIS and the random partition
are given the units as vertices).
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

from roles.job.settings import Job, load_job, parse_job  # noqa: E402
from roles.model.graph import task_graph, trace_job  # noqa: E402
from roles.model.partitioner import (  # noqa: E402
    PartitionSettings,
    balance_of,
    cut_counts,
    partition,
    units,
)
from roles.model.task_graph import TaskGraph, layered_dag  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def metis(g: TaskGraph, k: int, balance: float) -> tuple[np.ndarray, float]:
    """METIS cannot pin nor keep an edge uncut: sub-tasks pinned to one part (a traced
    network's inputs and output) are merged into one vertex, whose part is then called 0, and
    so are the sub-tasks joined by uncut edges (``units``)."""
    import pymetis

    vertex = units(g)
    for part in set(g.pinned.values()):
        pinned = [node for node, p in g.pinned.items() if p == part]
        vertex[np.isin(vertex, vertex[pinned])] = vertex[pinned[0]]
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
    """Units (sub-tasks, or those joined by uncut edges) in random order, each to the part
    with the least load so far."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    unit = units(g)
    cost = np.bincount(unit, weights=g.cost)
    assign = np.zeros(len(cost), dtype=np.int64)
    loads = np.zeros(k)
    for i in rng.permutation(len(cost)):
        p = int(np.argmin(loads))
        assign[i] = p
        loads[p] += cost[i]
    return assign[unit], time.perf_counter() - started


def traced(job: Job) -> TaskGraph:
    g = task_graph(trace_job(job))
    g.mark_critical(job.partition.critical_bytes, job.partition.critical_path)
    return g


CRITEO_LIKE = ('[data]\nsource = "synthetic"\n[data.synthetic]\nvocab = [{vocab}]\ndense = 13\n'
               '[model]\nnetwork = "{network}"\n[train]\nsync = "every"\n')
DIN = ('[data]\nsource = "synthetic"\n[data.synthetic]\nitems = 1000\nhistory = 20\n'
       '[model]\nnetwork = "din"\n[model.pooling]\nhistory = "none"\n[model.max_len]\n'
       'history = 20\n[train]\nsync = "every"\n')


def builtin_jobs() -> list[tuple[str, Job]]:
    """dlrm and dcn on a Criteo-like layout (26 categorical fields of 1,000 to 1M values, 13
    dense), din on synthetic items with a history sequence of 20; the jobs' other settings
    (embedding width, hidden layers, batch size, [partition]) are the defaults."""
    vocab = ", ".join(str(int(v)) for v in np.geomspace(1_000, 1_000_000, 26))
    return [(f"traced {net}", parse_job(CRITEO_LIKE.format(vocab=vocab, network=net),
                                        environ={})) for net in ("dlrm", "dcn")] \
        + [("traced din", parse_job(DIN, environ={}))]


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
        (f"traced {Path(name).stem}", [traced(load_job(str(REPO / name)))])
        for name in ("jobs/adult.toml", "jobs/adult_mp.toml")]
    cases += [(name, [traced(job)]) for name, job in builtin_jobs()]
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
