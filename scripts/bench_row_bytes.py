#!/usr/bin/env python
"""Int8 rows on the serving wire (``[serving] row_bytes = 1``) against float32: the bytes a
published row takes, and what rounding every row as int8 rows travel does to the served
probabilities and the AUC, in one run.

Trains the job (``--job``, default ``jobs/adult.toml``; ``--criteo FILE``: a Criteo-layout file
from ``scripts/make_criteo.py``, 2 workers and 2 shards, 1 epoch) on a cluster (every role its
own process), then scores its eval rows with the export as trained (float32: what
``zbus-predict`` and a float32 server answer) and with its rows rounded as int8 rows travel
(``roles.serving.live.rounded_as_sent``: what a server following the job with ``row_bytes = 1``
answers): the AUC of each, and the largest, 99th-percentile and median difference of the
probabilities over every row of the file.

    .venv/bin/python scripts/bench_row_bytes.py [--criteo /tmp/criteo-1m.tsv]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from roles.serving.live import rounded_as_sent
from roles.serving.model import ExportedModel
from roles.testbed.jobs import REPO
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.serving import predicted
from roles.tools.predict import predict


def criteo_job(where: Path, data: Path) -> Path:
    job = where / "criteo.toml"
    job.write_text(f'name = "rows-criteo"\n[data]\npath = "{data.absolute()}"\nformat = "criteo"\n'
                   f"eval_fraction = 0.2\n[model]\nembedding_dim = 16\nhidden = [256, 128]\n"
                   f"[train]\nepochs = 1\nbatch_size = 1024\n[cluster]\nworkers = 2\nshards = 2\n"
                   f"[checkpoint]\nevery_s = 0\n")
    return job


def scores(model: ExportedModel) -> tuple[float, np.ndarray]:
    """The eval split's AUC, and the probability of every row of the file."""
    d = model.job.data
    figures = predict(model, d.eval_path or d.path, d.format, "all" if d.eval_path else "eval")
    return figures["auc"], predicted(model, Path(d.path), d.format)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(REPO / "jobs" / "adult.toml"))
    ap.add_argument("--criteo", default="", help="a Criteo-layout file: its job in place of "
                    "--job")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-row-bytes-") as tmp:
        where = Path(tmp)
        job = criteo_job(where, Path(args.criteo)) if args.criteo else Path(args.job)
        with LocalCluster(where / "run", job, transport="tcp") as c:
            if c.run_job(timeout=3600) != 0:
                raise SystemExit(f"the job failed:\n{c.logs()}")
            export = c.run_dir / "export"
        model = ExportedModel(export)
        width, keys = model.rows.shape[1], len(model.rows)
        exact_auc, exact = scores(model)
        rounded_as_sent(model)
        int8_auc, int8 = scores(model)
    gap = np.abs(int8 - exact)
    print(f"CPU: {cpu_name()}; {job.name}: {keys:,} keys of width {width}, {len(exact):,} rows")
    print(f"a published row: float32 {4 * width} bytes, int8 {width + 4} bytes "
          f"({4 * width / (width + 4):.2f}x fewer)")
    print(f"AUC: float32 {exact_auc:.6f}, int8 {int8_auc:.6f} ({int8_auc - exact_auc:+.6f})")
    print(f"probabilities: largest difference {gap.max():.2e}, median {np.median(gap):.2e}, "
          f"99th percentile {np.quantile(gap, 0.99):.2e}")


if __name__ == "__main__":
    main()
