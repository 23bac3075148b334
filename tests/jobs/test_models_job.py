"""Jobs with list and sequence fields and networks other than the MLP (every role in the test's
process, on loopback sockets): a user's module kept outside the repository trains on a TSV file
whose list fields share a table with the candidate, and ``zbus-predict`` scores its export with
nothing else; a worker SIGKILLed in a list-field job loses no batch; a ``din`` job SIGKILLed
whole resumes from its checkpoint; a shard sends each distinct key of a batch once, however
often the batch's lists repeat it."""

from __future__ import annotations

import gzip
import json
import signal
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
import torch
import zmq
from harness import ADULT_JOB, REPO, FakeControl, dealer, reply, text_split_rows
from resumes import every_row_once, killed_and_resumed, trained_past_a_checkpoint
from test_workers import assert_every_batch_trained_once

from roles.checkpoint.model_files import embeddings_file, load_embeddings
from roles.data.index import synthetic_parts
from roles.data.readers import RawBlock
from roles.data.source import DataSource
from roles.data.stream import slot_keys
from roles.job.settings import parse_job
from roles.protocol.datapath import BatchKeys, EmbeddingGrads, Embeddings, Lookup
from roles.tools import predict

pytestmark = pytest.mark.inprocess

ROWS = 12_000
ITEMS = """[data.synthetic]
rows = {rows}
items = 500
history = 12
"""


@pytest.fixture(scope="module")
def items_tsv(tmp_path_factory) -> Path:
    """The synthetic generator's rows with items (candidate, genres, history) as a TSV file
    with a header, the lists joined with ``|``."""
    path = tmp_path_factory.mktemp("items") / "items.tsv"
    job = parse_job("[data]\nsource = 'synthetic'\n" + ITEMS.format(rows=ROWS), environ={})
    source = DataSource(job)
    parts, _ = synthetic_parts(ROWS, 0.2, ROWS)   # every row, in order
    names = ["label", *job.dense_fields, *job.sparse_fields]
    with open(path, "wb") as out:
        out.write(("\t".join(names) + "\n").encode())
        for block in (b for part in parts for b in source.blocks(part)):
            columns = [pa.array(block.labels.astype(np.int64))]
            columns += [pa.array(block.dense[:, j]) for j in range(block.dense.shape[1])]
            for col in block.sparse:
                if pa.types.is_list(col.type):
                    col = pc.binary_join(col, "|")
                columns.append(pc.fill_null(col.cast(pa.string()), ""))
            table = pa.table(columns, names=names)
            sink = pa.BufferOutputStream()
            pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False,
                                                            delimiter="\t", quoting_style="none"))
            out.write(sink.getvalue().to_pybytes())
    return path


def items_job(path: Path, network: str = "mlp", more: str = "") -> str:
    return textwrap.dedent(f"""\
        name = "items"
        [data]
        path = "{path}"
        format = "tsv"
        dense = ["d0", "d1", "d2", "d3"]
        sparse = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "item", "genres", "history"]
        lists = {{ genres = "|", history = "|" }}
        eval_fraction = 0.2
        [data.tables]
        item = ["item", "history"]
        [model]
        network = "{network}"
        embedding_dim = 8
        hidden = [64, 32]
        [model.pooling]
        history = "none"
        [model.max_len]
        genres = 3
        history = 12
        [train]
        epochs = 2
        batch_size = 256
        [cluster]
        workers = 2
        shards = 2
        """) + more


USER_NET = '''
"""A user's network: the candidate attends over the history by a dot product; the other
fields and the dense features go through an MLP beside it."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, dims, sequences, dense_count, hidden):
        super().__init__()
        self.sequence = sequences[0]
        self.others = [f for f in dims if f != self.sequence]
        width = sum(dims[f] for f in self.others) + dims[self.sequence] + dense_count
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, sparse, dense, lengths):
        seq, n = sparse[self.sequence], lengths[self.sequence]
        query = sparse["item"]
        mask = torch.arange(seq.shape[1], device=seq.device).unsqueeze(0) < n.unsqueeze(1)
        score = (seq * query.unsqueeze(1)).sum(-1).masked_fill(~mask, -1e9)
        weight = torch.softmax(score, dim=1) * mask.float()
        interest = (weight.unsqueeze(-1) * seq).sum(1)
        parts = [sparse[f] for f in self.others] + [interest, dense]
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)


def build(sparse_dims, sequence_fields, dense_count, options):
    return Net(sparse_dims, sequence_fields, dense_count, options.get("width", 32))
'''


