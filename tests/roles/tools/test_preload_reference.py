"""``zbus-reference --preload`` (``roles.tools.preload``): the data loaded once holds exactly the
samples a feeder makes (the same split, rejected rows, dense transform and weights), its keys
numbered one row per key, and it trains the job's model as well as the streaming reference."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
from harness import REPO

from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.data.index import DataError
from roles.data.source import DataSource
from roles.data.stream import Samples, Tally, eval_batches
from roles.job.fields import PAD
from roles.job.settings import load_job
from roles.testbed.local_cluster import clean_environ
from roles.tools.preload import RowwiseAdagrad, load, train_preloaded
from roles.tools.reference import train_reference

BAD_ROWS = {100: "oops,Private,1,HS-grad,9,x,y,z,White,Male,0,0,40,US,<=50K",   # training
            45_000: "30,Private,1,HS-grad,9,x,y,z,White,Male,0,0,40,US,maybe"}   # eval


@pytest.fixture
def adult_job(tmp_path: Path) -> Path:
    """Adult as plain csv cut into parts of 0.5 MB (the eval split falls inside one), with a
    rejected row in the training rows and one in the eval rows; one epoch."""
    lines = gzip.decompress((REPO / "data" / "adult.csv.gz").read_bytes()).split(b"\n")
    for at, row in sorted(BAD_ROWS.items(), reverse=True):
        lines.insert(at, row.encode())
    (tmp_path / "adult.csv").write_bytes(b"\n".join(lines))
    text = (REPO / "jobs" / "adult.toml").read_text()
    text = text.replace('path = "../data/adult.csv.gz"', f'path = "{tmp_path / "adult.csv"}"\n'
                        f'cache_dir = "{tmp_path / "cache"}"\npart_mb = 0.5')
    job = tmp_path / "adult.toml"
    job.write_text(text.replace("epochs = 3", "epochs = 1"))
    return job


def feeder_samples(job_path: Path) -> tuple[Samples, Samples, Tally, int, int]:
    """What a feeder's code makes of the job's data, part by part in part order: the training
    samples (before the shuffle), the eval samples, the training tally, and the index's
    training and eval rows."""
    job = load_job(job_path)
    source = DataSource(job)
    files, parts, _ = source.index()
    source.files = files
    prepare = source.preparer(parts)
    tally = Tally()
    train = Samples.join([prepare(b, True, tally) for p in parts if not p.eval
                          for b in source.blocks(p)])
    eval_tally = Tally()
    evaluated = Samples.join([batch for p in parts if p.eval for batch in
                              eval_batches(source.blocks(p), prepare, eval_tally, 1000)])
    # rows read, counted (a plain text file's index only estimates them)
    return train, evaluated, tally, tally.samples + tally.rejected, \
        eval_tally.samples + eval_tally.rejected


@pytest.mark.inprocess   # trains in the test's process
def test_the_preloaded_rows_are_the_feeders_split_transform_and_weights(adult_job):
    train, evaluated, tally, train_rows, eval_rows = feeder_samples(adult_job)
    data = load(load_job(adult_job), 2)
    # 48,842 + 2 rows; the eval split begins at the first line start in the last 20 % of bytes
    assert train_rows + eval_rows == 48_844 and abs(eval_rows / 48_844 - 0.2) < 0.01
    assert data.train == len(train) == train_rows - 1
    assert tally.rejected == 1 and data.tally.rejected == 2   # one training row, one eval row
    assert len(data.labels) - data.train == len(evaluated) == eval_rows - 1
    for name in ("dense", "labels", "weights"):
        got = getattr(data, name)
        np.testing.assert_array_equal(got[:data.train], getattr(train, name))
        np.testing.assert_array_equal(got[data.train:], getattr(evaluated, name))
    # one row per key: equal keys have equal rows and distinct keys distinct rows
    keys = np.concatenate([train.keys, evaluated.keys])
    pairs = np.unique(np.stack([keys.ravel(), data.rows.ravel()], axis=1), axis=0)
    assert len(pairs) == len(np.unique(keys)) == len(np.unique(data.rows)) == data.keys
    assert data.rows.min() == 0 and data.rows.max() == data.keys - 1


@pytest.mark.inprocess   # trains in the test's process
def test_it_trains_as_well_as_the_streaming_reference(adult_job):
    job = load_job(adult_job)
    preloaded, streamed = train_preloaded(job, 1), train_reference(job, 1)
    assert preloaded["auc"] > 0.89 and streamed["auc"] > 0.89
    assert abs(preloaded["auc"] - streamed["auc"]) < 0.01
    assert abs(preloaded["logloss"] - streamed["logloss"]) < 0.02
    trained = len(feeder_samples(adult_job)[0])   # the training rows less the rejected one
    assert preloaded["samples_trained"] == streamed["samples_trained"] == trained > 39_000
    assert preloaded["keys"] == streamed["keys"]


@pytest.mark.inprocess   # trains in the test's process
def test_both_references_train_in_bf16_as_well_as_in_fp32(adult_job):
    """``[train] precision = "bf16"``: each reference trains under autocast as the workers do,
    to within 0.01 of its fp32 AUC."""
    job = load_job(adult_job)
    bf16 = load_job(None, environ={"ZBUS_JOB": str(adult_job), "ZBUS_TRAIN__PRECISION": "bf16"})
    assert bf16.train.precision == "bf16"
    for train in (train_preloaded, train_reference):
        fp32_run, bf16_run = train(job, 1), train(bf16, 1)
        assert bf16_run["auc"] > 0.89, (train.__name__, bf16_run["auc"])
        assert abs(bf16_run["auc"] - fp32_run["auc"]) < 0.01, train.__name__
        assert bf16_run["samples_trained"] == fp32_run["samples_trained"]


@pytest.mark.inprocess   # trains in the test's process
def test_list_fields_pooled_and_as_sequences_train(tmp_path):
    """The generator's items: genres pooled, history (sharing item's table) a sequence."""
    env = {**clean_environ(), "ZBUS_DATA__SYNTHETIC__ROWS": "20000",
           "ZBUS_DATA__SYNTHETIC__ITEMS": "200", "ZBUS_DATA__SYNTHETIC__HISTORY": "10",
           "ZBUS_MODEL__POOLING": '{history = "none"}', "ZBUS_TRAIN__EPOCHS": "1",
           "ZBUS_CACHE_DIR": str(tmp_path)}
    job = load_job(None, environ=env)
    assert job.layout().sequence_fields == ["history"]
    data = load(job, 2)
    history = job.layout().slot_range(job.layout().fields.index("history"))
    assert (data.rows[:, history] == -1).any() and (data.rows[:, history] >= 0).any()
    preloaded, streamed = train_preloaded(job, 1), train_reference(job, 1)
    assert preloaded["auc"] > 0.75
    assert abs(preloaded["auc"] - streamed["auc"]) < 0.01
    assert PAD not in data.rows


@pytest.mark.inprocess   # trains in the test's process
def test_batch_by_label_is_refused_in_one_line():
    job = load_job(None, environ={**clean_environ(), "ZBUS_TRAIN__BATCH_BY_LABEL": "true"})
    with pytest.raises(DataError, match="batch_by_label"):
        train_preloaded(job)


@pytest.mark.integration   # the command's own process: its output and its times
def test_the_command_prints_each_stage_and_the_end_to_end_time(adult_job):
    env = {**clean_environ(), "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    out = subprocess.run([sys.executable, "-m", "roles.tools.reference", "--preload",
                          "--threads", "1", "--job", str(adult_job)], capture_output=True,
                         text=True, cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    got = orjson.loads(out.stdout)
    assert got["threads"] == 1 and got["auc"] > 0.89 and got["peak_rss_mb"] > 0
    assert got["end_to_end_s"] > got["load_s"] + got["train_s"] + got["eval_s"]
    assert got["samples_per_s"] == pytest.approx(got["samples_trained"] / got["train_s"])
    assert [e["epoch"] for e in got["per_epoch"]] == [0]
    missing = subprocess.run([sys.executable, "-m", "roles.tools.reference", "--preload",
                              "--job", str(adult_job)], capture_output=True, text=True,
                             cwd=REPO, timeout=300,
                             env={**env, "ZBUS_DATA__PATH": str(adult_job.parent / "no.csv")})
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr


def matched(table: EmbeddingTable) -> tuple[np.ndarray, torch.nn.Embedding]:
    """40 keys' rows of ``table``, and an ``nn.Embedding`` holding the same rows."""
    rows = table.rows_for(np.arange(40, dtype=np.int64))
    embedding = torch.nn.Embedding(40, table.dim, sparse=True)
    with torch.no_grad():
        embedding.weight.copy_(torch.from_numpy(table.weights[rows]))
    return rows, embedding


