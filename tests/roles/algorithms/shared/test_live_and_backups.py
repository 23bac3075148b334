"""Live settings validation and the backup rule (pure, plus files in a temp dir)."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.shared import live
from roles.checkpoint.model_files import Backups, load_dense, relative_change
from roles.job.settings import AggregationConfig


def test_a_change_inside_its_range_applies_and_one_outside_is_refused_naming_the_range():
    now = live.initial(AggregationConfig())
    assert live.apply(now, {"net_util_max": "0.5"})["net_util_max"] == 0.5
    with pytest.raises(live.SettingError, match=r"net_util_max must be in \[0.001, 1.0\], "
                                                r"got 1.5"):
        live.apply(now, {"net_util_max": 1.5})
    with pytest.raises(live.SettingError, match="must be an integer"):
        live.apply(now, {"min_local_rounds": 2.5})
    with pytest.raises(live.SettingError, match=r"min_local_rounds must be an integer in "
                                                r"\[1, 10000\], got 2.5"):
        live.apply(now, {"min_local_rounds": "2.5"})  # as zbus-ctl sends it
    assert live.apply(now, {"min_local_rounds": "6"})["min_local_rounds"] == 6
    with pytest.raises(live.SettingError, match="did you mean 'probe_timeout_s'"):
        live.apply(now, {"probe_timeout": 1})
    with pytest.raises(live.SettingError, match="min_local_rounds"):
        live.apply(now, {"min_local_rounds": 17})  # above max_local_rounds 16
    assert now == live.initial(AggregationConfig())  # nothing applied


def test_every_live_setting_has_a_range_and_a_valid_default():
    for name, d in live.describe().items():
        assert d["min"] <= d["default"] <= d["max"], name


def test_backups_follow_the_change_rule_and_keep_the_newest(tmp_path):
    b = Backups(tmp_path / "backups")
    w = np.ones(100, np.float32)
    assert b.due(w, 0.05) == (True, float("inf"))  # the first is always due
    b.write(w, 0, 0, float("inf"), kept=2)
    small = w * 1.01
    due, change = b.due(small, 0.05)
    assert not due and change == pytest.approx(0.01, rel=1e-4)
    big = w * 1.06
    assert b.due(big, 0.05)[0]
    for r, params in ((5, big), (9, big * 1.1)):
        b.write(params, r, 0, 0.06, kept=2)
    names = [p.name for p in b.existing()]
    assert names == ["dense-r00000005.npz", "dense-r00000009.npz"]
    params, meta = load_dense(b.existing()[-1])
    assert np.allclose(params, big * 1.1) and meta["round"] == 9
    assert not list((tmp_path / "backups").glob(".*tmp"))  # atomic: no temp file left


def test_relative_change():
    assert relative_change(np.array([3.0, 4.0]), np.array([0.0, 0.0])) == float("inf")
    assert relative_change(np.array([0.0]), np.array([0.0])) == 0.0
    assert relative_change(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == 1.0
