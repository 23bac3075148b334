"""The one-process comparator of a stream job (``zbus-reference --events``): a copy frozen
after its first events scores every event and trains on none after them."""

from __future__ import annotations

import gzip

from harness import REPO

from roles.job.settings import load_job
from roles.tools.stream_reference import score_then_train

JOB = """
name = "frozen"
[data]
format = "csv"
label = "income"
positive = [">50K", ">50K."]
negative = ["<=50K", "<=50K."]
dense = ["age", "hours-per-week"]
sparse = ["workclass", "education", "occupation", "relationship"]
[stream]
url = "nats://127.0.0.1:4222"
topic = "t"
window_events = 1000
warmup_events = 500
[model]
embedding_dim = 4
hidden = [16]
[train]
batch_size = 100
"""


def test_a_model_frozen_after_its_first_events_scores_all_and_learns_less(tmp_path):
    lines = gzip.open(REPO / "data" / "adult.csv.gz", "rt").read().splitlines()[:6001]
    data = tmp_path / "adult.csv"
    data.write_text("\n".join(lines) + "\n")
    (tmp_path / "job.toml").write_text(JOB)
    job = load_job(str(tmp_path / "job.toml"), environ={})
    learning = score_then_train(job, str(data))
    frozen = score_then_train(job, str(data), freeze_after=200)
    never = score_then_train(job, str(data), freeze_after=6000)
    assert learning["events"] == frozen["events"] == never["events"] == 6000
    assert frozen["frozen_after"] == 200 and learning["frozen_after"] is None
    assert len(frozen["windows"]) == len(learning["windows"]) == 6
    # training on every event (a freeze after the last is none) is the same run
    assert never["windows"] == learning["windows"]
    # two batches of training, then none: every later window scores below the learner's
    assert all(f["auc"] < a["auc"] for f, a in zip(frozen["windows"][1:],
                                                    learning["windows"][1:], strict=True)), \
        (frozen["windows"], learning["windows"])
