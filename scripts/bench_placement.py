"""Benchmark: shard load balance of hash placement against zbus's skew-aware placement.

Part 1 (placement, pure code): a stream of key-value pairs whose keys follow a Zipf law over
1M distinct keys, cut into windows of ``--window`` pairs fed in batches of ``--batch`` pairs
(as feeders count them: SpaceSaving of ``--heavy`` keys, pairs per bucket). After each window
zbus places the heavy keys and buckets with equal capacities; the next window (a fresh sample)
is then routed by that map. Reported per setting: the median over windows of max/mean shard
load for hash and for zbus, the lower bound max(1, k x share of the hottest key), the target
max(1.10, 1.05 x bound), and the throughput a shard-bound job would reach relative to hash
(the busiest shard sets the pace: hash's max/mean divided by zbus's).

Part 2 (``--jobs``, real processes): the same Zipf-skewed synthetic job run with placement hash
and skew, 2 shards, one slowed ``--slow`` x, ``--repeats`` runs each in alternation; the median
samples/s of each and their ratio.

    .venv/bin/python scripts/bench_placement.py            # part 1
    .venv/bin/python scripts/bench_placement.py --jobs     # parts 1 and 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from roles.algorithms.control.placement import lower_bound, max_over_mean, place  # noqa: E402
from roles.algorithms.shared.key_map import HeavyHitters, KeyMap  # noqa: E402

DISTINCT = 1_000_000


def zipf_sampler(exponent: float, seed: int):
    rng = np.random.default_rng(seed)
    p = np.arange(1, DISTINCT + 1, dtype=np.float64) ** -exponent
    p /= p.sum()
    cdf = np.cumsum(p)
    ids = rng.integers(-(2**62), 2**62, size=DISTINCT, dtype=np.int64)  # like hashed values

    def sample(n: int) -> np.ndarray:
        return ids[np.minimum(np.searchsorted(cdf, rng.random(n)), DISTINCT - 1)]

    return sample, float(p[0])


def one_setting(exponent: float, shards: int, windows: int, window: int, batch: int,
                heavy_keys: int, seed: int) -> dict:
    sample, top = zipf_sampler(exponent, seed)
    keymap = KeyMap.hashed(shards, 64)
    hashed = KeyMap.hashed(shards, 64)
    hash_ratio, zbus_ratio, place_s = [], [], []
    for w in range(windows + 1):
        heavy = HeavyHitters(heavy_keys)
        buckets = np.zeros(len(keymap.buckets), dtype=np.int64)
        loads = np.zeros(shards)
        hash_loads = np.zeros(shards)
        for _ in range(window // batch):
            keys = sample(batch)
            heavy.add(keys)
            buckets += np.bincount(keymap.bucket_of(keys), minlength=len(buckets))
            loads += np.bincount(keymap.owner_of(keys), minlength=shards)
            hash_loads += np.bincount(hashed.owner_of(keys), minlength=shards)
        if w:  # window 0 only teaches the first map
            hash_ratio.append(max_over_mean(hash_loads))
            zbus_ratio.append(max_over_mean(loads))
        started = time.perf_counter()
        alloc = place(heavy, buckets, np.full(shards, heavy.total / shards), keymap)
        place_s.append(time.perf_counter() - started)
        keymap = alloc.keymap
    bound = lower_bound(top, shards)
    target = max(1.10, 1.05 * bound)
    h, z = statistics.median(hash_ratio), statistics.median(zbus_ratio)
    return {"zipf": exponent, "shards": shards, "top_share": top, "hash": h, "zbus": z,
            "bound": bound, "target": target, "ok": z <= target, "speedup": h / z,
            "place_ms": 1000 * statistics.median(place_s)}


def run_jobs(repeats: int, slow: float) -> None:
    from roles.testbed.jobs import REPO
    from roles.testbed.local_cluster import LocalCluster

    figures: dict[str, list[float]] = {"hash": [], "skew": []}
    with tempfile.TemporaryDirectory() as tmp:
        job = REPO / "jobs" / "zipf.toml"   # mode skew, windows of 10 batches
        for r in range(repeats):
            for mode in ("hash", "skew"):
                with LocalCluster(Path(tmp) / f"{mode}{r}", job, placement__mode=mode,
                                  train__epochs=3, cluster__heartbeat_s=0.25) as c:
                    if c.run_job(ps_slowdown={1: slow}) != 0:
                        raise SystemExit(f"{mode} job failed:\n{c.logs()[-3000:]}")
                    s = c.summary()
                    figures[mode].append(s["samples_per_s"])
                    pl = s["placement"]
                    extra = (f", {pl['migrations']} migrations, paused "
                             f"{pl['pause_s_total']:.2f} s in all" if mode == "skew" else "")
                    print(f"  run {r + 1} {mode}: {s['samples_per_s']:,.0f} samples/s, auc "
                          f"{s['auc']:.4f}{extra}", flush=True)
    h, z = statistics.median(figures["hash"]), statistics.median(figures["skew"])
    print(f"\njob throughput, 2 shards, shard 1 slowed {slow:g}x, median of {repeats}: "
          f"hash {h:,.0f} samples/s, skew {z:,.0f} samples/s, skew/hash {z / h:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--window", type=int, default=2_000_000, help="pairs per window")
    ap.add_argument("--batch", type=int, default=100_000, help="pairs per feeder batch")
    ap.add_argument("--heavy", type=int, default=4096, help="SpaceSaving counters")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", action="store_true", help="also run real jobs (part 2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow", type=float, default=2.0)
    args = ap.parse_args()
    print(f"{DISTINCT:,} distinct keys, windows of {args.window:,} pairs, {args.heavy} heavy "
          f"keys counted, 64 buckets per shard; median over {args.windows} windows\n")
    print("| zipf | shards | top key share | hash max/mean | zbus max/mean | bound | target "
          "| met | shard-bound speed-up | place ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for exponent in (1.0, 1.2, 1.5):
        for shards in (4, 32):
            r = one_setting(exponent, shards, args.windows, args.window, args.batch,
                            args.heavy, args.seed)
            print(f"| {exponent} | {shards} | {r['top_share']:.3f} | {r['hash']:.3f} | "
                  f"{r['zbus']:.3f} | {r['bound']:.3f} | {r['target']:.3f} | "
                  f"{'yes' if r['ok'] else 'NO'} | {r['speedup']:.2f}x | "
                  f"{r['place_ms']:.0f} |", flush=True)
    if args.jobs:
        run_jobs(args.repeats, args.slow)


if __name__ == "__main__":
    main()
