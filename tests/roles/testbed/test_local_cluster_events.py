"""The test cluster's reading of control's metrics events (``LocalCluster.events``), while
control appends to the file."""

from __future__ import annotations

from harness import ADULT_JOB

from roles.testbed.local_cluster import LocalCluster


def test_a_line_control_is_still_writing_is_left_for_the_next_look(tmp_path):
    """A fresh clone's CI once read ``metrics.jsonl`` between the two halves of a line and
    failed on it (``JSONDecodeError``); the events are the whole lines, the rest comes later."""
    c = LocalCluster(tmp_path, ADULT_JOB)
    try:
        c.run_dir.mkdir(parents=True, exist_ok=True)
        path = c.run_dir / "metrics.jsonl"
        assert c.events() == []
        path.write_bytes(b'{"event":"a"}\n{"event":"b","n":1}\n{"event":"c","n"')
        assert c.events() == [{"event": "a"}, {"event": "b", "n": 1}]
        with path.open("ab") as f:
            f.write(b':2}\n')
        assert [e["event"] for e in c.events()] == ["a", "b", "c"]
    finally:
        c.close()
