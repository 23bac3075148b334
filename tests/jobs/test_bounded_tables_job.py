"""Bounded embedding tables in real jobs (``[embeddings]``: admission, expiry, eviction):
the counts reach the summary and the metrics, the export scores as the job did, skew-aware
placement moves rows with admission on (with checkpoints, restarts and resume:
``test_bounded_resume.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from harness import REPO, criteo_data, job_text, text_split_rows

from roles.checkpoint.files import checkpoints_dir, latest_complete
from roles.checkpoint.model_files import embeddings_file, load_default_rows, load_embeddings
from roles.checkpoint.shard import read_chain
from roles.testbed.criteo import write_criteo
from roles.tools import predict

ZIPF_JOB = REPO / "jobs" / "zipf.toml"   # mode skew, windows of 10 batches
ADULT_TRAIN_ROWS = 39074
EMBEDDINGS = "[embeddings]\nmin_count = 3\nexpire_batches = 60\nsketch_mb = 1\n"


@pytest.mark.inprocess
def test_admission_and_expiry_counts_reach_the_summary_and_the_export_scores_the_same(
        cluster, tmp_path, capsys):
    data = write_criteo(tmp_path / "criteo-40000.tsv", 40_000)
    job = tmp_path / "criteo.toml"
    job.write_text(job_text("criteo-bounded", criteo_data(data), hidden=(32,), epochs=2,
                            batch_size=256, more=EMBEDDINGS))
    c = cluster(job)
    assert c.run_job() == 0, c.logs()
    s = c.summary()
    t = s["tables"]
    assert (t["min_count"], t["expire_batches"], t["sketch_mb"]) == (3, 60, 1)
    assert set(t["shards"]) == {"ps-0", "ps-1"}
    for node, figures in t["shards"].items():
        assert figures["admitted"] > 0 and figures["rejected"] > 0, (node, figures)
        assert figures["expired"] > 0 and figures["evicted"] == 0, (node, figures)
        assert figures["rows"] == s["shards"][node]["keys"]
        assert figures["sketch_bytes"] == 1 << 20
        # every row held was admitted once (a row expired and admitted again counts twice)
        assert figures["rows"] == figures["admitted"] - figures["expired"]
    assert not any(n.startswith("ps-") for n in s["rejected_messages"]), s["rejected_messages"]
    train_rows, eval_rows = text_split_rows(data, "criteo")   # about 32,000 and 8,000: by bytes
    assert s["samples_trained"] == 2 * train_rows and s["auc"] > 0.6, s["auc"]
    events = [e for e in c.events() if e["event"] == "tables"]
    assert events and set(events[-1]["shards"]) == {"ps-0", "ps-1"}
    # the export holds each shard's live rows and its default rows; scored by zbus-predict,
    # the eval split gives the job's AUC (unknown keys take their field's default row)
    export = Path(s["export"])
    for shard in range(2):
        keys, rows = load_embeddings(export / embeddings_file(shard))
        assert len(keys) == t["shards"][f"ps-{shard}"]["rows"] == len(rows)
        defaults = load_default_rows(export / embeddings_file(shard))
        assert defaults.shape == (26, 8) and np.abs(defaults).sum() > 0   # trained
    capsys.readouterr()
    predict.main([str(export), str(data), "--split", "eval", "--json"])   # exit status 0
    figures = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["scored"] == s["eval_samples"] == eval_rows
    # an eval look-up makes no row: a key without one scores on its field's default row in
    # the job as in zbus-predict (not to the last digit: batches of other sizes sum otherwise)
    assert abs(figures["auc"] - s["auc"]) < 1e-4, (figures, s["auc"])


@pytest.mark.inprocess
def test_skew_placement_moves_rows_with_admission_and_expiry_on(cluster):
    # the capacities given (ps-1 runs at half speed): placement moves keys from the first
    # windows on, not only once control's predictor is trained in its child process, which on
    # a loaded machine can come after this short job's end
    c = cluster(ZIPF_JOB, embeddings__min_count=3, embeddings__expire_batches=150,
                checkpoint__every_s=1.0, placement__capacities=[2.0, 1.0])
    assert c.run_job(ps_slowdown={1: 2.0}) == 0, c.logs()
    s = c.summary()
    p = s["placement"]
    assert p["migrations"] >= 1 and p["moved_keys"] > 0, {k: v for k, v in p.items()
                                                          if k != "windows"}
    moved_out = sum(x["keys_moved_out"] for x in s["shards"].values())
    assert moved_out == sum(x["keys_moved_in"] for x in s["shards"].values()) == p["moved_keys"]
    t = s["tables"]
    assert all(f["admitted"] > 0 and f["rejected"] > 0 for f in t["shards"].values()), t
    assert t["total"]["expired"] > 0, t
    assert not any(n.startswith("ps-") for n in s["rejected_messages"]), s["rejected_messages"]
    # each key on one shard only, every row finite, the default rows kept by both shards
    seen: set[int] = set()
    for shard in range(2):
        keys, rows = load_embeddings(Path(s["export"]) / embeddings_file(shard))
        assert not seen & set(keys.tolist()), "a key exported by two shards"
        seen |= set(keys.tolist())
        assert np.isfinite(rows).all() and len(keys) == t["shards"][f"ps-{shard}"]["rows"]
        assert load_default_rows(Path(s["export"]) / embeddings_file(shard)).shape == (8, 16)
    assert s["samples_trained"] == 4 * 48_000 and s["auc"] > 0.75, s["auc"]
    # checkpoints were cut between migrations: the newest one's chains hold each key once,
    # on the shard that held it then, with the default rows
    assert s["checkpoints"]["complete"] >= 1, s["checkpoints"]
    number, _, manifest = latest_complete(c.run_dir)
    held: set[int] = set()
    for shard in range(2):
        got = read_chain(checkpoints_dir(c.run_dir), manifest["parts"][f"ps-{shard}"])
        assert not held & set(got.keys.tolist()), "a key checkpointed by two shards"
        held |= set(got.keys.tolist())
        assert np.isfinite(got.weights).all() and got.default_weights.shape == (8, 16)

