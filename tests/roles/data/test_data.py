"""The data layer on its own (roles.data): the generator, the statistics, and a part's batches
through the shuffle buffer; the shipped Adult data read whole."""

from __future__ import annotations

import hashlib

import numpy as np
from harness import REPO, TEST_DATA

from roles.algorithms.shared.metrics import auc
from roles.data.source import DataSource
from roles.data.stats import Moments, merge_summaries, summarize
from roles.data.stream import Preparer, Tally, Weighting, eval_batches, training_batches
from roles.data.synthetic import BLOCK_ROWS, CRITEO_VOCAB, Generator, ZipfLaw
from roles.data.transforms import DenseTransform, signed_log1p
from roles.job.settings import load_job, parse_job

ADULT = REPO / "jobs" / "adult.toml"


def test_synthetic_rows_are_the_same_however_they_are_cut_and_have_a_planted_signal():
    g = Generator(200_000, [10, 100], 2, 1.1, 0.6, 30, seed=4)
    whole = g.rows_between(0, 150_000)
    pieces = [g.rows_between(a, b) for a, b in ((0, 1000), (1000, BLOCK_ROWS + 7),
                                                (BLOCK_ROWS + 7, 150_000))]
    assert np.array_equal(np.concatenate([p.values for p in pieces]), whole.values)
    assert np.array_equal(np.concatenate([p.labels for p in pieces]), whole.labels)
    again = Generator(200_000, [10, 100], 2, 1.1, 0.6, 30, seed=4).rows_between(0, 150_000)
    assert np.array_equal(again.dense, whole.dense)
    assert 0.2 < whole.labels.mean() < 0.3
    assert 0.6 < auc(whole.labels, whole.probs) < 0.95  # chance is 0.5
    assert np.all(np.diff(whole.timestamps) >= 0)
    top = np.bincount(whole.values[:, 1]).max() / len(whole.values)
    assert top > 0.1  # Zipf: the most popular of 100 values takes a large share


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


PINNED = TEST_DATA / "generator_rows.npz"


def test_without_items_the_generator_gives_the_rows_it_always_gave():
    """Pinned: the rows of the generator before it had items (``items = 0``, the default),
    across a block boundary, with and without missing values. The integers (values, labels,
    times) bit for bit; the floats (dense counts, probabilities) to 1e-12 of every 97th row as
    recorded (``tests/data/generator_rows.npz``) and of their sums: numpy's exp and log, and
    the BLAS product of the dense weights, round the last bit differently on a host with
    AVX-512 (a bit-for-bit digest of the floats held on one host and failed on the other)."""
    g = Generator(70000, [10, 100, 1000], 3, 1.1, 0.6, 30, 4)
    rows = g.rows_between(0, 70000)
    missing = Generator(70000, [10, 100, 1000], 3, 1.1, 0.6, 30, 4, missing=0.1)
    gaps = missing.rows_between(100, 69000)
    assert digest(rows.values, rows.labels, rows.timestamps) == "309aa63d1f6012b2"
    assert digest(gaps.values, gaps.labels, gaps.timestamps) == "7425bfeaa955825a"
    assert rows.genres.shape == (70000, 0) and not rows.history_lengths.any()
    pinned = np.load(PINNED)
    for block, prefix in ((rows, ""), (gaps, "m_")):
        pick = np.arange(0, len(block.values), 97)
        for name in ("values", "labels", "timestamps"):
            assert np.array_equal(getattr(block, name)[pick], pinned[prefix + name]), name
        for name in ("dense", "probs"):
            assert np.allclose(getattr(block, name)[pick], pinned[prefix + name], rtol=1e-12,
                               atol=0, equal_nan=True), name
    sums = [rows.dense.sum(), rows.probs.sum(), np.nansum(gaps.dense), gaps.probs.sum()]
    assert np.allclose(sums, pinned["sums"], rtol=1e-12, atol=0)


def test_zipf_ranks_follow_the_law_with_no_table_for_a_huge_vocabulary():
    u = np.random.default_rng(0).random(400_000)
    small = ZipfLaw(10, 1.1).ranks(u)
    p = np.arange(1, 11) ** -1.1
    assert np.allclose(np.bincount(small, minlength=11)[1:] / len(u), p / p.sum(), atol=3e-3)
    huge = ZipfLaw(CRITEO_VOCAB[2], 1.1)
    ranks = huge.ranks(u)
    assert len(huge.cum) == ZipfLaw.HEAD and ranks.max() > 10 * ZipfLaw.HEAD
    assert ranks.min() >= 1 and ranks.max() <= CRITEO_VOCAB[2]


def test_moments_merge_to_the_whole_columns_statistics():
    rng = np.random.default_rng(1)
    x = rng.lognormal(1, 1, (3000, 3))
    x[rng.random(x.shape) < 0.2] = np.nan
    parts = [Moments.of(signed_log1p(x[a:b])) for a, b in ((0, 7), (7, 2000), (2000, 3000))]
    merged = parts[0].merge(parts[1]).merge(parts[2]).transform(True)
    whole = DenseTransform.fit(x, True)
    assert np.allclose(merged.mean, whole.mean) and np.allclose(merged.std, whole.std)


