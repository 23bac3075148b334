#!/usr/bin/env python
"""The built-in networks (`[model] network`), the cluster against one process, in one run.

Part A, "items": the synthetic generator's rows with items (`[data.synthetic] items = 1000,
history = 20`: a candidate `item`, its `genres` (a list) and the user's `history` (a sequence
sharing the table `item`)) written once per run to a TSV file with a header, then for each
network a file job on it (`[data] lists`, `[data.tables] item = ["item", "history"]`,
`[model.pooling] history = "none"`, `max_len` genres 3 and history 20; `din` with
`[model.options] candidate = "item"`): the cluster (2 workers, 2 shards, 1 feeder) and
`zbus-reference` (``train_reference``), and the ablation, the same job with `genres` and
`history` removed (din's ablation is mlp's: without a sequence din cannot run). The oracle AUC
is the generator's true probabilities on the eval split (the last eval_fraction of the rows);
beside it, that of the true logits less the history's planted term (the best without lists).

Part B, "criteo": a Criteo-layout file (``scripts/make_criteo.py``, made once and kept) and the
docs' Criteo job (bench_admission's: embedding dim 16, MLP 64-32, batch 1024, 1 epoch, sync
every 16): each network but din (the layout has no sequence), reference then cluster;
wide_deep with the crosses of ``--crosses`` (default one, C1 x C2).

Each run is a reference run then its cluster run, network after network, so that a noisy
machine weighs on both alike; with ``--repeats`` the table gives medians, and the speed ratio
as the median of the paired ratios. Samples/s is training only on both sides (start-up,
indexing and evaluation excluded); wall is from the start to the end of the run. The reference
runs at each torch thread count of ``--threads`` and the fastest counts (on a loaded 2-core
machine a second thread can be 20x slower; on a quiet one it can be 1.5x faster).

    .venv/bin/python scripts/bench_models.py [--rows 200000] [--criteo-rows 1000000]
        [--networks mlp,dlrm,dcn,deepfm,wide_deep,din] [--parts A,B] [--epochs 2]
        [--repeats 1] [--threads 1,2] [--criteo-file /tmp/criteo-1m.tsv] [--crosses C1*C2]
        [--dir /tmp/bench-models] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from roles.algorithms.shared.metrics import auc
from roles.data.source import DataSource
from roles.data.synthetic import BLOCK_ROWS
from roles.job.settings import NETWORKS, load_job
from roles.model.networks.registry import SEVERAL_LABELS
from roles.tools.reference import train_reference

REPO = Path(__file__).resolve().parent.parent
from roles.testbed.local_cluster import LocalCluster, clean_environ, toml_value  # noqa: E402  (the harness)

ITEMS, HISTORY, GENRES_LEN = 1000, 20, 3
DENSE = [f"d{i}" for i in range(4)]
SINGLE = [f"c{i}" for i in range(8)] + ["item"]
LISTS = ["genres", "history"]
ITEMS_BATCH = 256          # the built-in job's
CRITEO = {"dim": 16, "hidden": [64, 32], "batch": 1024, "epochs": 1, "sync_every": 16}
TOLERANCE = 0.003          # the cluster's AUC within this of its reference's


# -- the data ----------------------------------------------------------------------------------
def write_items(rows: int, path: Path) -> tuple[float, float]:
    """The generator's rows with items as TSV (label, d0..d3, c0..c7, item, genres, history;
    lists joined with '|'), block by block; returns the oracle AUC on the eval split, and the
    AUC of the true logits less the history's term (the best a model without it can do)."""
    # numpy and pyarrow here, after roles: importing roles first keeps numpy's BLAS pool to
    # one thread (roles/__init__.py), which a numpy imported before it would not
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as csv

    env = clean_environ()
    env.update({"ZBUS_DATA__SOURCE": "synthetic", "ZBUS_DATA__SYNTHETIC__ROWS": str(rows),
                "ZBUS_DATA__SYNTHETIC__ITEMS": str(ITEMS),
                "ZBUS_DATA__SYNTHETIC__HISTORY": str(HISTORY)})
    source = DataSource(load_job(None, environ=env))
    gen = source.generator
    options = csv.WriteOptions(include_header=True, delimiter="\t", quoting_style="none")
    writer, labels, logits = None, [], []
    for lo in range(0, rows, BLOCK_ROWS):
        b = gen.rows_between(lo, min(rows, lo + BLOCK_ROWS))
        labels.append(b.labels)
        logits.append(np.log(b.probs / (1 - b.probs)) - history_term(gen, lo // BLOCK_ROWS,
                                                                      len(b.labels)))
        columns = {"label": pa.array(b.labels.astype(np.int8))}
        for j, name in enumerate(DENSE):
            columns[name] = pa.array(b.dense[:, j].astype(np.int64))   # no missing (0.0)
        for j, name in enumerate(SINGLE):
            columns[name] = pa.array(b.values[:, j])
        columns["genres"] = joined((b.genres >= 0).sum(axis=1), b.genres[b.genres >= 0])
        columns["history"] = joined(b.history_lengths, b.history)
        table = pa.table(columns)
        if writer is None:
            writer = csv.CSVWriter(str(path), table.schema, write_options=options)
        writer.write_table(table)
    writer.close()
    _, parts, _ = source.index()
    n_eval = sum(p.rows for p in parts if p.eval)
    return auc(*source.oracle_scores(parts)), auc(np.concatenate(labels)[-n_eval:],
                                                  np.concatenate(logits)[-n_eval:])


