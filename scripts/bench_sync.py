#!/usr/bin/env python
"""Dense synchronisation: sync modes step, every and lazy on the same data, in one run.

For each mode: the bytes of dense synchronisation (the ``dense_sync`` channel: step
gradients, contributions, weight requests and weights; counted as *received*, so that weights
published to N workers count N times), wall time, training time and the final eval AUC. Modes
run in turn, ``--repeats`` times, over loopback TCP; the table gives medians and each mode's
bytes and AUC against step. Defaults: UCI Adult (``jobs/adult.toml``: 3 epochs, 2 workers,
2 shards, batch 256).

    .venv/bin/python scripts/bench_sync.py [--repeats 3] [--job jobs/adult.toml]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from roles.testbed.local_cluster import LocalCluster  # noqa: E402  (the test harness)

REPO = Path(__file__).resolve().parent.parent
MODES = ("step", "every", "lazy")


def run(workdir: Path, job: Path, mode: str) -> dict:
    with LocalCluster(workdir, job, transport="tcp", train__sync=mode) as c:
        if c.run_job(timeout=900) != 0:
            raise SystemExit(f"{mode} failed:\n{c.logs()}")
        s = c.summary()
    return {"bytes": s["bytes_received"]["dense_sync"], "wall_s": s["wall_s"],
            "train_s": s["train_s"], "auc": s["auc"], "rounds": s["rounds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job", type=Path, default=REPO / "jobs" / "adult.toml")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        for r in range(args.repeats):
            for mode in MODES:
                got = run(Path(tmp) / f"{mode}-{r}", args.job, mode)
                results[mode].append(got)
                print(f"run {r + 1} {mode:5s}: {got['bytes'] / 1e6:8.2f} MB dense sync, "
                      f"wall {got['wall_s']:.1f} s, auc {got['auc']:.4f}, "
                      f"{got['rounds']} rounds", flush=True)

    def med(mode: str, key: str) -> float:
        return statistics.median(x[key] for x in results[mode])

    step_bytes = med("step", "bytes")
    print("\n| sync | dense-sync MB | step ÷ mode | wall s | train s | rounds | AUC | "
          "AUC − step |\n|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        print(f"| {mode} | {med(mode, 'bytes') / 1e6:.2f} | "
              f"{step_bytes / med(mode, 'bytes'):.1f}× | {med(mode, 'wall_s'):.1f} | "
              f"{med(mode, 'train_s'):.1f} | {med(mode, 'rounds'):.0f} | "
              f"{med(mode, 'auc'):.4f} | {med(mode, 'auc') - med('step', 'auc'):+.4f} |")
    print(f"\nmedians of {args.repeats} runs; AUC spread per mode: " + ", ".join(
        f"{m} {min(x['auc'] for x in results[m]):.4f}–{max(x['auc'] for x in results[m]):.4f}"
        for m in MODES))


if __name__ == "__main__":
    main()
