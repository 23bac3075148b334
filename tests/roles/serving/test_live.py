"""``zbus-serve --follow RUN`` of a job that publishes its parameters at each serving cut
(``[serving] publish_ms``, the default): a training job followed live, every answer checked
against an oracle that rebuilds the version it names from the published deltas alone (a dict of
rows from the job's first cut on, not the server's checkpoint and overlay)."""

from __future__ import annotations

import csv
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from roles.protocol.serving import DenseDelta, RowDelta
from roles.serving import live as live_module
from roles.serving.client import Client, request_body
from roles.serving.model import ExportedModel
from roles.serving.served import version_of
from roles.testbed.jobs import ADULT_JOB
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.serving import ServerThread, predicted
from zbus.codec import decode

pytestmark = pytest.mark.inprocess


class Recorder:
    """Every RowDelta and DenseDelta a job publishes (a SUB of its own, connected before the
    job starts), on a thread."""

    def __init__(self, cluster):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.RCVHWM, 0)
        for name in [*(f"rows-{i}" for i in range(cluster.shards)), "dense"]:
            self.sub.connect(cluster.endpoint(name))
        self.rows: list[RowDelta] = []
        self.dense: list[DenseDelta] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.sub.poll(50):
                msg = decode(self.sub.recv_multipart(copy=False)).msg
                (self.rows if isinstance(msg, RowDelta) else self.dense).append(msg)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sub.close(0)
        self.ctx.term()

    def version(self, model: ExportedModel, cut: int) -> ExportedModel:
        """``model`` (the job's export: its network and transform) with the rows and dense
        weights of cut ``cut``, rebuilt from every delta up to it."""
        table: dict[int, np.ndarray] = {}
        by_shard: dict[int, list[RowDelta]] = {}
        for m in self.rows:
            by_shard.setdefault(m.shard, []).append(m)
        for shard, deltas in by_shard.items():
            previous = 0
            for m in deltas:   # each shard's chain, whole from its first cut
                assert m.previous == previous, (shard, m.cut, m.previous, previous)
                previous = m.cut
                if m.cut > cut:
                    break
                for k in m.dropped.tolist():
                    table.pop(k, None)
                for k, row in zip(m.keys.tolist(), m.rows, strict=True):
                    table[k] = row.copy()
        params = [m for m in self.dense if m.cut <= cut and len(m.params)][-1].params
        keys = np.array(sorted(table), dtype=np.int64)
        model.keys = keys
        model.rows = np.stack([table[k] for k in keys.tolist()]).astype(np.float32)
        torch.nn.utils.vector_to_parameters(torch.from_numpy(params.copy()),
                                            model.net.parameters())
        return model


def scored(model: ExportedModel, table: list[dict[str, str]], path: Path) -> np.ndarray:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    return predicted(model, path)


def test_every_live_answer_is_the_parameters_of_the_cut_it_names(tmp_path, monkeypatch):
    """A job trains with a cut every 50 ms and a checkpoint every 2 s while the server follows
    it and is asked the same rows over and over; a second server starts mid-job (it loads the
    newest checkpoint and asks the shards for the rows changed since). Each answer of either
    names ``round.checkpoint.cut``; rebuilt from the deltas alone, that cut's rows and weights
    give exactly the answer. The servers fold their overlays into each newer checkpoint
    (joining again on it) as soon as it holds a quarter of the checkpoint's rows: on Adult's
    ~100 keys, every checkpoint, so the joins run again and again."""
    monkeypatch.setattr(live_module, "REBASE_ROWS", 0)
    c = LocalCluster(tmp_path / "job", ADULT_JOB, in_process=True, train__epochs=2,
                     checkpoint__every_s=2.0, checkpoint__keep=1000, serving__publish_ms=50)
    recorder = Recorder(c.job.cluster)
    answers: list[tuple[str, list[float]]] = []
    late_answers: list[tuple[str, list[float]]] = []
    table = adult_rows(8)
    try:
        (c.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        with ServerThread(follow=str(c.run_dir), poll_s=0.05) as server:
            c.start_all()
            client, meta = Client(server.url), None
            late, late_client = None, None   # a second server, started mid-job
            while c.procs["control-0"].poll() is None:
                if meta is None:
                    status, got = client.call("GET", "/v2/models/adult")
                    meta = got if status == 200 else None
                    continue
                status, reply = client.infer("adult", request_body(meta, table))
                assert status == 200, reply
                answers.append((reply["model_version"], reply["outputs"][0]["data"]))
                if late is None and len({v for v, _ in answers}) >= 20:
                    late = ServerThread(follow=str(c.run_dir), poll_s=0.05)
                    late_client = Client(late.url)
                if late_client is not None:
                    status, reply = late_client.infer("adult", request_body(meta, table))
                    if status == 200:
                        late_answers.append((reply["model_version"],
                                             reply["outputs"][0]["data"]))
            assert c.wait() == 0, c.logs()
            follower = getattr(server.follower, "inner", None) or server.follower
            client.close()
            if late is not None:
                late_client.close()
                late.close()
    finally:
        recorder.close()
        c.close()
    live = sorted({v for v, _ in answers if v.count(".") == 2}, key=lambda v: int(v.split(".")[2]))
    assert len(live) >= 10, (live, follower.resyncs)   # it followed the job cut by cut
    late_live = {v for v, _ in late_answers if v.count(".") == 2}
    assert len(late_live) >= 3, late_live   # the late server caught up, and followed
    assert follower.joins >= 2 and not follower.resyncs, (follower.joins, follower.resyncs)
    export = c.run_dir / "export"
    checkpoints = {version_of(ExportedModel(p).manifest): p
                   for p in (c.run_dir / "checkpoints").iterdir() if p.name.isdigit()}
    expected = {}
    for version in {v for v, _ in answers + late_answers}:
        if version.count(".") == 2:
            model = recorder.version(ExportedModel(export), int(version.split(".")[2]))
        else:   # the checkpoint served before the first cut was in
            model = ExportedModel(checkpoints[version])
        expected[version] = scored(model, table, tmp_path / "rows.csv")
    for version, got in answers + late_answers:
        np.testing.assert_allclose(got, expected[version], rtol=0, atol=1e-6)
    assert not np.allclose(expected[live[0]], expected[live[-1]])   # it did train meanwhile


def adult_rows(n: int) -> list[dict[str, str]]:
    import gzip

    from roles.testbed.jobs import REPO
    with gzip.open(REPO / "data" / "adult.csv.gz", "rt") as f:
        reader = csv.DictReader(f)
        return [next(reader) for _ in range(n)]