def history_term(gen, b: int, n: int):
    """The planted logit's interest term (affinity × the share of the history sharing a genre
    with the candidate) of block b's first n rows: the item terms less the candidate's own."""
    import numpy as np

    from roles.data.synthetic import hashed_normal

    items = gen._items(b)
    present = items.genres >= 0
    genre_w = np.where(present, hashed_normal(gen.genre_seed, np.maximum(items.genres, 0)), 0)
    own = gen.signal * (hashed_normal(gen.item_seed, items.item)
                        + genre_w.sum(axis=1) / present.sum(axis=1))
    return (items.logit - own)[:n]


def joined(lengths, ids):
    """Row i: the next lengths[i] ids joined with '|' (an empty list is an empty value)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets),
                                                   pa.array(ids).cast(pa.string())), "|")


def criteo_file(rows: int, path: Path) -> Path:
    if not path.exists():
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_criteo.py"), "--rows",
                        str(rows), "--out", str(path)], check=True, cwd=REPO)
    return path


# -- the jobs ----------------------------------------------------------------------------------
def items_job(network: str, tsv: Path, lists: bool, epochs: int, cache: Path) -> str:
    sparse = SINGLE + (LISTS if lists else [])
    text = (f'name = "models-{network}"\n[data]\npath = "{tsv}"\nformat = "tsv"\n'
            f'cache_dir = "{cache}"\neval_fraction = 0.2\ndense = {toml_value(DENSE)}\n'
            f"sparse = {toml_value(sparse)}\n")
    if lists:
        text += '\n[data.lists]\ngenres = "|"\nhistory = "|"\n[data.tables]\n' \
                'item = ["item", "history"]\n'
    text += (f'\n[model]\nnetwork = "{network}"\nembedding_dim = 16\nhidden = [128, 64]\n')
    if lists:
        text += (f'[model.pooling]\nhistory = "none"\n[model.max_len]\ngenres = {GENRES_LEN}\n'
                 f"history = {HISTORY}\n")
        if network == "din":   # the default candidate is the first single field, c0
            text += '[model.options]\ncandidate = "item"\n'
    return text + (f"\n[train]\nepochs = {epochs}\nbatch_size = {ITEMS_BATCH}\n"
                   "\n[cluster]\nworkers = 2\nshards = 2\nfeeders = 1\n")


def criteo_job(network: str, path: Path, cache: Path, crosses: list[list[str]]) -> str:
    c = CRITEO
    options = f"[model.options]\ncrosses = {toml_value(crosses)}\n" \
        if network == "wide_deep" and crosses else ""
    return (f'name = "models-criteo-{network}"\n[data]\npath = "{path}"\nformat = "criteo"\n'
            f'cache_dir = "{cache}"\neval_fraction = 0.2\n'
            f'\n[model]\nnetwork = "{network}"\nembedding_dim = {c["dim"]}\n'
            f'hidden = {toml_value(c["hidden"])}\n{options}'
            f'\n[train]\nepochs = {c["epochs"]}\nbatch_size = {c["batch"]}\nsync = "every"\n'
            f'sync_every = {c["sync_every"]}\n\n[cluster]\nworkers = 2\nshards = 2\nfeeders = 1\n')


# -- the runs ----------------------------------------------------------------------------------
def reference(job_file: Path, threads: list[int]) -> dict:
    """The single process at each torch thread count: the fastest (the AUC is the same)."""
    job = load_job(str(job_file), environ=clean_environ())
    runs = []
    for n in threads:
        started = time.monotonic()
        got = train_reference(job, n)
        runs.append({"threads": n, "auc": got["auc"], "samples_per_s": got["samples_per_s"],
                     "wall_s": time.monotonic() - started,
                     "samples_trained": got["samples_trained"]})
    return {**max(runs, key=lambda r: r["samples_per_s"]), "by_threads": runs}


def cluster(job_file: Path, workdir: Path) -> dict:
    started = time.monotonic()
    with LocalCluster(workdir, job_file, transport="tcp", checkpoint__every_s=0) as c:
        if c.run_job(timeout=1800) != 0:
            raise SystemExit(f"cluster run of {job_file} failed: "
                             f"{c.summary().get('reason')}\n{c.logs()}")
        s = c.summary()
    return {"auc": s["auc"], "samples_per_s": s["samples_per_s"],
            "wall_s": time.monotonic() - started, "samples_trained": s["samples_trained"]}


def pair(name: str, text: str, work: Path, threads: list[int]) -> dict:
    """The job run by the reference, then by the cluster."""
    job_file = work / f"{name}.toml"
    job_file.write_text(text)
    got = {"reference": reference(job_file, threads)}
    got["cluster"] = cluster(job_file, work / f"{name}-run-{time.monotonic_ns()}")
    r, c = got["reference"], got["cluster"]
    print(f"  {name}: cluster auc {c['auc']:.4f} {c['samples_per_s']:,.0f}/s "
          f"(wall {c['wall_s']:.0f} s); reference auc {r['auc']:.4f} "
          f"{r['samples_per_s']:,.0f}/s (wall {r['wall_s']:.0f} s, {r['threads']} thread(s))",
          flush=True)
    return got


def median(runs: list[dict], side: str, key: str) -> float:
    return statistics.median(r[side][key] for r in runs)


def paired_ratio(runs: list[dict]) -> float:
    return statistics.median(r["cluster"]["samples_per_s"] / r["reference"]["samples_per_s"]
                             for r in runs)


# -- the parts ---------------------------------------------------------------------------------
def part_a(args, networks: list[str], work: Path) -> dict:
    threads = [int(n) for n in args.threads.split(",")]
    tsv = work / f"items-{args.rows}.tsv"
    started = time.monotonic()
    oracle, ceiling = write_items(args.rows, tsv)
    print(f"items: {args.rows:,} rows to {tsv} in {time.monotonic() - started:.1f} s, "
          f"oracle AUC {oracle:.4f}, without the history's term {ceiling:.4f}", flush=True)
    runs: dict[str, list[dict]] = {n: [] for n in networks}
    without: dict[str, list[dict]] = {}
    for r in range(args.repeats):
        for net in networks:
            runs[net].append(pair(f"items-{net}", items_job(net, tsv, True, args.epochs,
                                                            work / "cache"), work, threads))
            base = "mlp" if net == "din" else net
            if len(without.get(base, [])) <= r:
                without.setdefault(base, []).append(pair(
                    f"items-{base}-no-lists", items_job(base, tsv, False, args.epochs,
                                                        work / "cache"), work, threads))
    rows = {}
    for net in networks:
        base = "mlp" if net == "din" else net
        got = {side: {k: median(runs[net], side, k) for k in ("auc", "samples_per_s", "wall_s")}
               for side in ("cluster", "reference")}
        got["without_lists"] = {"network": base, **{side: median(without[base], side, "auc")
                                                    for side in ("cluster", "reference")}}
        got["margin"] = {side: got[side]["auc"] - got["without_lists"][side]
                         for side in ("cluster", "reference")}
        got["paired_ratio"] = paired_ratio(runs[net])
        got["runs"], got["runs_without_lists"] = runs[net], without[base]
        rows[net] = got
    return {"rows": args.rows, "oracle_auc": oracle, "oracle_without_history": ceiling,
            "epochs": args.epochs,
            "batch_size": ITEMS_BATCH, "networks": rows}


def part_b(args, networks: list[str], work: Path) -> dict:
    threads = [int(n) for n in args.threads.split(",")]
    path = Path(args.criteo_file or f"/tmp/criteo-{args.criteo_rows}.tsv")
    criteo_file(args.criteo_rows, path)
    runs: dict[str, list[dict]] = {n: [] for n in networks if n != "din"}
    for _ in range(args.repeats):
        for net in runs:
            runs[net].append(pair(f"criteo-{net}", criteo_job(net, path, work / "cache",
                                                              crosses_of(args.crosses)),
                                  work, threads))
    rows = {}
    for net, got in runs.items():
        rows[net] = {side: {k: median(got, side, k) for k in ("auc", "samples_per_s", "wall_s")}
                     for side in ("cluster", "reference")}
        rows[net]["paired_ratio"] = paired_ratio(got)
        rows[net]["runs"] = got
    return {"file": str(path), "rows": args.criteo_rows, **CRITEO, "networks": rows,
            "crosses": crosses_of(args.crosses)}


def crosses_of(text: str) -> list[list[str]]:
    """``--crosses C1*C2,C3*C4``: wide_deep's crossed columns in Part B."""
    return [c.split("*") for c in text.split(",") if c]


