"""An oracle for live serving (``zbus-serve --follow`` of a job that publishes its parameters):
every RowDelta and DenseDelta its roles publish, recorded where they are made (the roles run in
this process), each version a server names rebuilt from them alone (a dict of rows from each
shard process's first cut on, not the server's checkpoint and overlay), and threads that ask a
server the same rows over and over. ``tests/roles/serving/test_live.py`` and
``scripts/bench_torn.py`` check every answer against it."""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roles.checkpoint.files import read_manifest
from roles.protocol.serving import DenseDelta, RowDelta
from roles.serving.client import Client, request_body
from roles.serving.live import rounded_as_sent
from roles.serving.model import ExportedModel
from roles.serving.publishing import DensePublisher, RowPublisher
from roles.serving.served import version_of
from roles.testbed.local_cluster import LocalCluster
from roles.testbed.serving import predicted


class Recorder:
    """Every RowDelta and DenseDelta the job's shards and aggregator publish, taken where they
    are made (the roles run in this process: ``RowPublisher.cut`` and ``DensePublisher.cut``
    wrapped), so that nothing a socket may drop (a SUB reconnecting to a restarted shard) is
    missing from the oracle."""

    def __init__(self, patch: Callable[[Any, str, Any], None]):
        """``patch``: sets an attribute for as long as the recording lasts (pytest's
        ``monkeypatch.setattr``, or ``Patches.set``)."""
        self.rows: list[RowDelta] = []
        self.dense: list[DenseDelta] = []
        for cls, into in ((RowPublisher, self.rows), (DensePublisher, self.dense)):
            made = cls.cut

            def cut(publisher, *args, made=made, into=into):
                delta = made(publisher, *args)
                if delta is not None:
                    into.append(delta)
                return delta
            patch(cls, "cut", cut)

    def incarnations(self, shard: int) -> list[str]:
        """Shard ``shard``'s processes, in the order they published."""
        return list(dict.fromkeys(m.incarnation for m in self.rows if m.shard == shard))

    def versions(self, cuts: list[int], bases: dict[str, dict[int, np.ndarray]] | None = None
                 ) -> Iterator[tuple[int, dict[int, np.ndarray], np.ndarray]]:
        """For each cut of ``cuts``, ascending: its rows (key -> row) and dense weights,
        rebuilt from the deltas alone: each shard's from the chain of the process that
        published its part of the cut, whole from that process's first cut, on the rows it
        restored (``bases``, by its incarnation); the weights the newest the aggregator sent
        up to the cut. Each delta is read once, whatever the number of cuts."""
        by_process: dict[tuple[int, str], list[RowDelta]] = {}
        publisher: dict[tuple[int, int], str] = {}   # (shard, cut) -> its process
        for m in self.rows:
            by_process.setdefault((m.shard, m.incarnation), []).append(m)
            publisher[(m.shard, m.cut)] = m.incarnation
        shards = sorted({shard for shard, _ in by_process})
        # per process: its rows so far, its next delta, the cut of the one before
        state = {p: (dict((bases or {}).get(p[1], {})), 0, 0) for p in by_process}
        dense = sorted((m for m in self.dense if len(m.params)), key=lambda m: m.cut)
        at, params = 0, None
        for cut in sorted(cuts):
            table: dict[int, np.ndarray] = {}
            for shard in shards:
                process = (shard, publisher[(shard, cut)])
                rows, i, previous = state[process]
                deltas = by_process[process]
                while i < len(deltas) and deltas[i].cut <= cut:
                    m = deltas[i]
                    assert m.previous == previous, (shard, m.cut, m.previous, previous)
                    previous, i = m.cut, i + 1
                    for k in m.dropped.tolist():
                        rows.pop(k, None)
                    # as sent: float32 rows, or int8 ones times their row's scale
                    sent = m.qrows.astype(np.float32) * m.scales[:, None] if len(m.qrows) \
                        else m.rows
                    for k, row in zip(m.keys.tolist(), sent, strict=True):
                        rows[k] = row.copy()
                state[process] = (rows, i, previous)
                table.update(rows)
            while at < len(dense) and dense[at].cut <= cut:
                params, at = dense[at].params, at + 1
            assert params is not None, f"no dense weights published by cut {cut}"
            yield cut, table, params


