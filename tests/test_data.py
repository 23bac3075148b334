from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from roles.algorithms.metrics import auc
from roles.data.dataset import load_dataset
from roles.data.readers import DataError
from roles.data.synthetic import generate
from roles.job.settings import load_job, parse_job

ADULT = Path(__file__).resolve().parent.parent / "jobs" / "adult.toml"


def test_synthetic_data_is_deterministic_and_has_a_planted_signal():
    a = generate(5000, [10, 100], 2, 1.1, 0.6, 30, seed=4)
    b = generate(5000, [10, 100], 2, 1.1, 0.6, 30, seed=4)
    assert np.array_equal(a.values, b.values) and np.array_equal(a.labels, b.labels)
    assert 0.2 < a.labels.mean() < 0.3
    assert 0.6 < auc(a.labels, a.probs) < 0.95  # chance is 0.5
    assert np.all(np.diff(a.timestamps) >= 0)
    top = np.bincount(a.values[:, 1]).max() / len(a.values)
    assert top > 0.1  # Zipf: the most popular of 100 values takes a large share


def test_adult_from_the_shipped_copy():
    d = load_dataset(load_job(str(ADULT), environ={}))
    assert d.keys.shape == (48842, 8) and d.dense.shape == (48842, 6)
    assert d.n_train == 39074 and d.n_eval == 9768
    assert d.rejected == [] and d.oracle_auc is None
    assert abs(float(d.dense[:d.n_train].mean())) < 1e-3


def test_synthetic_job_reports_oracle_auc():
    job = parse_job("[data]\nsource = 'synthetic'\n[data.synthetic]\nrows = 2000\n", environ={})
    d = load_dataset(job)
    assert d.n_train == 1600 and 0.5 < d.oracle_auc < 1.0


def test_too_many_rejected_rows_means_a_wrong_schema(tmp_path):
    (tmp_path / "d.csv").write_text("y,n,c\n" + "x,1,a\n" * 10 + "1,1,a\n")
    job = parse_job(f"[data]\npath = '{tmp_path / 'd.csv'}'\nlabel = 'y'\ndense = ['n']\n"
                    "sparse = ['c']\n", environ={})
    with pytest.raises(DataError, match="10 of 11 rows rejected"):
        load_dataset(job)
