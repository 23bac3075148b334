"""``[stream]`` settings (``roles.job.stream_settings``), read as a job file's section is:
what a stream needs, each mistake one line naming the key."""

from __future__ import annotations

import tomllib

import pytest

from roles.job.settings import JobError, _build
from roles.job.stream_settings import StreamConfig


def read(text: str) -> StreamConfig:
    return _build(StreamConfig, tomllib.loads(text).get("stream", {}), ("stream",))


def test_a_stream_section_reads_with_its_defaults():
    s = read('[stream]\nurl = "nats://127.0.0.1:4222"\ntopic = "clicks"\n'
             '[stream.labels]\ntopic = "labels"\nwindow_s = 60\n'
             '[stream.options]\ntoken = "s3cret"\n')
    assert (s.url, s.topic, s.format, s.group, s.start, s.linger_ms) == (
        "nats://127.0.0.1:4222", "clicks", "json", "", "earliest", 50.0)
    assert (s.labels.topic, s.labels.id_field, s.labels.window_s) == ("labels", "event_id", 60.0)
    assert s.options == {"token": "s3cret"} and read("").url == ""


@pytest.mark.parametrize(("text", "said"), [
    ('url = "http://x:1"\ntopic = "t"', "[stream] url must be nats://host:port or kafka://"),
    ('url = "kafka://x:1"', "[stream] topic is required"),
    ('url = "kafka://x:1"\ntopic = "t"\nformat = "tsv"', "needs [stream] columns"),
    ('url = "kafka://x:1"\ntopic = "t"\nformat = "avro"', "format"),
    ('url = "kafka://x:1"\ntopic = "t"\nlinger = 5', "unknown key [stream] linger"),
    ('url = "kafka://x:1"\ntopic = "t"\n[stream.labels]\ntopic = "t"', "must differ"),
])
def test_each_mistake_is_one_line_naming_it(text, said):
    with pytest.raises(JobError, match=None) as exc:
        read("[stream]\n" + text)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_labels_of_their_own_topic_are_joined_by_one_feeder(tmp_path):
    from roles.job.settings import load_job
    path = tmp_path / "job.toml"
    path.write_text('name = "j"\n[data]\nlabel = "y"\nsparse = ["c"]\n'
                    '[stream]\nurl = "nats://127.0.0.1:4222"\ntopic = "imp"\n'
                    '[stream.labels]\ntopic = "clicks"\n[cluster]\nfeeders = 2\n')
    with pytest.raises(JobError) as exc:
        load_job(path, environ={})
    assert "joined by one feeder" in str(exc.value) and "\n" not in str(exc.value)
    path.write_text(path.read_text().replace("feeders = 2", "feeders = 1"))
    assert load_job(path, environ={}).stream.labels.topic == "clicks"


@pytest.mark.parametrize(("written", "environ", "sync", "embeddings"), [
    ("", {}, "step", "pull"),
    ('[train]\nsync = "every"\n', {}, "every", "pull"),
    ("", {"ZBUS_TRAIN__EMBEDDINGS": "push"}, "step", "push"),
])
def test_a_stream_job_trains_as_one_process_would_unless_told_otherwise(written, environ,
                                                                        sync, embeddings):
    from roles.job.settings import parse_job
    base = 'name = "j"\n[data]\nlabel = "y"\nsparse = ["c"]\n'
    stream = '[stream]\nurl = "nats://127.0.0.1:4222"\ntopic = "t"\n'
    job = parse_job(base + stream + written, environ=environ)
    assert (job.train.sync, job.train.embeddings) == (sync, embeddings)
    # a file job keeps the general defaults
    file_job = parse_job(base.replace('label = "y"', 'label = "y"\npath = "x.csv"'), environ={})
    assert (file_job.train.sync, file_job.train.embeddings) == ("every", "push")
