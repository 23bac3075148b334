"""The in-process cluster's own behaviour (``roles.testbed.in_process``), where it is not a
role's: how it closes a job still running."""

from __future__ import annotations

import pytest
from harness import ADULT_JOB


@pytest.mark.inprocess
def test_closed_mid_job_control_is_stopped_first_and_every_node_leaves_on_its_stop(cluster):
    """Closed while training, as a test's teardown does: control is signalled first, ends the
    job (interrupted) and tells the nodes; each leaves on that Stop, none is signalled itself
    (signalled together, a node in this process ends without a word control could see, and
    control waited for it until its CLOSE_WAIT_S)."""
    c = cluster(ADULT_JOB, train__epochs=100)
    c.start_all(slowdown={0: 3.0, 1: 3.0})
    c.wait_for_event(lambda e: e["event"] == "round_done")
    c.close()   # (and again at the fixture's teardown: nothing then)
    s = c.summary()
    assert s["status"] == "interrupted", s["reason"]
    assert s["reason"].startswith("control received SIGTERM"), s["reason"]
    for name in c.procs:
        assert c.procs[name].poll() is not None, name
        if name != "control-0":
            assert "received SIGTERM" not in c.log(name), c.log(name)
