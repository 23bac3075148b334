from __future__ import annotations

import numpy as np

from roles.data.transforms import DenseTransform, signed_log1p


def test_standardised_with_training_statistics_only():
    train = np.array([[0.0], [np.e - 1], [np.e**2 - 1]])
    t = DenseTransform.fit(train, log1p=True)
    assert np.allclose(t.mean, [1.0]) and np.allclose(t.std, [np.sqrt(2 / 3)])
    out = t.apply(np.array([[0.0], [1e6]]))  # eval values do not move the statistics
    assert np.isclose(out[0, 0], -1 / np.sqrt(2 / 3), atol=1e-6)
    assert out.dtype == np.float32


def test_missing_becomes_training_mean_and_constant_columns_zero():
    train = np.array([[1.0, 5.0], [np.nan, 5.0], [3.0, 5.0]])
    t = DenseTransform.fit(train, log1p=False)
    out = t.apply(np.array([[np.nan, 5.0], [np.nan, np.nan]]))
    assert np.allclose(out, 0.0)


def test_signed_log1p_keeps_negatives_defined():
    assert np.allclose(signed_log1p(np.array([-3.0, 0.0, 3.0])),
                       [-np.log(4), 0.0, np.log(4)])


def test_a_row_far_outside_the_training_split_saturates_instead_of_overflowing():
    t = DenseTransform.fit(np.array([[0.0], [1e-6]]), log1p=False)  # a tiny spread
    out = t.apply(np.array([[3e38], [-3e38]]))
    assert np.isfinite(out).all() and out[0, 0] > 1e38 and out[1, 0] < -1e38