def preloaded_step(rng, embedding: torch.nn.Embedding, step,
                   narrow_from: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A batch of 64 ids (repeated ids' gradients sum, as a shard's do; ids from
    ``narrow_from`` on get a gradient in their first value only) stepped by the preloaded
    process's optimizer; the batch's distinct ids and their summed gradients."""
    ids = rng.integers(0, 40, 64)
    upstream = rng.standard_normal((64, embedding.embedding_dim)).astype(np.float32)
    upstream[ids >= narrow_from, 1:] = 0.0
    step.zero_grad()
    (embedding(torch.from_numpy(ids)) * torch.from_numpy(upstream)).sum().backward()
    step.step()
    distinct, inverse = np.unique(ids, return_inverse=True)
    summed = np.zeros((len(distinct), embedding.embedding_dim), np.float32)
    np.add.at(summed, inverse, upstream)
    return distinct, summed


def test_the_preloaded_rowwise_step_is_the_shards():
    """``embedding_optimizer = "rowwise_adagrad"``: the single process's step on a sparse
    ``nn.Embedding`` moves each row as a shard's table does (to float32 rounding)."""
    rng = np.random.default_rng(2)
    table = EmbeddingTable(6, 0.1, 0.2, seed=1, rowwise=True)
    rows, embedding = matched(table)
    step = RowwiseAdagrad(embedding.weight, 0.2)
    for _ in range(3):
        distinct, summed = preloaded_step(rng, embedding, step)
        table.adagrad(rows[distinct], summed)
    assert np.allclose(embedding.weight.detach().numpy(), table.weights[rows], atol=1e-6)
    assert np.allclose(step.sums.numpy(), table.accum[rows, 0], rtol=1e-5)


def test_the_rowwise_step_of_a_narrower_tables_row_is_its_own_widths_in_both():
    """A table narrower than the rows (a weight per id, one wide, in rows of 6): row-wise
    Adagrad takes the mean of its gradient's squares over its own width, not the row's (its
    extra values get none), as a table of that width steps it; the preloaded process too."""
    rng = np.random.default_rng(3)
    narrow = EmbeddingTable(1, 0.1, 0.2, seed=1, rowwise=True)
    own = narrow.rows_for(np.arange(40, dtype=np.int64))
    for compiled in (True, False):
        table = EmbeddingTable(6, 0.1, 0.2, seed=1, rowwise=True, compiled=compiled)
        rows, embedding = matched(table)
        widths = np.where(np.arange(40) < 20, 6, 1).astype(np.float32)   # 20 rows of each
        step = RowwiseAdagrad(embedding.weight, 0.2, widths=widths)
        for _ in range(3):
            distinct, summed = preloaded_step(rng, embedding, step, narrow_from=20)
            table.adagrad(rows[distinct], summed, widths[distinct])
            if compiled:   # the narrow rows alone, in a table of their own width
                mine = distinct >= 20
                narrow.adagrad(own[distinct[mine]], summed[mine, :1])
        if compiled:
            assert np.array_equal(table.weights[rows[20:], :1], narrow.weights[own[20:]])
            assert np.array_equal(table.accum[rows[20:]], narrow.accum[own[20:]])
        assert np.allclose(embedding.weight.detach().numpy(), table.weights[rows], atol=1e-6)
        assert np.allclose(step.sums.numpy(), table.accum[rows, 0], rtol=1e-5)
