"""The capacity predictor: outlier filtering, learning capacities from history records,
persistence in the run directory."""

import numpy as np
import pytest

from roles.algorithms.control.capacity import (
    CapacityPredictor,
    Record,
    append_records,
    filter_outliers,
    read_records,
)


def history(windows: int, per_pair: list[float], seed: int = 0, outliers: int = 0):
    """Synthetic records: shard s takes per_pair[s] seconds per pair (x noise) for lookups
    and half that for updates; window sizes vary; ``outliers`` records are 50x too slow."""
    rng = np.random.default_rng(seed)
    records = []
    for w in range(windows):
        total = int(rng.integers(50_000, 200_000))
        share = rng.dirichlet(np.ones(len(per_pair)))
        for op, factor in (("lookup", 1.0), ("update", 0.5)):
            for s, t in enumerate(per_pair):
                pairs = max(1, int(total * share[s]))
                seconds = pairs * t * factor * rng.lognormal(0.0, 0.05)
                records.append(Record(w, op, s, total, pairs, seconds))
    for i in range(outliers):
        r = records[(7 * i + 3) % len(records)]
        records[(7 * i + 3) % len(records)] = Record(r.window, r.op, r.shard, r.total_pairs,
                                                     r.pairs, r.seconds * 50)
    return records


def test_outliers_are_filtered_per_operation_and_shard():
    records = history(30, [1e-6, 2e-6], outliers=5)
    kept, dropped = filter_outliers(records)
    assert len(dropped) == 5 and all(r.seconds / r.pairs > 2e-5 for r in dropped)
    assert len(kept) == len(records) - 5
    few = records[:6]  # under 4 records per group: nothing is called an outlier
    assert filter_outliers(few)[1] == []


def test_records_without_work_are_not_used():
    bad = [Record(0, "lookup", 0, 10, 0, 1.0), Record(0, "update", 0, 10, 5, 0.0),
           Record(0, "scan", 0, 10, 5, 1.0)]
    assert filter_outliers(bad) == ([], bad)


@pytest.mark.parametrize("outliers", [0, 8])
def test_learns_a_two_to_one_capacity_ratio_within_ten_percent(outliers):
    p = CapacityPredictor(2, seed=1)
    p.fit(history(40, [1e-6, 2e-6], seed=2, outliers=outliers))
    for total in (60_000, 120_000, 190_000):
        caps = p.capacities(total)
        assert caps.sum() == pytest.approx(total)
        assert caps[0] / caps[1] == pytest.approx(2.0, rel=0.10)
    assert p.dropped == outliers


def test_model_and_records_persist_in_the_run_directory(tmp_path):
    records = history(10, [1e-6, 3e-6, 1e-6], seed=3)
    p = CapacityPredictor(3, seed=0)
    p.fit(records)
    p.save(tmp_path / "placement")
    append_records(tmp_path / "placement", records[:7])
    append_records(tmp_path / "placement", records[7:])
    with open(tmp_path / "placement" / "capacity_records.jsonl", "ab") as f:
        f.write(b'{"window": 3, "op": "look')   # torn by a crash
    again = CapacityPredictor.load(tmp_path / "placement")
    assert read_records(tmp_path / "placement") == records
    assert np.allclose(again.capacities(100_000), p.capacities(100_000))
    assert not list((tmp_path / "placement").glob("*.tmp*"))