def adult_source() -> DataSource:
    source = DataSource(load_job(str(ADULT), environ={}))
    files, parts, n_train = source.index()
    source.files = files
    return source


def test_adult_from_the_shipped_copy():
    source = adult_source()
    files, parts, n_train = source.index()
    assert n_train == 39074 and files[0].rows == 48842 and files[0].kind == "gzip"
    assert [(p.rows, p.eval) for p in parts] == [(39074, False), (9768, True)]
    tally = Tally()
    train = parts[0]
    s = summarize(source.blocks(train), train.number, 6, True, 10**9, True)
    assert (s.rows_read, s.rows, s.rejected) == (39074, 39074, 0)
    transform, newest = merge_summaries([s], True, 6)
    prepare = Preparer(source.job.layout(), transform, None)
    batches = list(eval_batches(source.blocks(parts[1]), prepare, tally, 256))
    assert sum(len(b) for b in batches) == 9768 and tally.rejected == 0
    assert batches[0].keys.shape == (256, 8) and batches[0].dense.shape == (256, 6)


def synthetic_batches(epoch: int, part_number: int = 0, by_label: bool = False,
                      buffer_rows: int = 3000):
    job = parse_job("[data]\nsource = 'synthetic'\n[data.synthetic]\nrows = 20000\n",
                    environ={})
    source = DataSource(job)
    _, parts, _ = source.index()
    part = parts[part_number]
    prepare = Preparer(source.job.layout(), DenseTransform(True, np.zeros(4), np.ones(4)),
                       None)
    tally = Tally()
    batches = list(training_batches(source.blocks(part), prepare, tally,
                                    buffer_rows=buffer_rows, batch_size=256, seed=7,
                                    epoch=epoch, part=part.number, by_label=by_label))
    return batches, tally, part


def test_a_parts_batches_are_replayable_and_hold_each_sample_once():
    first, tally, part = synthetic_batches(epoch=0)
    again, _, _ = synthetic_batches(epoch=0)
    other, _, _ = synthetic_batches(epoch=1)
    assert [b.keys.tolist() for b in first] == [b.keys.tolist() for b in again]
    assert [b.keys.tolist() for b in first] != [b.keys.tolist() for b in other]
    rows = np.concatenate([np.concatenate([b.keys, b.dense], axis=1) for b in first])
    ordered = np.concatenate([np.concatenate([b.keys, b.dense], axis=1)
                              for b in synthetic_batches(epoch=0, buffer_rows=10**6)[0]])
    assert tally.samples == part.rows == len(rows) == 16000
    # every sample once (same multiset as a full shuffle), in another order
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, ordered.tolist()))
    assert all(len(b) == 256 for b in first[:-1])


def test_label_grouped_batches_hold_one_label_each():
    batches, tally, _ = synthetic_batches(epoch=0, by_label=True)
    assert all(len(np.unique(b.labels)) == 1 for b in batches)
    assert sum(len(b) for b in batches) == tally.samples == 16000
    assert sum(len(b) < 256 for b in batches) <= 2  # each label's last batch may be short


def test_weighting_in_the_stream_counts_dropped_and_merged_rows():
    job = parse_job("[data]\nsource = 'synthetic'\nmerge = true\ndecay_base = 3.0\n"
                    "drop_below = 0.01\n[data.synthetic]\nrows = 20000\nvocab = [2, 2]\n"
                    "dense = 0\ndays = 60\n", environ={})
    source = DataSource(job)
    _, parts, _ = source.index()
    newest = max(int(b.timestamps.max()) for b in source.blocks(parts[0])) // 86400
    prepare = Preparer(source.job.layout(), DenseTransform(True, np.zeros(0), np.ones(0)),
                       Weighting(3.0, 86400, 0.01, True, newest))
    tally = Tally()
    batches = list(training_batches(source.blocks(parts[0]), prepare, tally, buffer_rows=5000,
                                    batch_size=256, seed=1, epoch=0, part=0, by_label=False))
    assert tally.dropped > 0 and tally.merged > 0
    assert tally.samples + tally.dropped + tally.merged == tally.rows_read == parts[0].rows
    assert sum(len(b) for b in batches) == tally.samples
    assert all((b.weights >= 0.01).all() for b in batches)


def test_the_statistics_of_a_part_are_cached_and_sampled(tmp_path):
    source = adult_source()
    source.cache_dir = tmp_path
    _, parts, _ = source.index()
    sample = source.summary(parts[0], True, 1000, False)
    assert sample.rows >= 1000 and not sample.complete
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("part-")]
    cached = source.summary(parts[0], True, 1000, False)
    assert np.array_equal(cached.moments.mean, sample.moments.mean)
    whole = source.summary(parts[0], True, 10**9, True)
    assert whole.complete and whole.rows == 39074


