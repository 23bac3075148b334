from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ordering  # noqa: E402
from harness import Cluster  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``ZBUS_TEST_CPU=<file>``: each test's wall seconds, then its CPU seconds in this
    process and in its waited-for children, and its id, appended to the file as one
    tab-separated line: what the suite's time goes on (``sort -t$'\t' -k3 -rn <file>``). The
    suite on 2 cores is bound by CPU: docs/architecture.md, "Tests"."""
    path = os.environ.get("ZBUS_TEST_CPU")
    if not path:
        yield
        return
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    reaped = _reaped_by_children()
    started = time.monotonic()
    yield
    me2, kids2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    cpu_self = me2.ru_utime + me2.ru_stime - me.ru_utime - me.ru_stime
    cpu_children = kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime
    after = _reaped_by_children()   # the zygote's forks: reaped by it, not by this process
    cpu_children += sum(t - reaped.get(pid, 0.0) for pid, t in after.items())
    with open(path, "a") as f:
        f.write(f"{time.monotonic() - started:.2f}\t{cpu_self:.2f}\t{cpu_children:.2f}\t"
                f"{item.nodeid}\n")


def _reaped_by_children() -> dict[int, float]:
    """CPU seconds of the descendants each live child of this process has waited for."""
    import psutil
    out = {}
    for child in psutil.Process().children():
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        out[child.pid] = t.children_user + t.children_system
    return out


def _integration(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("integration") is not None


def _in_process(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("inprocess") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The integration tests first, then the in-process ones, the unit tests (each well under a
    second) last; under pytest-xdist (``scripts/test``), laid out for its workers by
    ``tests/ordering.py``: each worker's share of the expected seconds about equal, its longest
    tests first. ``ZBUS_TEST_LANES=N``: at most N integration tests at once."""
    items.sort(key=lambda item: (item.get_closest_marker("integration") is None,
                                 item.get_closest_marker("inprocess") is None))
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers > 1:
        durations = ordering.load()
        items[:] = ordering.plan(
            items, workers, lambda item: durations.get(item.nodeid),
            lambda item: item.get_closest_marker("integration") is not None,
            int(os.environ.get("ZBUS_TEST_LANES") or 0))


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    """Keeps the tiers honest: a test without the ``integration`` mark (the fast tier,
    ``scripts/test -m "not integration"``) fails if it starts a process."""
    if not _integration(request):
        def refuse(*args, **kwargs):
            raise AssertionError(f"{request.node.nodeid} starts a process: mark it "
                                 "@pytest.mark.integration")
        monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


@pytest.fixture(autouse=True)
def _in_process_jobs_leave_no_thread(request):
    """A whole job run in the test's process leaves nothing running in it: every thread its
    roles started (a feeder's reader, a monitoring server) has ended once the test's clusters
    are closed (pyzmq's own garbage collector, one per process, aside)."""
    if not _in_process(request):
        yield
        return
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()
                and "GarbageCollector" not in type(t).__name__]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"{request.node.nodeid} left threads running: {left}"


@pytest.fixture(scope="session")
def zygote():
    """The process the clusters' role processes are forked from (``roles.testbed.zygote``),
    one per test process, started at its first fork; its children are killed at the end."""
    from roles.testbed.zygote import Zygote
    forks = Zygote()
    yield forks
    forks.close()


@pytest.fixture
def cluster(request, tmp_path, zygote):
    """Factory of Clusters; every process they started is killed at teardown, pass or fail. A
    test marked ``inprocess`` gets clusters whose roles run in this process
    (``roles.testbed.in_process``), one marked ``integration`` clusters of processes."""
    in_process = _in_process(request)
    if not in_process and not _integration(request):
        pytest.fail(f"{request.node.nodeid} uses the cluster fixture: mark it "
                    "@pytest.mark.inprocess (its roles in this process) or "
                    "@pytest.mark.integration (processes)")
    made: list[Cluster] = []

    def make(*args, **kwargs) -> Cluster:
        kwargs.setdefault("in_process", in_process)
        kwargs.setdefault("zygote", None if in_process else zygote)
        c = Cluster(tmp_path / f"cluster{len(made)}", *args, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def nats(tmp_path):
    """A real nats-server with JetStream on a loopback port (``roles.testbed.nats_server``),
    killed at teardown."""
    from roles.testbed.nats_server import NatsServer
    server = NatsServer(tmp_path / "nats")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def kafka():
    """librdkafka's mock cluster on loopback (``roles.testbed.kafka_mock``), in this process;
    closed at teardown."""
    from roles.testbed.kafka_mock import MockKafka
    cluster = MockKafka()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def s3():
    """A local S3 server (moto) on a loopback port, with the bucket ``zbus-test``; one per
    test module, killed (its process group) when the module's tests are done."""
    from roles.testbed.s3 import S3Server
    server = S3Server()
    try:
        yield server
    finally:
        server.close()
