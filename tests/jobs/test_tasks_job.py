"""Several labels ([data] labels): a job of two tasks trains both, each task's figures in the
summary equal to a direct computation on the same scores, and the same tasks trained alone
(each its own job) score as their task in the multi-task job does."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest

from roles.testbed.two_labels import columns, write_two_labels

pytestmark = pytest.mark.inprocess

ROWS = 60_000


@pytest.fixture(scope="module")
def two_labels(tmp_path_factory):
    path = tmp_path_factory.mktemp("two") / "two.csv"
    oracle = write_two_labels(path, ROWS, seed=3)
    return path, oracle


def first_rows(path: Path, rows: int, out: Path) -> Path:
    """The header and the first ``rows`` rows of the CSV file ``path``, as the file ``out``."""
    with open(path) as src, open(out, "w") as sink:
        sink.writelines(line for _, line in zip(range(rows + 1), src, strict=False))
    return out


def job_text(path, labels: list[str], network: str = "mlp", more: str = "") -> str:
    sparse, dense = columns()
    label = f"labels = {labels!r}" if len(labels) > 1 else f"label = {labels[0]!r}"
    return (f'name = "tasks"\n[data]\npath = "{path}"\n{label}\nsparse = {sparse!r}\n'
            f'dense = {dense!r}\neval_fraction = 0.2\n'
            f'[model]\nnetwork = "{network}"\nhidden = [64, 32]\n'
            f'[train]\nepochs = 2\nbatch_size = 256\n'
            f'[cluster]\nworkers = 2\nshards = 2\n{more}').replace("'", '"')


def test_two_labels_train_together_each_with_its_five_figures(cluster, two_labels, tmp_path,
                                                              capsys):
    """Both tasks train; the summary has each task's five figures; zbus-predict scores the
    export's eval split as the job did, and its written scores give each figure as sklearn
    (and a direct GAUC) computes it."""
    from sklearn.metrics import log_loss, roc_auc_score

    from roles.algorithms.shared.metrics import calibration, group_auc, ne
    from roles.tools import predict
    path, oracle = two_labels
    job = tmp_path / "two.toml"
    job.write_text(job_text(path, ["click", "purchase"],
                            more='[metrics]\ngroup_by = "c0"\n'))
    c = cluster(job, checkpoint__every_s=0)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    tasks = s["tasks"]
    assert list(tasks) == ["click", "purchase"]
    assert s["auc"] == tasks["click"]["auc"] and s["logloss"] == tasks["click"]["logloss"]
    for name, f in tasks.items():
        assert 0.5 < f["auc"] < oracle[name] + 0.01, (name, f, oracle)
        assert 0.0 < f["ne"] < 1.0 and 0.8 < f["calibration"] < 1.2, (name, f)
        assert f["gauc"] is not None and 0.5 < f["gauc"] < 1.0 and f["gauc_groups"] > 10
    assert s["gauc_share"] == 1.0
    assert s["samples_trained"] == 2 * s["samples_in_data"]
    assert all(e["rows_once"] == s["samples_in_data"] for e in s["per_epoch"])
    assert "Traceback" not in c.logs()
    capsys.readouterr()
    out = tmp_path / "scores.tsv"
    predict.main([s["export"], str(path), "--split", "eval", "--json", "--out", str(out)])
    figures = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["scored"] == s["eval_samples"]
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert rows[0] == ["score_click", "score_purchase", "click", "purchase"]
    scores = np.array([[float(v) for v in r[:2]] for r in rows[1:]])
    labels = np.array([[float(v) if v else np.nan for v in r[2:]] for r in rows[1:]])
    c0 = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
        column_types={"c0": pa.string()}))["c0"]
    groups = pc.fill_null(c0, "").to_numpy(zero_copy_only=False)[-len(scores):]
    grouped = groups != ""   # a missing value is in no group
    for t, name in enumerate(["click", "purchase"]):
        known = ~np.isnan(labels[:, t])
        y, p = labels[known, t], scores[known, t]
        mine, job = figures["tasks"][name], tasks[name]
        assert abs(mine["auc"] - job["auc"]) < 1e-4, (name, mine, job)   # the same model
        assert abs(mine["auc"] - roc_auc_score(y, p)) < 2e-4    # binned (docs/limits.md)
        assert abs(mine["logloss"] - log_loss(y, p)) < 1e-5     # (scores written to 6 digits)
        assert abs(mine["ne"] - ne(y, p)) < 1e-5
        assert abs(mine["calibration"] - calibration(y, p)) < 1e-5
        mine_g = grouped[known]
        gauc, _ = group_auc(y[mine_g], p[mine_g], groups[known][mine_g])
        assert abs(job["gauc"] - gauc) < 1e-4, (name, job["gauc"], gauc)


def test_zbus_serve_answers_each_label_as_zbus_predict_scores_it(cluster, two_labels,
                                                                 tmp_path):
    """The export of a two-label job served: the metadata names the labels, and every row's
    answer is ``[rows, 2]``, zbus-predict's probabilities to 1e-6."""
    import csv

    from roles.serving.client import Client, request_body
    from roles.serving.model import ExportedModel
    from roles.serving.served import Served
    from roles.testbed.serving import ServerThread, predicted
    path, _ = two_labels
    job = tmp_path / "two.toml"
    job.write_text(job_text(path, ["click", "purchase"], "mmoe"))
    c = cluster(job, checkpoint__every_s=0, train__epochs=1)
    assert c.run_job() == 0, c.logs()
    model = ExportedModel(Path(c.summary()["export"]))
    head = first_rows(path, 200, tmp_path / "head.csv")
    expected = predicted(model, head)
    assert expected.shape == (200, 2)
    with open(head) as f:
        table = list(csv.DictReader(f))
    with ServerThread(Served.of(model)) as server:
        client = Client(server.url)
        meta = client.metadata("tasks")
        (output,) = meta["outputs"]
        assert output["shape"] == [-1, 2] and output["parameters"] == {
            "labels": "click,purchase"}
        status, reply = client.infer("tasks", request_body(meta, table))
        client.close()
    assert status == 200, reply
    (got,) = reply["outputs"]
    assert got["shape"] == [200, 2]
    np.testing.assert_allclose(np.reshape(got["data"], (200, 2)), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("network", ["mmoe", "esmm"])
def test_the_multi_task_networks_train_two_labels(cluster, two_labels, tmp_path, network):
    path, oracle = two_labels
    job = tmp_path / f"{network}.toml"
    job.write_text(job_text(path, ["click", "purchase"], network))
    c = cluster(job, checkpoint__every_s=0)
    assert c.run_job() == 0, c.logs()
    tasks = c.summary()["tasks"]
    for name, f in tasks.items():
        assert 0.6 < f["auc"] < oracle[name] + 0.01, (network, name, f, oracle)
        assert not math.isnan(f["logloss"])


def test_negative_down_sampling_is_undone_in_every_probability_that_leaves(cluster, two_labels,
                                                                          tmp_path, capsys):
    """``negative_rate = 0.1``: a tenth of the training negatives kept (the rest counted as
    dropped); every probability that leaves is the network's corrected, p / (p + (1 - p) /
    0.1): the eval's calibration far nearer 1 than the uncorrected one, zbus-predict's the
    job's."""
    import dataclasses

    from roles.serving.model import ExportedModel
    from roles.testbed.serving import predicted
    from roles.tools import predict
    path, _ = two_labels
    job = tmp_path / "down.toml"
    job.write_text(job_text(path, ["click"]).replace(
        "eval_fraction = 0.2\n", "eval_fraction = 0.2\nnegative_rate = 0.1\n"))
    c = cluster(job, checkpoint__every_s=0)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    clicks = pacsv.read_csv(path)["click"].to_numpy()
    train = clicks[:s["rows_read"] - s["eval_samples"]]   # the training split's rows
    negatives = int((train == 0).sum())
    kept = s["samples_in_data"] - int(train.sum())
    assert abs(kept - 0.1 * negatives) < 4 * (0.09 * negatives) ** 0.5, (kept, negatives)
    assert s["dropped_rows"] == negatives - kept
    capsys.readouterr()
    predict.main([s["export"], str(path), "--split", "eval", "--json"])
    figures = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    click = s["tasks"]["click"]
    assert abs(figures["tasks"]["click"]["calibration"] - click["calibration"]) < 1e-3
    model = ExportedModel(Path(s["export"]))
    head = first_rows(path, 2000, tmp_path / "head.csv")
    corrected = predicted(model, head)
    model.job = dataclasses.replace(model.job, data=dataclasses.replace(model.job.data,
                                                                        negative_rate=1.0))
    raw = predicted(model, head)   # as trained: on a tenth of the negatives
    np.testing.assert_allclose(corrected, raw / (raw + (1 - raw) / 0.1), rtol=0, atol=1e-6)
    uncorrected = click["calibration"] * raw.mean() / corrected.mean()   # (about: 2,000 rows)
    assert abs(click["calibration"] - 1) < abs(uncorrected - 1) / 5, (click, uncorrected)


def test_the_generators_chain_trains_as_a_job_of_two_labels_with_their_oracles(cluster):
    """``[data.synthetic] conversion``: a job of the built-in data's two labels, each with
    its oracle AUC in the summary, esmm's purchase below its oracle."""
    c = cluster(None, data__synthetic__conversion=True, data__synthetic__rows=40_000,
                model__network="esmm", train__epochs=1, checkpoint__every_s=0)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    assert list(s["tasks"]) == ["click", "purchase"]
    for name, f in s["tasks"].items():
        assert f["oracle_auc"] is not None and 0.5 < f["auc"] < f["oracle_auc"] + 0.01, (name, f)
    assert s["oracle_auc"] == s["tasks"]["click"]["oracle_auc"]