def test_a_user_module_outside_the_repository_trains_list_fields_and_predict_scores_it(
        cluster, items_tsv, tmp_path, capsys):
    home = tmp_path / "elsewhere"        # the job, its network and nothing of zbus
    (home / "nets").mkdir(parents=True)
    (home / "nets" / "attend.py").write_text(USER_NET)
    job = home / "job.toml"
    job.write_text(items_job(items_tsv, more='[model.options]\nwidth = 24\n')
                   .replace('network = "mlp"', 'module = "nets/attend.py:build"'))
    c = cluster(job, checkpoint__every_s=0)
    assert c.run_job(timeout=300) == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=2)
    assert s["auc"] > 0.75, s["auc"]
    history = next(f for f in s["fields"] if f["field"] == "history")
    assert history["kind"] == "sequence" and history["table"] == "item"
    assert 0 < history["ids_per_sample"] <= 12
    for shard in s["shards"].values():   # lists repeat keys: fewer rows sent than keys
        assert 0 < shard["rows_sent"] < shard["keys_received"], shard
    export = c.run_dir / "export"
    assert (export / "network.py").read_text() == USER_NET
    assert 'module = "network.py:build"' in (export / "job.toml").read_text()
    moved = tmp_path / "moved-export"   # the export alone, away from the job's directory
    export.rename(moved)
    (home / "nets" / "attend.py").unlink()
    capsys.readouterr()
    predict.main([str(moved), str(items_tsv), "--split", "eval", "--json"])   # zbus-predict
    figures = json.loads(capsys.readouterr().out)
    assert figures["scored"] == text_split_rows(items_tsv, "tsv")[1]
    assert figures["rejected_rows"] == 0
    assert abs(figures["auc"] - s["auc"]) <= 1e-4, (figures["auc"], s["auc"])


TRAINING_FAILS = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, dims, dense_count):
        super().__init__()
        self.fields = list(dims)
        self.out = nn.Linear(sum(dims.values()) + dense_count, 1)

    def forward(self, sparse, dense, lengths):
        if self.training:   # what a CPU tensor beside CUDA inputs raises; the check ran eval
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               "least two devices, cuda:0 and cpu!")
        return self.out(torch.cat([*(sparse[f] for f in self.fields), dense], 1)).squeeze(1)


def build(sparse_dims, sequence_fields, dense_count, options):
    return Net(sparse_dims, dense_count)