def as_version(model: ExportedModel, table: dict[int, np.ndarray],
               params: np.ndarray) -> ExportedModel:
    """``model`` (the job's network and transform) with these rows and dense weights."""
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


def ask(client: Client, meta: dict | None,
        table: list[dict[str, str]]) -> tuple[dict | None, tuple[str, list[float]] | None]:
    """One request of ``table`` (until a model is served, its metadata instead): the metadata,
    and the version and probabilities answered."""
    if meta is None:
        status, got = client.call("GET", "/v2/models/adult")
        return (got if status == 200 else None), None
    status, reply = client.infer("adult", request_body(meta, table))
    assert status == 200, reply
    return meta, (reply["model_version"], reply["outputs"][0]["data"])


class Asking:
    """Threads that ask a server the same rows over and over until ``stop``, each server's
    answers (version, probabilities) in a list of its own (``start``'s); ``pause_s`` between
    one answer and the next request (0: back to back)."""

    def __init__(self, table: list[dict[str, str]], pause_s: float = 0.0):
        self.table = table
        self.pause_s = pause_s
        self.done = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, url: str) -> list[tuple[str, list[float]]]:
        answers: list[tuple[str, list[float]]] = []
        self.threads.append(threading.Thread(target=self._ask, args=(url, answers),
                                             daemon=True))
        self.threads[-1].start()
        return answers

    def _ask(self, url: str, into: list) -> None:
        client, meta = Client(url), None
        while not self.done.is_set():
            meta, answer = ask(client, meta, self.table)
            if answer is not None:
                into.append(answer)
            self.done.wait(self.pause_s)
        client.close()

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(timeout=30)


def live_versions(answers: list) -> int:
    return len({v for v, _ in list(answers) if v.count(".") == 2})


def more_versions(c: LocalCluster, answers: list, n: int, wait_s: float) -> None:
    """Return once ``n`` more live versions are among ``answers`` (within ``wait_s``)."""
    want = live_versions(answers) + n
    for _ in range(int(wait_s / 0.05)):
        if live_versions(answers) >= want:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} more versions served\n{c.logs()}")


def expected_answers(c: LocalCluster, recorder: Recorder, versions: set[str],
                     table: list[dict[str, str]], path: Path,
                     bases: dict[str, dict[int, np.ndarray]] | None = None
                     ) -> dict[str, np.ndarray]:
    """What each version computes for ``table`` offline: a live one (``round.checkpoint.cut``)
    rebuilt from the deltas into the job's network, a checkpoint (served before the first cut
    was in) read from its files."""
    manifests = {p: read_manifest(p)   # (complete ones: an abandoned cut has no manifest)
                 for p in (c.run_dir / "checkpoints").iterdir()
                 if p.name.isdigit() and (p / "manifest.json").is_file()}
    assert all(m is not None for m in manifests.values()), "a checkpoint not complete"
    checkpoints = {version_of(m): p for p, m in manifests.items() if m is not None}
    expected: dict[str, np.ndarray] = {}
    # the live versions by cut (servers joined on different checkpoints name one cut each
    # their way: round.checkpoint.cut)
    live: dict[int, list[str]] = {}
    for v in versions:
        if v.count(".") == 2:
            live.setdefault(int(v.split(".")[2]), []).append(v)
    if live:
        # the job's network and transform: its export, or (a job stopped by a kill) its
        # newest checkpoint's
        export = c.run_dir / "export"
        model = ExportedModel(export if export.is_dir() else c.run_dir)
        for cut, rows, params in recorder.versions(sorted(live), bases):
            answer = scored(as_version(model, rows, params), table, path)
            expected.update((v, answer) for v in live[cut])
    named = {v for names in live.values() for v in names}
    for version in versions - named:   # (rounded as int8 rows travel, with
        model = ExportedModel(checkpoints[version])   # [serving] row_bytes = 1)
        if c.job.serving.row_bytes == 1:
            rounded_as_sent(model)
        expected[version] = scored(model, table, path)
    return expected


class Patches:
    """Attributes set until ``undo`` (a script's ``monkeypatch``)."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self.saved:
            owner, name, value = self.saved.pop()
            setattr(owner, name, value)
