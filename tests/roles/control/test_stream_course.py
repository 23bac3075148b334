"""Control's part in a stream job (``roles.control.streaming``): when the pass ends, and the
summary's figures from the feeders' scores."""

from __future__ import annotations

import dataclasses

import numpy as np

from roles.algorithms.shared.metrics import ScoreHistogram, TaskScores
from roles.algorithms.shared.metrics import auc as exact_auc
from roles.control.commands import Commands
from roles.control.streaming import StreamCourse
from roles.job.settings import parse_job
from roles.protocol.datapath import FeederProgress
from roles.protocol.stream import SCORE_BINS, StreamEnd, StreamScores

JOB = """name = "s"
[data]
label = "y"
sparse = ["c"]
[stream]
url = "nats://127.0.0.1:4222"
topic = "t"
[train]
until_events = 1000
[cluster]
feeders = 2
"""


def progress(samples: int, epoch: int = 0) -> FeederProgress:
    return FeederProgress(epoch=epoch, batches_acked=1, parts=[0], low=[1], above=[[]],
                          samples=[samples], loss_sum=[0.0], weight_sum=[0.0])


def scores(labels: np.ndarray, probs: np.ndarray, trained: int) -> StreamScores:
    h = ScoreHistogram()
    h.add(labels, probs)
    flat = h.counts.reshape(-1)
    bins = np.flatnonzero(flat)
    return StreamScores(events_read=trained, events_trained=trained, events_rejected=0,
                        messages_acked=trained // 10, lag_messages=0, lag_events=0, lag_s=0.0,
                        loss_sum=h.loss_sum, windows=[{"window": 0, "auc": 0.5}], join={},
                        bins=bins.astype(np.int64), counts=flat[bins].astype(np.int64),
                        task_loss_sums=[], task_prob_sums=[], task_windows=[],   # (one label)
                        task_bins=np.zeros(0, np.int64), task_counts=np.zeros(0, np.int64))


def test_the_wire_histogram_is_the_metrics_histogram():
    assert SCORE_BINS == ScoreHistogram.BINS


def test_the_pass_ends_once_when_the_feeders_have_trained_until_events():
    sent = []
    course = StreamCourse(parse_job(JOB, environ={}), Commands(sent.append))
    course.tick(0.0, True, 0, {"feeder-0": progress(600)})
    assert sent == []
    course.tick(1.0, True, 0, {"feeder-0": progress(600), "feeder-1": progress(400, epoch=1)})
    assert sent == []   # another epoch's progress does not count
    course.tick(2.0, True, 0, {"feeder-0": progress(600), "feeder-1": progress(400)})
    course.tick(3.0, True, 0, {"feeder-0": progress(700), "feeder-1": progress(400)})
    assert [type(m) for m in sent] == [StreamEnd] and "1000 events trained" in sent[0].reason


def test_until_s_counts_from_the_first_training_tick():
    sent = []
    job = parse_job(JOB.replace("until_events = 1000", "until_s = 5"), environ={})
    course = StreamCourse(job, Commands(sent.append))
    course.tick(100.0, False, -1, {})    # not training yet: the clock has not started
    course.tick(101.0, True, 0, {})
    course.tick(105.5, True, 0, {})
    assert sent == []
    course.tick(106.0, True, 0, {})
    assert len(sent) == 1


def test_the_jobs_progressive_auc_is_that_of_every_feeders_scores_together():
    rng = np.random.default_rng(3)
    labels = (rng.random(4000) < 0.3).astype(np.float32)
    probs = np.clip(0.3 + 0.3 * (labels - 0.3) + rng.normal(0, 0.2, 4000), 0.01, 0.99)
    course = StreamCourse(parse_job(JOB, environ={}), Commands(lambda m: None))
    course.scored("feeder-0", scores(labels[:2500], probs[:2500], 2500))
    course.scored("feeder-1", scores(labels[2500:], probs[2500:], 1500))
    s = course.summary(rows_repeated=0, feeder_restarted=False)
    assert s is not None
    assert s["events_trained"] == 4000 and s["lag_events"] == 0
    assert abs(s["progressive_auc"] - exact_auc(labels, probs)) < 1e-3
    assert [w["feeder"] for w in s["windows"]] == ["feeder-0", "feeder-1"]
    assert s["events_trained_twice"] == 0
    # a feeder restarted mid-stream: what it trained again is not known, and not said 0
    assert course.summary(rows_repeated=0, feeder_restarted=True)["events_trained_twice"] is None


def test_the_lag_is_not_known_while_a_feeder_has_not_reported_its_end():
    course = StreamCourse(parse_job(JOB, environ={}), Commands(lambda m: None))
    course.scored("feeder-0", scores(np.array([0.0, 1.0]), np.array([0.2, 0.7]), 2))
    s = course.summary(rows_repeated=0, feeder_restarted=False)
    assert s is not None and s["lag_events"] is None and s["events_trained"] == 2


def test_an_auc_of_one_class_only_is_none_not_nan():
    course = StreamCourse(parse_job(JOB, environ={}), Commands(lambda m: None))
    course.scored("feeder-0", scores(np.zeros(5), np.full(5, 0.3), 5))
    s = course.summary(rows_repeated=0, feeder_restarted=False)
    assert s is not None and s["progressive_auc"] is None and s["progressive_logloss"] > 0


def test_a_job_that_reads_files_has_no_stream_figures():
    job = parse_job('[data]\npath = "x.csv"\nlabel = "y"\nsparse = ["c"]\n', environ={})
    assert StreamCourse(job, Commands(lambda m: None)).summary(0, False) is None


def test_each_labels_figures_are_every_feeders_scores_together():
    """Several labels: each label's lifetime figures from the feeders' histograms added up,
    over the events that have it (a NaN label masked), as one ``TaskScores`` of them all."""
    rng = np.random.default_rng(5)
    labels = (rng.random((4000, 2)) < [0.3, 0.1]).astype(np.float32)
    labels[rng.random(4000) < 0.2, 1] = np.nan
    probs = rng.random((4000, 2)).astype(np.float32)
    job = parse_job(JOB.replace('label = "y"', 'labels = ["y", "z"]'), environ={})
    course = StreamCourse(job, Commands(lambda m: None))
    for node, part in (("feeder-0", slice(0, 2500)), ("feeder-1", slice(2500, 4000))):
        each = TaskScores(2)
        each.add(labels[part], probs[part])
        first = scores(labels[part, 0], probs[part, 0], part.stop - part.start)
        task_counts = each.counts().reshape(-1)
        task_bins = np.flatnonzero(task_counts)
        course.scored(node, dataclasses.replace(
            first, task_loss_sums=each.loss_sums().tolist(),
            task_prob_sums=each.prob_sums().tolist(), task_bins=task_bins.astype(np.int64),
            task_counts=task_counts[task_bins].astype(np.int64)))
    s = course.summary(rows_repeated=0, feeder_restarted=False)
    assert s is not None and s["tasks"] is not None
    whole = TaskScores(2)
    whole.add(labels, probs)
    assert s["tasks"] == whole.figures(["y", "z"])
    assert s["tasks"]["y"]["auc"] == s["progressive_auc"]