'''


def test_a_network_that_fails_only_on_the_workers_device_fails_the_job_in_one_line(
        cluster, tmp_path):
    (tmp_path / "net.py").write_text(TRAINING_FAILS)
    job = tmp_path / "job.toml"
    job.write_text('[data]\nsource = "synthetic"\n[model]\nmodule = "net.py:build"\n'
                   '[cluster]\nworkers = 1\nshards = 1\n')
    c = cluster(job, checkpoint__every_s=0)
    assert c.run_job(timeout=120) == 1
    reason = c.summary()["reason"]
    device = "cuda" if torch.cuda.is_available() else "cpu"   # [train] device = "auto"
    assert f"[model] module {tmp_path / 'net.py'}: forward or backward on {device} raised " \
           "RuntimeError: Expected all tensors to be on the same device" in reason, reason
    assert f"(at {tmp_path / 'net.py'}:" in reason, reason
    assert "on its inputs' device (e.g. torch.arange(n, device=dense.device))" in reason, reason
    assert "Traceback" not in c.log("worker-0"), c.log("worker-0")


def test_a_killed_worker_in_a_list_field_job_loses_no_batch(cluster, items_tsv, tmp_path):
    job = tmp_path / "din.toml"
    job.write_text(items_job(items_tsv, "din"))
    c = cluster(job, cluster__node_timeout_s=1.5, checkpoint__every_s=0,
)
    c.start_all(slowdown={0: 14.0, 1: 14.0})
    # the first aggregation round (8 steps a worker): in the first of two epochs of 38 batches
    c.wait_for_event(lambda e: e["event"] == "round_done" and e["round"] >= 1)
    c.procs["worker-1"].send_signal(signal.SIGKILL)
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=2)
    assert s["requeued_batches"] > 0
    assert [(m["node"], m["event"]) for m in s["membership"] if m["event"] != "joined"] == [
        ("worker-1", "failed")]


def test_a_din_job_killed_whole_resumes_from_its_checkpoint(cluster, items_tsv, tmp_path):
    job = tmp_path / "din.toml"
    job.write_text(items_job(items_tsv, "din").replace("epochs = 2", "epochs = 3"))
    c = cluster(job, checkpoint__every_s=1.0)
    c.start_all(slowdown={0: 14.0, 1: 14.0})
    second = c.wait_for_event(lambda e: e["event"] == "epoch_start" and e["epoch"] == 1)
    trained_past_a_checkpoint(c, second["t"])
    s = killed_and_resumed(c, 14.0)
    every_row_once(s, text_split_rows(items_tsv, "tsv")[0], 3)
    assert s["checkpoints"]["rollbacks"][0]["retrained_samples"] > 0
    assert s["duplicates_refused"]["embedding_updates"] == 0
    assert s["auc"] > 0.75, s["auc"]


def test_a_shard_sends_each_distinct_key_of_a_batch_once_to_each_worker(cluster):
    c = cluster(cluster__shards=1, cluster__workers=2)
    fake = FakeControl(c)
    ctx = zmq.Context()
    try:
        c.start_role("ps", 0)
        fake.admit({"ps-0"})
        # two samples: a candidate field, then a list field repeating the candidates' keys
        keys = np.array([7, 8, 7, 9, 7, 8, 8, 7], dtype=np.int64)
        feeder = dealer(ctx, c.job.cluster.endpoint("ps-0"), "feeder-0")
        workers = [dealer(ctx, c.job.cluster.endpoint("ps-0"), f"worker-{i}")
                   for i in range(2)]
        feeder.send_multipart(BatchKeys(batch_id=3, window=0, samples=2, bounds=[0, 2, 8],
                                        positions=np.arange(8, dtype=np.int32),
                                        keys=keys).to_frames())
        for w in workers:   # an eval batch: a copy may go to a second worker
            w.send_multipart(Lookup(batch_id=3, train=False).to_frames())
            got = reply(w)
            assert isinstance(got, Embeddings)
            assert len(got.rows) == 3          # 7, 8 and 9: once each
            assert got.positions().tolist() == list(range(8))
            assert np.unique(got.inverse).tolist() == [0, 1, 2]
            assert np.array_equal(got.rows[got.inverse][[0, 2, 4, 7]],
                                  np.repeat(got.rows[got.inverse][:1], 4, axis=0))
        beat = fake.heartbeat("ps-0", lambda k: k.get("lookups") == 2)
        assert beat.counters["rows_sent"] == 6 and beat.counters["keys_received"] == 8
    finally:
        ctx.destroy(linger=0)


@pytest.mark.parametrize("network, settings", [
    ("mlp", {"train__sync": "lazy"}),
    ("dlrm", {"train__embeddings": "pull", "train__sync": "step"}),
    ("dcn", {"cluster__feeders": 2, "placement__mode": "skew",
             "placement__window_batches": 5}),
    ("deepfm", {"train__sync": "round"}),
    ("wide_deep", {"embeddings__min_count": 2, "embeddings__expire_batches": 20,
                   "train__precision": "bf16"}),
    ("din", {"train__embeddings": "pull", "cluster__feeders": 2, "train__sync": "lazy"}),
])
def test_each_network_trains_list_fields_in_another_mode(cluster, items_tsv, tmp_path,
                                                         network, settings):
    job = tmp_path / f"{network}.toml"
    job.write_text(items_job(items_tsv, network))
    c = cluster(job, checkpoint__every_s=0, **settings)
    assert c.run_job(timeout=300) == 0, c.logs()
    s = c.summary()
    assert_every_batch_trained_once(s, epochs=2)
    assert s["auc"] > 0.7, (network, s["auc"])


def test_the_weights_per_id_are_the_training_rows_ids_and_crosses_and_predict_scores_them(
        cluster, tmp_path, capsys):
    """Wide & deep's wide part as published (deepfm's first order is made the same way): the
    shards hold a weight per id of every field and per crossed pair, made from the training
    rows alone, exactly the keys of their ids and pairs; ``zbus-predict`` scores the export as
    the job did."""
    cross = '\n[model.options]\ncrosses = [["education", "occupation"]]\n'
    job = tmp_path / "wide.toml"
    job.write_text(ADULT_JOB.read_text()
                   .replace('path = "../data/adult.csv.gz"',
                            f'path = "{REPO / "data" / "adult.csv.gz"}"')
                   .replace("[model]\n", '[model]\nnetwork = "wide_deep"\n')
                   .replace("[train]\n", cross + "[train]\n"))
    c = cluster(job, train__epochs=1, checkpoint__every_s=0)
    assert c.run_job(timeout=300) == 0, c.logs()
    s = c.summary()
    assert s["samples_trained"] == 39074 and s["auc"] >= 0.89, s["auc"]
    layout = c.job.layout()
    # the training rows' keys, as a feeder makes them: the first 80 % of the rows in order
    with gzip.open(REPO / "data" / "adult.csv.gz") as f:
        rows = pacsv.read_csv(f).slice(0, 39074)
    block = RawBlock(labels=np.zeros(rows.num_rows, np.float32),
                     dense=np.zeros((rows.num_rows, 0)),
                     sparse=[rows.column(n).cast(pa.string()) for n in c.job.sparse_fields],
                     timestamps=None, rows_read=rows.num_rows)
    keys = slot_keys(layout, block)
    held = np.concatenate([load_embeddings(c.run_dir / "export" / embeddings_file(i))[0]
                           for i in range(2)])
    assert len(held) == len(np.unique(held))   # each key on one shard
    derived = keys[:, layout.data_fields:]
    assert set(held.tolist()) == set(keys.ravel().tolist())
    wide = len(np.unique(derived))
    assert wide == sum(len(np.unique(keys[:, f])) for f in range(layout.data_fields)) + (
        len(np.unique(keys[:, -1])))
    assert len(held) == len(np.unique(keys[:, :layout.data_fields])) + wide
    capsys.readouterr()
    predict.main([str(c.run_dir / "export"), str(REPO / "data" / "adult.csv.gz"), "--split",
                  "eval", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert figures["scored"] == s["eval_samples"]
    assert abs(figures["auc"] - s["auc"]) <= 1e-4, (figures["auc"], s["auc"])


def test_a_shard_steps_a_weight_per_id_by_its_own_width(cluster):
    """Row-wise Adagrad (the default) on a weight per id, one wide in rows of the embedding
    width: its sum of squared gradients is its one value's, not a mean over the row's values
    (which would step it four times as far at width 16)."""
    c = cluster(cluster__shards=1, cluster__workers=1, model__network="wide_deep")
    layout, t = c.job.layout(), c.job.train
    fields = len(layout.fields)
    assert layout.row_dim == 16 and layout.derived_fields and not layout.has_lists
    fake = FakeControl(c)
    ctx = zmq.Context()
    try:
        c.start_role("ps", 0)
        fake.admit({"ps-0"})
        feeder = dealer(ctx, c.job.cluster.endpoint("ps-0"), "feeder-0")
        worker = dealer(ctx, c.job.cluster.endpoint("ps-0"), "worker-0")
        keys = np.arange(100, 100 + fields, dtype=np.int64)   # one sample, a key a field

        def rows_of(batch_id: int) -> np.ndarray:
            feeder.send_multipart(BatchKeys(
                batch_id=batch_id, window=0, samples=1, bounds=list(range(fields + 1)),
                positions=np.arange(fields, dtype=np.int32), keys=keys).to_frames())
            worker.send_multipart(Lookup(batch_id=batch_id, train=True).to_frames())
            got = reply(worker)
            assert isinstance(got, Embeddings)
            return got.rows[got.inverse]

        before = rows_of(1)
        grads = np.zeros((fields, 16), np.float32)
        for f, dim in enumerate(layout.dims):   # a field's gradient: its width's values only
            grads[f, :dim] = np.linspace(0.5, 1.0, dim) * (-1) ** f
        worker.send_multipart(EmbeddingGrads(batch_id=1, grads=grads).to_frames())
        after = rows_of(2)
        lr = np.float32(t.embedding_lr)
        for f, dim in enumerate(layout.dims):
            mean = np.float32((grads[f, :dim] ** 2).sum() / dim)
            expected = before[f, :dim] - grads[f, :dim] * lr / (np.sqrt(mean) + np.float32(1e-10))
            np.testing.assert_allclose(after[f, :dim], expected, rtol=1e-6, atol=1e-7)
            assert np.array_equal(after[f, dim:], before[f, dim:])   # never trained
        wide = layout.data_fields   # the first weight per id: moved by the rate, not 4 times
        assert abs(after[wide, 0] - before[wide, 0]) == pytest.approx(float(lr), rel=1e-5)
    finally:
        ctx.destroy(linger=0)
