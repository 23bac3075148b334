#!/usr/bin/env python
"""The data path on Adult (jobs/adult.toml: 2 workers, 2 shards, 3 epochs), in one run:

- embeddings ``pull`` (the worker asks every shard when a batch is the next to train) against
  ``push`` (the feeder's grant tells the shards, which send the rows to the worker unasked):
  each batch's wait for its embeddings (from the moment it was the next to train, lacking only
  them), median and p90 over the workers' batches, the messages its embeddings took at the
  worker (look-ups sent and replies received, per batch), with samples/s and AUC;
- ``batch_by_label`` (push): the AUC of label-grouped batches against mixed ones;
- one feeder against two (push): samples/s and AUC;
- the data path's messages per batch, sent and received, by node (worker, feeder, each shard;
  the summary's ``data_path_messages``: a worker's per batch it ran, the others' per batch of
  the job);
- the workers' input: bytes received per sample by channel (from the run's summary), against a
  worker that receives whole samples, sparse keys included, and looks the embeddings up itself.
  That design's input is computed from the same batches: the SampleBatch frames plus an int64
  key per (sample, field), and embedding replies of the rows alone (the worker knows where
  each goes); the zbus replies carry a bit per grid position and an int32 row index per key.

    .venv/bin/python scripts/bench_data_path.py [--repeats 3] [--only pull,push]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from roles.testbed.local_cluster import LocalCluster  # noqa: E402  (the test harness)

REPO = Path(__file__).resolve().parent.parent
CASES = {
    "pull": {"train__embeddings": "pull"},
    "push": {"train__embeddings": "push"},
    "push, batch_by_label": {"train__embeddings": "push", "train__batch_by_label": True},
    "push, 2 feeders": {"train__embeddings": "push", "cluster__feeders": 2},
}


def run(workdir: Path, settings: dict) -> dict:
    with LocalCluster(workdir, REPO / "jobs" / "adult.toml", transport="tcp",
                      **settings) as c:
        if c.run_job(timeout=900) != 0:
            raise SystemExit(f"run failed: {c.summary().get('reason')}\n{c.logs()}")
        s = c.summary()
        fields, dim = len(c.job.sparse_fields), c.job.model.embedding_dim
    return {"wait_ms": s["embeddings"]["median_ms"], "p90_ms": s["embeddings"]["p90_ms"],
            "messages": s["embeddings"]["messages_per_batch"],
            "samples_per_s": s["samples_per_s"], "auc": s["auc"],
            "input": s["worker_input_bytes_per_sample"], "fields": fields, "dim": dim,
            "bytes_received": s["bytes_received"], "samples": s["samples_trained"],
            "per_node": s["data_path_messages"]}


def whole_sample_input(got: dict) -> dict[str, float]:
    """Per sample, what a worker receiving whole samples would receive: zbus's samples
    channel plus 8 bytes per key; the rows of the embedding replies without the mask and the
    row index per key (zbus's embeddings bytes less 4 per key and 1/8 per grid position per
    shard, both shards' replies counted)."""
    per = {}
    for worker, channels in got["input"].items():
        fields = got["fields"]
        samples = channels.get("samples", 0.0) + 8 * fields
        embeddings = channels.get("embeddings", 0.0) - 4 * fields - 2 * fields / 8
        rest = sum(v for k, v in channels.items()
                   if k not in ("samples", "embeddings", "total"))
        per[worker] = {"samples": round(samples, 1), "embeddings": round(embeddings, 1),
                       "total": round(samples + embeddings + rest, 1)}
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated cases (default: all)")
    args = parser.parse_args()
    cases = [n for n in CASES if not args.only or n in args.only.split(",")]
    results: dict[str, list[dict]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in cases:
                settings = CASES[name]
                got = run(Path(tmp) / f"{len(results[name])}-{name.replace(' ', '_')}",
                          settings)
                results[name].append(got)
                print(f"  run {r + 1} {name}: embedding wait median {got['wait_ms']} ms "
                      f"(p90 {got['p90_ms']}), {got['messages']} messages per batch, "
                      f"{got['samples_per_s']:,.0f} samples/s, auc {got['auc']:.4f}", flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(g[key] for g in results[name])

    print("\n| case | embedding wait, median (ms) | p90 (ms) | messages per batch at the worker "
          "| samples/s | AUC |")
    print("|---|---|---|---|---|---|")
    for name in cases:
        print(f"| {name} | {med(name, 'wait_ms'):.3f} | {med(name, 'p90_ms'):.3f} | "
              f"{med(name, 'messages'):.2f} | {med(name, 'samples_per_s'):,.0f} | "
              f"{med(name, 'auc'):.4f} |")
    if "push" in results and "pull" in results:
        wait_ratio = med("push", "wait_ms") / max(med("pull", "wait_ms"), 1e-9)
        p90_ratio = med("push", "p90_ms") / max(med("pull", "p90_ms"), 1e-9)
        rate_ratio = med("push", "samples_per_s") / med("pull", "samples_per_s")
        print(f"\npush / pull median wait: {wait_ratio:.2f}; p90: {p90_ratio:.2f}; messages per "
              f"batch: {med('push', 'messages') / med('pull', 'messages'):.2f}; samples/s: "
              f"{rate_ratio:.2f}")
    if "push, batch_by_label" in results and "push" in results:
        print(f"batch_by_label AUC - mixed AUC: "
              f"{med('push, batch_by_label', 'auc') - med('push', 'auc'):+.4f}")
    if "push, 2 feeders" in results and "push" in results:
        print(f"2 feeders / 1 feeder samples/s: "
              f"{med('push, 2 feeders', 'samples_per_s') / med('push', 'samples_per_s'):.2f}")
    print("\ndata-path messages per batch, sent / received (median of the runs):")
    print("| case | node | sent | received | sent, by channel | received, by channel |")
    print("|---|---|---|---|---|---|")
    for name in cases:
        for node in results[name][0]["per_node"]:
            rows = [g["per_node"].get(node, {}) for g in results[name]]
            figures = {k: statistics.median(r.get(k, 0.0) for r in rows)
                       for k in set().union(*rows)}
            by = {way: ", ".join(f"{k.split('_', 1)[1]} {v:.2f}"
                                 for k, v in sorted(figures.items())
                                 if k.startswith(f"{way}_"))
                  for way in ("sent", "received")}
            print(f"| {name} | {node} | {figures.get('sent', 0.0):.2f} | "
                  f"{figures.get('received', 0.0):.2f} | {by['sent']} | {by['received']} |")
    if "push" not in results:
        return
    got = results["push"][0]
    print("\nworker input, bytes per sample (push run 1):")
    print("| worker | channel | zbus | whole samples, own look-ups |")
    print("|---|---|---|---|")
    whole = whole_sample_input(got)
    for worker, channels in got["input"].items():
        for ch in ("samples", "embeddings", "total"):
            print(f"| {worker} | {ch} | {channels.get(ch, 0.0):.1f} | {whole[worker][ch]:.1f} |")
        print(f"saving for {worker}: "
              f"{1 - channels['total'] / whole[worker]['total']:.1%} of its input")


if __name__ == "__main__":
    main()
