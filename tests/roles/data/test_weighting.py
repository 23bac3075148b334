"""Time decay, dropping and merging of samples (pure), and that merging changes no step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roles.data.weighting import decay_weights, weigh
from roles.job.settings import load_job
from roles.model.network import build_network, weighted_loss_sum

DAY = 86400


def test_decay_is_base_to_the_minus_age_in_whole_units_before_the_newest():
    stamps = np.array([10 * DAY + 5, 10 * DAY + 80000, 9 * DAY, 7 * DAY + 1])
    w = decay_weights(stamps // DAY, 2.0)
    assert w.tolist() == [1.0, 1.0, 0.5, 0.125]


def test_samples_below_drop_below_are_dropped_and_counted():
    n = 6
    stamps = np.arange(n) * DAY  # ages 5..0 days
    got = weigh(np.arange(n).reshape(n, 1), np.zeros((n, 0), np.float32), np.zeros(n),
                stamps, base=10.0, unit_s=DAY, drop_below=0.001, merge=False)
    assert got.dropped == 2 and got.rows.tolist() == [2, 3, 4, 5]  # 1e-5, 1e-4 dropped
    assert got.weights.tolist() == pytest.approx([1e-3, 1e-2, 1e-1, 1.0])


def test_identical_samples_of_one_time_bucket_merge_with_their_count():
    keys = np.array([[1, 2], [1, 2], [1, 3], [1, 2], [1, 2]])
    dense = np.array([[0.5], [0.5], [0.5], [0.5], [0.7]], np.float32)
    labels = np.array([1, 1, 1, 0, 1], np.float32)
    stamps = np.array([DAY + 1, DAY + 2, DAY + 3, DAY + 4, 5])  # the last: a day older
    got = weigh(keys, dense, labels, stamps, base=2.0, unit_s=DAY, drop_below=0.0,
                merge=True)
    assert got.rows.tolist() == [0, 2, 3, 4] and got.counts.tolist() == [2, 1, 1, 1]
    assert got.weights.tolist() == [2.0, 1.0, 1.0, 0.5] and got.merged == 1


def test_without_timestamps_nothing_decays_and_merging_is_over_all_rows():
    keys = np.array([[4], [4], [4]])
    got = weigh(keys, np.zeros((3, 0), np.float32), np.ones(3), None, base=1.0, unit_s=DAY,
                drop_below=0.5, merge=True)
    assert got.rows.tolist() == [0] and got.weights.tolist() == [3.0] and got.dropped == 0


def test_a_merged_batch_trains_exactly_like_the_unmerged_one():
    rng = np.random.default_rng(3)
    job = load_job(None, environ={})  # the built-in job's model
    model = build_network(job)
    fields, dim, n_dense = len(job.sparse_fields), job.model.embedding_dim, len(job.dense_fields)
    unique_emb = rng.normal(size=(4, fields, dim)).astype(np.float32)
    unique_dense = rng.normal(size=(4, n_dense)).astype(np.float32)
    labels = np.array([1, 0, 1, 0], np.float32)
    decay = np.array([1.0, 0.5, 0.25, 1.0], np.float32)
    counts = np.array([3, 1, 2, 5])
    rows = np.repeat(np.arange(4), counts)  # the unmerged batch: each sample count times

    def step(emb, dense, y, w):
        model.zero_grad()
        emb_t = torch.from_numpy(emb).requires_grad_(True)
        w_t = torch.from_numpy(w)
        sparse = {f: emb_t[:, i] for i, f in enumerate(job.sparse_fields)}
        loss = weighted_loss_sum(model(sparse, torch.from_numpy(dense), {}),
                                 torch.from_numpy(y), w_t) / w_t.sum()
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy()
        return float(loss.detach()), grads, emb_t.grad.numpy()

    merged = step(unique_emb, unique_dense, labels, decay * counts)
    plain = step(unique_emb[rows], unique_dense[rows], labels[rows], decay[rows])
    assert merged[0] == pytest.approx(plain[0], abs=1e-6)
    assert np.allclose(merged[1], plain[1], atol=1e-6)
    # the embedding gradient of a merged sample is the sum over its copies
    summed = np.zeros_like(merged[2])
    np.add.at(summed, rows, plain[2])
    assert np.allclose(merged[2], summed, atol=1e-6)


def test_drop_below_applies_to_the_weight_after_merging():
    """1,000 identical rows 8 days old: e^-8 each (below 0.001), but one sample of weight
    e^-8 x 1000 = 0.34 once merged: it is kept, not dropped."""
    n = 1000
    stamps = np.full(n, 2 * DAY)
    stamps[-1] = 10 * DAY  # the newest row, of another sample
    keys = np.zeros((n, 1), np.int64)
    keys[-1] = 7
    got = weigh(keys, np.zeros((n, 0), np.float32), np.ones(n), stamps, base=np.e,
                unit_s=DAY, drop_below=0.001, merge=True)
    assert got.dropped == 0 and got.counts.tolist() == [999, 1]
    assert got.weights[0] == pytest.approx(999 * np.exp(-8), rel=1e-5)
    alone = weigh(keys, np.zeros((n, 0), np.float32), np.ones(n), stamps, base=np.e,
                  unit_s=DAY, drop_below=0.001, merge=False)
    assert alone.dropped == 999  # unmerged, each old row is below drop_below


def test_age_counts_from_the_newest_bucket_of_the_data_when_given():
    stamps = np.array([5 * DAY, 6 * DAY])
    got = weigh(np.zeros((2, 1), np.int64), np.zeros((2, 0), np.float32), np.ones(2), stamps,
                base=2.0, unit_s=DAY, drop_below=0.0, merge=False, newest=8)
    assert got.weights.tolist() == [0.125, 0.25]


def test_a_weight_column_multiplies_the_decay_and_merged_rows_sum_theirs():
    keys = np.array([[1, 2], [1, 2], [1, 3], [4, 4]])
    dense = np.zeros((4, 0), np.float32)
    labels = np.array([1, 1, 0, 0], np.float32)
    stamps = np.array([DAY + 1, DAY + 2, DAY + 3, 5])   # the last: a day older
    own = np.array([2.0, 3.0, 0.5, 4.0])
    got = weigh(keys, dense, labels, stamps, base=2.0, unit_s=DAY, drop_below=0.0,
                merge=False, row_weights=own)
    assert got.weights.tolist() == [2.0, 3.0, 0.5, 2.0]
    got = weigh(keys, dense, labels, stamps, base=2.0, unit_s=DAY, drop_below=0.6,
                merge=True, row_weights=own)
    # drop_below is the decay's (the day-old row's 0.5), not the user's weight's (0.5 stays)
    assert got.rows.tolist() == [0, 2] and got.weights.tolist() == [5.0, 0.5]
    assert got.dropped == 1 and got.merged == 1
    got = weigh(keys, dense, labels, stamps, base=1.0, unit_s=DAY, drop_below=0.001,
                merge=False, row_weights=np.array([0.0005, 0.0, 1.0, 3.0]))
    assert got.rows.tolist() == [0, 2, 3] and got.dropped == 1   # a weight of 0: dropped


def test_negative_down_sampling_keeps_every_positive_and_the_same_share_of_negatives():
    from roles.data.weighting import negatives_kept
    rng = np.random.default_rng(0)
    keys = rng.integers(-2**62, 2**62, size=(200_000, 3))
    labels = (rng.random(200_000) < 0.2).astype(np.float32)
    kept = negatives_kept(keys, labels, 0.1, seed=7)
    assert kept[labels == 1].all()
    share = kept[labels == 0].mean()
    assert abs(share - 0.1) < 0.005, share        # 160,000 negatives: sd 0.00075
    again = negatives_kept(keys[::-1], labels[::-1], 0.1, seed=7)[::-1]
    assert (again == kept).all()                  # by the row's keys: any order, any feeder
    other = negatives_kept(keys, labels, 0.1, seed=8)
    assert (other != kept).any()
    two = np.stack([labels, np.full(len(labels), np.nan, np.float32)], axis=1)
    assert (negatives_kept(keys, two, 0.1, seed=7) == kept).all()   # the first label's
    few = rng.integers(0, 10, size=(100_000, 1))   # ten values: by the rows' other values too
    dense = rng.random((100_000, 2)).astype(np.float32)
    kept = negatives_kept(few, np.zeros(100_000, np.float32), 0.1, 7, dense)
    for value in range(10):
        assert abs(kept[few[:, 0] == value].mean() - 0.1) < 0.015   # (about 10,000 each)