def test_evaluation_batches_are_eval_batch_size_rows_four_batches_by_default():
    from roles.feeder.streams import PartStreams

    big = parse_job(ADULT.read_text().replace("batch_size = 256", "batch_size = 8192", 1),
                    base_dir=ADULT.parent, environ={})
    huge = parse_job(ADULT.read_text().replace("batch_size = 256", "batch_size = 65536", 1),
                     base_dir=ADULT.parent, environ={})
    assert big.train.eval_batch == 16_384 and huge.train.eval_batch == 65_536
    for given, size in ((0, 4 * 100), (300, 300)):
        text = ADULT.read_text().replace("batch_size = 256", f"batch_size = 100\n"
                                                             f"eval_batch_size = {given}", 1)
        job = parse_job(text, base_dir=ADULT.parent, environ={})
        assert job.train.eval_batch == size
        source = DataSource(job)
        files, parts, _ = source.index()
        source.files = files
        train, held_out = parts
        s = summarize(source.blocks(train), train.number, 6, True, 10**9, True)
        prepare = Preparer(job.layout(), merge_summaries([s], True, 6)[0], None)
        streams = PartStreams(job, source)
        try:
            stream, sizes = streams.evaluation(held_out, prepare, Tally()), []
            while (got := stream.take()) is not None:
                sizes.append(len(got[1]))
        finally:
            streams.close()
        assert sum(sizes) == held_out.rows and set(sizes[:-1]) == {size}, sizes[-3:]


def test_a_feeder_makes_about_16k_rows_of_batches_ahead_per_open_part_at_least_two():
    from roles.feeder.streams import ROWS_AHEAD, batches_ahead

    assert ROWS_AHEAD == 16_384
    assert batches_ahead(1024) == 16 and batches_ahead(1000) == 17 and batches_ahead(256) == 64
    assert batches_ahead(16_384) == 2 and batches_ahead(65_536) == 2


def test_with_drift_the_planted_model_turns_with_event_time_and_stays_as_strong():
    """``drift`` d: the planted weight of a value is cos(d t) w0 + sin(d t) w1 at day t, so the
    rows of two instants k days apart are scored by weights that correlate cos(d k); each
    instant's model is as strong as without drift (same positive rate, same oracle AUC)."""
    still = Generator(200_000, [2000], 0, 1.1, 1.0, 30, seed=5)
    moving = Generator(200_000, [2000], 0, 1.1, 1.0, 30, seed=5, drift=np.pi / 30)
    a, b = still.rows_between(0, 200_000), moving.rows_between(0, 200_000)
    assert np.array_equal(a.values, b.values)   # the same values; only their weights move
    ids = np.arange(2000)
    seed = moving.field_seeds[0]
    start = moving._weights(seed, ids, moving.angles(0, 1))
    end = moving._weights(seed, ids, moving.angles(199_999, 1))
    # 30 days at pi/30 a day: half a turn apart, the first and last days' weights are opposite
    assert np.corrcoef(start, end)[0, 1] < -0.99
    assert np.allclose(end, still._weights(seed, ids, None), atol=1e-4)   # the last day: w0
    for rows in (a, b):
        assert abs(rows.labels.mean() - 0.25) < 0.02
    first, last = slice(0, 20_000), slice(180_000, 200_000)
    oracle = [auc(b.labels[part], b.probs[part]) for part in (first, last)]
    assert all(abs(x - auc(a.labels, a.probs)) < 0.02 for x in oracle), oracle
    # a model of the first days (the true probabilities of day 0) on the last days' rows
    frozen = moving._weights(seed, b.values[last, 0], moving.angles(0, 1))
    assert auc(b.labels[last], frozen) < 0.5 < oracle[1]


def test_the_generators_conversion_chain_keeps_its_clicks_and_buys_only_after_one():
    """[data.synthetic] conversion: the same rows and clicks as without it (its draws come
    last), a purchase only on a clicked row, p(purchase) = p(click) · p(purchase | click)."""
    from roles.algorithms.shared.metrics import oracle_aucs
    from roles.data.synthetic import Generator
    plain = Generator(30_000, [100, 1000], 2, 1.1, 0.8, 7, 3, missing=0.05)
    chain = Generator(30_000, [100, 1000], 2, 1.1, 0.8, 7, 3, missing=0.05, conversion=True)
    a, b = plain.rows_between(0, 30_000), chain.rows_between(0, 30_000)
    assert b.labels.shape == (30_000, 2) and b.probs.shape == (30_000, 2)
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.labels, b.labels[:, 0])
    np.testing.assert_array_equal(a.probs, b.probs[:, 0])
    assert not (b.labels[:, 1] > b.labels[:, 0]).any() and b.labels[:, 1].sum() > 100
    assert (b.probs[:, 1] <= b.probs[:, 0]).all()
    click, purchase = oracle_aucs(b.labels, b.probs)
    assert click == oracle_aucs(a.labels, a.probs)[0] and 0.7 < purchase < 1.0
