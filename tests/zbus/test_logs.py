"""A role's log in the run directory (``zbus.logs``): the lines it logged before it knew the run
come first, every line once, with the time; control's printed closing lines end the file."""

from __future__ import annotations

import logging
import re

import pytest

from zbus import logs

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


@pytest.fixture
def root_logger():
    """The root logger as ``setup_logging`` leaves it, restored afterwards (pytest's own
    handlers included)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_the_lines_from_before_the_run_was_known_come_first_each_once(tmp_path, root_logger):
    logs.setup_logging("ps-1")
    log = logging.getLogger("roles.ps")
    log.info("waiting for control")
    path = logs.to_run_dir(tmp_path, "ps-1")
    assert path == tmp_path / "logs" / "ps-1.log"
    log.info("joined run r1")
    assert logs.to_run_dir(tmp_path, "ps-1") == path   # a second Welcome adds no handler
    log.debug("not at level INFO")
    log.warning("a shard is slow")
    lines = path.read_text().splitlines()
    assert [STAMP.sub("", line) for line in lines] == [
        "INFO [ps-1] roles.ps: waiting for control",
        "INFO [ps-1] roles.ps: joined run r1",
        "WARNING [ps-1] roles.ps: a shard is slow"], lines
    assert all(STAMP.match(line) for line in lines), lines


def test_printed_lines_go_to_the_file_as_printed(tmp_path, root_logger):
    logs.setup_logging("control-0")
    path = logs.to_run_dir(tmp_path, "control-0")
    assert path is not None
    logs.to_file("zbus: completed\nzbus: summary in run/summary.json\n")
    lines = [STAMP.sub("", line) for line in path.read_text().splitlines()]
    assert lines == ["zbus: completed", "zbus: summary in run/summary.json"], lines


def test_a_run_directory_that_cannot_be_written_leaves_stderr_only_and_says_so(
        tmp_path, root_logger, capsys):
    logs.setup_logging("worker-0")
    blocked = tmp_path / "file"
    blocked.write_text("")   # a file where the run directory should be
    assert logs.to_run_dir(blocked, "worker-0") is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"WARNING [worker-0] zbus.logs: worker-0: cannot write its log to {blocked}/logs/"
        "worker-0.log ("), err
