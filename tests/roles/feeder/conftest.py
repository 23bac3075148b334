"""A stream job for the feeder's parts, read from a job file as a running feeder reads it."""

from __future__ import annotations

import pytest

from roles.data.rejected import RejectedRows
from roles.job.settings import Job, load_job

STREAM_JOB = """name = "clicks"
[data]
label = "click"
dense = ["x"]
sparse = ["c"]
[stream]
url = "nats://127.0.0.1:4222"
topic = "impressions"
"""


@pytest.fixture
def stream_job(tmp_path):
    """``make(more)``: the job, ``more`` TOML after its [stream] section, and where its
    rejected events go."""
    def make(more: str = "") -> tuple[Job, RejectedRows]:
        path = tmp_path / "job.toml"
        path.write_text(STREAM_JOB + more)
        return load_job(path, environ={}), RejectedRows(tmp_path / "rejected.tsv",
                                                        tmp_path / ".parts")
    return make