def print_tables(result: dict, repeats: int) -> None:
    of = f"medians of {repeats}" if repeats > 1 else "one run each"
    if "items" in result:
        a = result["items"]
        print(f"\nPart A: items, {a['rows']:,} rows, {a['epochs']} epochs, batch "
              f"{a['batch_size']}, {of}; oracle AUC {a['oracle_auc']:.4f}, without the "
              f"history's term {a['oracle_without_history']:.4f}")
        print("| network | cluster AUC | reference AUC | cluster − reference | cluster "
              "samples/s | reference samples/s | cluster / reference | cluster wall (s) | "
              "without lists: cluster AUC (network) | margin, cluster | margin, reference |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for net, g in a["networks"].items():
            c, r, w = g["cluster"], g["reference"], g["without_lists"]
            print(f"| {net} | {c['auc']:.4f} | {r['auc']:.4f} | {c['auc'] - r['auc']:+.4f} | "
                  f"{c['samples_per_s']:,.0f} | {r['samples_per_s']:,.0f} | "
                  f"{g['paired_ratio']:.2f} | {c['wall_s']:.0f} | {w['cluster']:.4f} "
                  f"({w['network']}) | {g['margin']['cluster']:+.4f} | "
                  f"{g['margin']['reference']:+.4f} |")
        within = [n for n, g in a["networks"].items()
                  if abs(g["cluster"]["auc"] - g["reference"]["auc"]) <= TOLERANCE]
        better = [n for n, g in a["networks"].items() if g["margin"]["cluster"] > 0]
        print(f"cluster within {TOLERANCE} of its reference: {len(within)} of "
              f"{len(a['networks'])} ({', '.join(within) or 'none'}); lists beat no lists "
              f"(cluster): {len(better)} of {len(a['networks'])} ({', '.join(better) or 'none'})")
    if "criteo" in result:
        b = result["criteo"]
        crossed = "; wide_deep's crosses " + ", ".join("*".join(c) for c in b["crosses"]) \
            if b.get("crosses") else ""
        print(f"\nPart B: Criteo layout, {b['rows']:,} rows, embedding dim {b['dim']}, hidden "
              f"{b['hidden']}, batch {b['batch']}, {b['epochs']} epoch, {of}{crossed}")
        print("| network | cluster AUC | reference AUC | cluster − reference | cluster "
              "samples/s | reference samples/s | cluster / reference (paired) | cluster wall "
              "(s) | reference wall (s) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for net, g in b["networks"].items():
            c, r = g["cluster"], g["reference"]
            print(f"| {net} | {c['auc']:.4f} | {r['auc']:.4f} | {c['auc'] - r['auc']:+.4f} | "
                  f"{c['samples_per_s']:,.0f} | {r['samples_per_s']:,.0f} | "
                  f"{g['paired_ratio']:.2f} | {c['wall_s']:.0f} | {r['wall_s']:.0f} |")
        low = [n for n, g in b["networks"].items() if g["paired_ratio"] < 0.8]
        print(f"below 0.8x its reference: {', '.join(low) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="Part A's rows")
    parser.add_argument("--criteo-rows", type=int, default=1_000_000, help="Part B's rows")
    parser.add_argument("--criteo-file", default="",
                        help="Part B's file (made if absent; default /tmp/criteo-ROWS.tsv)")
    parser.add_argument("--networks", default=",".join(   # (its jobs have one label)
        n for n in NETWORKS if n not in SEVERAL_LABELS))
    parser.add_argument("--parts", default="A,B")
    parser.add_argument("--crosses", default="C1*C2", help="Part B: wide_deep's crossed "
                        "columns, e.g. C1*C2,C3*C4 (empty: none)")
    parser.add_argument("--epochs", type=int, default=2, help="Part A's epochs")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", default="1", help="the reference's torch threads; "
                        "several (1,2): each is run, the fastest counts")
    parser.add_argument("--dir", default="", help="where the TSV and the runs go (default: a "
                        "temporary directory)")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()
    networks = args.networks.split(",")
    unknown = [n for n in networks if n not in NETWORKS]
    if unknown:
        parser.error(f"unknown network(s) {', '.join(unknown)} (known: {', '.join(NETWORKS)})")
    parts = set(args.parts.upper().split(","))
    result: dict = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "command": " ".join(sys.argv), "repeats": args.repeats}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.dir or tmp).absolute()
        work.mkdir(parents=True, exist_ok=True)
        if "A" in parts:
            result["items"] = part_a(args, networks, work)
        if "B" in parts:
            result["criteo"] = part_b(args, networks, work)
    result["wall_s"] = time.monotonic() - started
    print_tables(result, args.repeats)
    print(f"\nwall: {result['wall_s']:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
