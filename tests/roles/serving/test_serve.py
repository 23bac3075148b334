"""``zbus-serve`` on a real loopback port (its application on a thread of the test's process):
the Open Inference Protocol's routes, the same probability as ``zbus-predict`` for the same
export and rows, micro-batching, every bad request answered with the protocol's error body while
the server goes on, and a running job followed checkpoint by checkpoint."""

from __future__ import annotations

import csv
import gzip
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import psutil
import pytest

from roles.checkpoint.files import LATEST
from roles.serving.client import Client, request_body
from roles.serving.model import ExportedModel
from roles.serving.served import Served, version_of
from roles.testbed.jobs import ADULT_JOB, REPO
from roles.testbed.local_cluster import BIN, LocalCluster
from roles.testbed.serving import ServerThread, predicted

pytestmark = pytest.mark.inprocess

ROWS = 300


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run of the Adult job (2 epochs, a checkpoint as each begins, all kept): its
    directory, with ``export`` and ``checkpoints``."""
    work = tmp_path_factory.mktemp("adult")
    c = LocalCluster(work, ADULT_JOB, in_process=True, train__epochs=2,
                     checkpoint__every_s=0, checkpoint__keep=20)
    try:
        c.start_all()
        for epoch in range(2):   # (asked, feeding paused: however fast the host trains)
            c.wait_for_event(lambda e, k=epoch: e["event"] == "epoch_start" and e["epoch"] == k)
            c.checkpoint()
        assert c.wait(timeout=300) == 0, c.logs()
    finally:
        c.close()
    return c.run_dir


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> tuple[Path, list[dict[str, str]]]:
    """The first rows of the Adult data (some with '?', a missing value), as a CSV file and
    as text by column."""
    path = tmp_path_factory.mktemp("rows") / "rows.csv"
    with gzip.open(REPO / "data" / "adult.csv.gz", "rt") as src, open(path, "w") as out:
        for i, line in enumerate(src):
            if i > ROWS:
                break
            out.write(line)
    with open(path) as f:
        table = list(csv.DictReader(f))
    assert any("?" in r.values() for r in table)
    return path, table


def probabilities(reply: dict) -> np.ndarray:
    (output,) = reply["outputs"]
    assert output["name"] == "probability" and output["shape"] == [len(output["data"])]
    return np.asarray(output["data"])


def test_served_probabilities_are_zbus_predicts_and_concurrent_requests_share_a_batch(
        trained, rows):
    path, table = rows
    model = ExportedModel(trained / "export")
    expected = predicted(model, path)
    assert len(expected) == len(table)
    # a batch leaves when it holds max_batch rows: 6 requests of 50 rows, then, are scored in
    # one batch (the wait, long enough for all of them, is cut short by the sixth)
    with ServerThread(Served.of(model), max_batch=ROWS, max_wait_s=30.0) as server:
        meta = Client(server.url).metadata("adult")
        assert meta["versions"] == [str(model.manifest["round"])]
        replies: dict[int, tuple[int, dict]] = {}

        def ask(k: int) -> None:
            client = Client(server.url)
            body = request_body(meta, table[k * 50:(k + 1) * 50], request_id=f"r{k}")
            replies[k] = client.infer("adult", body)
            client.close()

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(ROWS // 50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        got = []
        for k in range(ROWS // 50):
            status, reply = replies[k]
            assert status == 200, reply
            assert reply["id"] == f"r{k}" and reply["model_name"] == "adult"
            assert reply["model_version"] == str(model.manifest["round"])
            got.append(probabilities(reply))
        np.testing.assert_allclose(np.concatenate(got), expected, rtol=0, atol=1e-6)
        batches = server.holder.metrics.batch_rows.collect()[0].samples
        count = next(s.value for s in batches if s.name.endswith("_count"))
        assert count == 1, batches
        status, text = Client(server.url).call("GET", "/metrics")
        assert status == 200 and "zbus_serve_rows_total 300.0" in text
        assert "zbus_serve_version_lag_seconds" in text


BAD = [
    ("POST", "/v2/models/adult/infer", b"{", 400, "malformed JSON"),
    ("POST", "/v2/models/adult/infer", b"[1, 2]", 400, "a JSON object with 'inputs'"),
    ("POST", "/v2/models/adult/infer", b'{"inputs": []}', 400, "no 'inputs'"),
    ("POST", "/v2/models/other/infer", b'{"inputs": []}', 404, "unknown model 'other'"),
    ("GET", "/v2/models/adult/infer", None, 405, "takes POST"),
    ("POST", "/v2/models/adult/versions/0/infer", b"{}", 404, "is not served"),
    ("GET", "/nowhere", None, 404, "no route /nowhere"),
    ("POST", "/v2/health/live", b"", 405, "takes GET"),
]


def one_row(meta: dict, table: list[dict[str, str]], **change) -> bytes:
    body = orjson.loads(request_body(meta, table[:1]))
    for tensor in body["inputs"]:
        for key, value in change.get(tensor["name"], {}).items():
            tensor[key] = value
    if "drop" in change:
        body["inputs"] = [t for t in body["inputs"] if t["name"] != change["drop"]]
    if "extra" in change:
        body["inputs"].append(change["extra"])
    return orjson.dumps(body)


def test_every_bad_request_gets_the_protocols_error_body_and_the_server_goes_on(
        trained, rows):
    _, table = rows
    with ServerThread(Served.of(ExportedModel(trained / "export")), max_batch=4) as server:
        client = Client(server.url)
        meta = client.metadata("adult")
        bad_bodies = [
            (one_row(meta, table, drop="age"), "missing input(s) 'age'"),
            (one_row(meta, table, extra={"name": "zip", "datatype": "BYTES", "shape": [1],
                                         "data": ["x"]}), "unknown input 'zip'"),
            (one_row(meta, table, age={"datatype": "BYTES", "data": ["39"]}),
             "input 'age' is a dense field"),
            (one_row(meta, table, education={"datatype": "FP32", "data": [3.0]}),
             "input 'education' is a sparse field"),
            (one_row(meta, table, age={"data": ["39"]}), "input 'age', row 0: '39' is not a "
                                                         "number"),
            (one_row(meta, table, education={"data": [7]}), "row 0: 7 is not a string"),
            (one_row(meta, table, age={"shape": [2]}), "shape [2] but 1 value(s)"),
            (one_row(meta, table, age={"shape": [1, 3]}), "a field's shape is [rows]"),
            (one_row(meta, table, age={"data": [12345.5]}).replace(b"12345.5", b"1e999"),
             "malformed JSON: number is infinity"),
            (request_body(meta, table[:5]), "5 rows in one request, more than this server "
                                            "takes (--max-batch 4)"),
        ]
        for body, words in bad_bodies:
            status, reply = client.infer("adult", body)
            assert status == 400 and words in reply["error"], (words, status, reply)
        for method, path, body, code, words in BAD:
            status, reply = client.call(method, path, body)
            assert status == code and words in reply["error"], (path, status, reply)
        status, reply = client.infer("adult", request_body(meta, table[:4]))
        assert status == 200 and len(probabilities(reply)) == 4
        # the routes that are not infer
        assert client.call("GET", "/v2/health/live") == (200, {"live": True})
        assert client.call("GET", "/v2/health/ready") == (200, {"ready": True})
        assert client.call("GET", "/v2/models/adult/ready")[0] == 200
        version = meta["versions"][0]
        assert client.call("GET", f"/v2/models/adult/versions/{version}")[1] == meta
        names = {i["name"]: i["datatype"] for i in meta["inputs"]}
        assert names["age"] == "FP32" and names["education"] == "BYTES" and len(names) == 14
        text = client.call("GET", "/metrics")[1]
        assert 'zbus_serve_requests_total{code="400",kind="infer"} 13.0' in text, text
        client.close()


def test_following_a_run_serves_each_complete_checkpoint_as_it_comes(trained, rows, tmp_path):
    """The follower serves what LATEST names once its checkpoint is complete: nothing before
    the first (live, not ready), then each newer one, whole."""
    _, table = rows
    source = trained / "checkpoints"
    numbers = sorted(p.name for p in source.iterdir() if p.name.isdigit())
    assert len(numbers) >= 2, numbers
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with ServerThread(follow=str(run), poll_s=0.05) as server:
        client = Client(server.url)
        assert client.call("GET", "/v2/health/live")[0] == 200
        assert client.call("GET", "/v2/health/ready") == (503, {"ready": False})
        status, reply = client.call("POST", "/v2/models/adult/infer", b"{}")
        assert status == 503 and "no model is loaded" in reply["error"]
        served = []
        for number in numbers[:2]:   # (a shard's incremental files name older checkpoints)
            shutil.copytree(source / number, run / "checkpoints" / number)
            (run / "checkpoints" / LATEST).write_text(number)
            model = ExportedModel(source / number)
            want = version_of(model.manifest)
            assert want == f"{model.manifest['round']}.{int(number)}"
            for _ in range(600):   # (it polls every 0.05 s, and loads it whole)
                if server.holder.served is not None and server.holder.served.version == want:
                    break
                time.sleep(0.05)
            meta = client.metadata("adult")
            status, reply = client.infer("adult", request_body(meta, table[:20]))
            assert status == 200 and reply["model_version"] == want, reply
            served.append(probabilities(reply))
            path = tmp_path / f"rows{number}.csv"
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(table[0]))
                w.writeheader()
                w.writerows(table[:20])
            np.testing.assert_allclose(served[-1], predicted(model, path), rtol=0, atol=1e-6)
        assert not np.allclose(served[0], served[1])   # another model, trained further
        client.close()


def test_a_model_that_cannot_be_read_is_one_line_and_status_2(tmp_path):
    """(``zbus-serve`` is started, not run here: it would serve on.)"""
    for where, words in [(tmp_path / "nothing", "does not exist"),
                         (tmp_path, "is neither an export")]:
        main = pytest.importorskip("roles.serving.main")
        with pytest.raises(SystemExit) as exit_:
            main.main([str(where), "--port", "0"])
        assert exit_.value.code == 2, words


@pytest.mark.integration
def test_workers_behind_one_port_a_killed_one_comes_back_and_sigterm_ends_them(trained, rows):
    _, table = rows
    proc = subprocess.Popen([str(BIN / "zbus-serve"), str(trained / "export"), "--port", "0",
                             "--workers", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "zbus-serve: serving adult" in line and "(2 processes)" in line, \
            (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" on ")[1].split()[0]

        def ask_all(times: int) -> None:
            for _ in range(times):   # a new connection each: the kernel spreads them
                client = Client(url)
                status, reply = client.infer("adult", request_body(meta, table[:3]))
                assert status == 200 and len(probabilities(reply)) == 3, reply
                client.close()

        client = Client(url)
        client.wait_ready()
        meta = client.metadata("adult")
        for _ in range(400):   # (forked once the port is bound: a moment after the line)
            workers = psutil.Process(proc.pid).children()
            if len(workers) == 2:
                break
            time.sleep(0.05)
        assert len(workers) == 2, workers
        ask_all(20)
        workers[0].kill()   # SIGKILL: the others serve on, and the supervisor starts another
        workers[0].wait(timeout=30)   # (a connection queued to it as it died is reset: each
        ask_all(10)                   # worker has its own socket; clients retry those)
        for _ in range(400):
            now = psutil.Process(proc.pid).children()
            if len(now) == 2 and workers[0].pid not in {p.pid for p in now}:
                break
            time.sleep(0.05)
        assert len(now) == 2, now
        ask_all(10)
        text = Client(url).call("GET", "/metrics")[1]
        rows_total = next(float(x.split()[-1]) for x in text.splitlines()
                          if x.startswith("zbus_serve_rows_total"))
        # every worker's rows, the killed one's too (its file stays): 40 requests of 3 rows
        assert rows_total == 120.0, text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in now)
        assert "ended (status" in proc.stderr.read()   # the supervisor said it restarted one
    finally:
        if proc.poll() is None:
            for p in psutil.Process(proc.pid).children():
                p.kill()
            proc.kill()
            proc.wait()


def test_every_answer_while_following_a_training_job_is_its_named_versions_own(
        tmp_path, rows):
    """A job that publishes no live parameters ([serving] publish_ms = 0) trains and
    checkpoints every half second while the server follows it and is asked the same rows over
    and over (every 5 ms): each answer must be exactly what the checkpoint of the version it
    names computes offline (no answer from a model half swapped in, none named after another
    version than the one that computed it)."""
    _, table = rows
    c = LocalCluster(tmp_path / "job", ADULT_JOB, in_process=True, train__epochs=3,
                     checkpoint__every_s=0.5, checkpoint__keep=1000, serving__publish_ms=0)
    answers: list[tuple[str, list[float]]] = []
    try:
        (c.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        with ServerThread(follow=str(c.run_dir), poll_s=0.02) as server:
            c.start_all()
            client, meta = Client(server.url), None
            deadline = time.monotonic() + 240
            while c.procs["control-0"].poll() is None:
                assert time.monotonic() < deadline, f"still training after 240 s:\n{c.logs()}"
                if meta is None:
                    status, got = client.call("GET", "/v2/models/adult")
                    meta = got if status == 200 else None
                    time.sleep(0.01)
                    continue
                status, reply = client.infer("adult", request_body(meta, table[:8]))
                assert status == 200, reply
                answers.append((reply["model_version"], reply["outputs"][0]["data"]))
                time.sleep(0.005)   # (back to back, the asking took the job's CPU)
            assert c.wait() == 0, c.logs()
            client.close()
    finally:
        c.close()
    by_version = {}
    for manifest in (c.run_dir / "checkpoints").glob("*/manifest.json"):
        by_version[version_of(orjson.loads(manifest.read_bytes()))] = manifest.parent
    versions = {v for v, _ in answers}
    assert len(versions) >= 3, versions   # it did follow the job
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table[:8])
    expected = {v: predicted(ExportedModel(by_version[v]), path) for v in versions}
    for version, got in answers:
        np.testing.assert_allclose(got, expected[version], rtol=0, atol=1e-6)


def test_a_model_over_max_rows_is_served_from_disk_as_from_memory(trained, rows):
    """``--max-rows``: an export, and a checkpoint whose shards' chains hold a full file and an
    incremental one, with more rows than the bound are read into a store on disk; every key's
    row and every probability are those of the model held in memory, and a model within the
    bound is held in memory."""
    path, _ = rows
    checkpoint = max((p for p in (trained / "checkpoints").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    chain = orjson.loads((checkpoint / "manifest.json").read_bytes())["parts"]["ps-0"]
    assert len(chain) >= 2, chain   # a full file, then an incremental one
    for where in (trained / "export", checkpoint):
        memory, disk = ExportedModel(where), ExportedModel(where, max_rows=10)
        assert memory.store is None and disk.store is not None
        assert len(disk.keys) == len(memory.keys) > 10
        found, got = disk.find(np.concatenate([memory.keys, [3, -3]]))
        assert found.tolist() == [True] * len(memory.keys) + [False, False]
        assert np.array_equal(got[:-2], memory.rows) and not got[-2:].any()
        np.testing.assert_array_equal(predicted(disk, path), predicted(memory, path))
        assert ExportedModel(where, max_rows=len(memory.keys)).store is None
