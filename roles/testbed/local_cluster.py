"""Run a whole job on this host from Python (tests and benchmarks use it; people use ``honcho
start``). Each role is its own process in its own session; ``close`` SIGTERMs each process
group, waits, then SIGKILLs whatever is left, including processes that were started for this
cluster in sessions of their own (found by the run directory in their environment).

``in_process=True`` runs every role in this process instead, turned by one thread
(``roles.testbed.in_process``): the same sockets, messages and files, one Python start-up for
the whole job. Its roles answer as processes do (``procs[name]``: poll, wait, send_signal,
kill); what only processes can show (a signal to a process group, a memory budget, a
supervisor) is refused there.

``zygote`` forks the roles' processes from one that has imported them
(``roles.testbed.zygote``: one Python start-up for the job's processes, as the tests run
them); a process a fork cannot be is started afresh.

``budgets`` gives a process a memory limit the kernel enforces as a container's
(``roles.testbed.memory_budget``): a cgroup of its own, which it joins before it runs, its
figures in ``cgroups`` while the cluster lives, removed at ``close``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil

from roles.job.settings import Job, JobError, load_job
from roles.job.starting import abandon, make_role
from roles.job.summary import Summary, read_summary
from roles.testbed.in_process import Driver, RoleHandle, StartError
from roles.testbed.memory_budget import MemoryCgroup
from roles.testbed.zygote import ForkedProcess, Zygote
from roles.tools.ctl import request
from zbus.sockets import free_tcp_ports

BIN = Path(sys.executable).parent


def clean_environ() -> dict[str, str]:
    """This process's environment without ZBUS_* settings, with the venv's scripts on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZBUS_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def endpoint_overrides(names: list[str], transport: str, ipc_dir: str) -> str:
    """A TOML inline table for ZBUS_CLUSTER__ENDPOINTS: ipc paths, or free TCP ports."""
    if transport == "ipc":
        addresses = [f"ipc://{ipc_dir}/{name}" for name in names]
    else:
        addresses = [f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(len(names))]
    return "{" + ", ".join(f'"{n}" = "{a}"' for n, a in zip(names, addresses, strict=True)) + "}"


def setting_pair(text: str) -> tuple[str, str]:
    """``section__key=value`` from a command line (``--set``), the value as text: it becomes a
    ``ZBUS_SECTION__KEY`` variable, which the job schema reads as the key's type (a string key
    takes ``2024-data.csv`` as it is) and checks, naming the variable when it is wrong."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set wants SECTION__KEY=VALUE, got {text!r}")
    return key, value


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return orjson.dumps(value).decode()
    return str(value)


class LocalCluster:
    def __init__(self, workdir: Path, job: Path | None = None, transport: str = "ipc",
                 in_process: bool = False, zygote: Zygote | None = None, **settings: object):
        """``settings`` become ZBUS_<SECTION>__<KEY> overrides (``train__epochs=1``);
        ``in_process``: every role in this process, ``zygote``: its processes forked from
        that one (the module's docstring)."""
        self.workdir = workdir
        self.zygote = zygote
        workdir.mkdir(parents=True, exist_ok=True)
        self.ipc_dir = tempfile.mkdtemp(prefix="zb-", dir="/tmp")  # short: ipc paths are
        self.env = clean_environ()                                  # limited to ~100 bytes
        self.env["ZBUS_RUN_DIR"] = str(workdir / "run")
        for key, value in settings.items():
            self.env[f"ZBUS_{key.upper()}"] = toml_value(value)
        if job is not None:
            self.env["ZBUS_JOB"] = str(job)
        names = load_job(None, environ=self.env).cluster.endpoint_names()
        self.env["ZBUS_CLUSTER__ENDPOINTS"] = endpoint_overrides(names, transport, self.ipc_dir)
        self.job: Job = load_job(None, environ=self.env)
        self.procs: dict[str, subprocess.Popen | ForkedProcess | RoleHandle] = {}
        self.driver = Driver(workdir, self.env.get("ZBUS_LOG_LEVEL", "INFO")) \
            if in_process else None
        self._children_before = _children()
        self.watched = "control-0"  # the process whose end ends a wait for an event
        # process name -> bytes: that process runs in a memory cgroup of that limit (the
        # module's docstring); beyond it the kernel kills it, and the job fails
        self.budgets: dict[str, int] = {}
        self.cgroups: dict[str, MemoryCgroup] = {}
        self._paused = False   # feeding paused by ``paused``

    @property
    def run_dir(self) -> Path:
        return Path(self.env["ZBUS_RUN_DIR"])

    @property
    def in_process(self) -> bool:
        return self.driver is not None

    def start(self, name: str, argv: list[str], group: int | None = None
              ) -> subprocess.Popen | ForkedProcess:
        """``group``: the process group to start it in (0: a new one; as a shell's job
        control would), rather than a session of its own."""
        if self.driver is not None:
            raise RuntimeError(f"{name}: a command ({argv[0]}) runs as a process; this cluster "
                               "runs its roles in this process")
        join = None
        if name in self.budgets:
            if name not in self.cgroups:   # (started again: the same cgroup)
                self.cgroups[name] = MemoryCgroup(name, self.budgets[name])
            join = self.cgroups[name].join
        path = self.workdir / f"{name}.log"
        if self.zygote is not None and self.zygote.can_fork(argv, self.env, group, join):
            path.write_bytes(b"")
            forked = self.procs[name] = self.zygote.start(argv, self.workdir, self.env, path,
                                                          group)
            return forked
        with open(path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=self.workdir, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT,
                                    start_new_session=group is None, process_group=group,
                                    preexec_fn=join)
        self.procs[name] = proc
        return proc

    def start_role(self, role: str, index: int = 0, *args: str, group: int | None = None,
                   name: str | None = None) -> subprocess.Popen | ForkedProcess | RoleHandle:
        """``name``: of its process (its log, ``procs``), when not ``<role>-<index>`` (a
        node started again beside its first process's log)."""
        node = f"{role}-{index}"
        name = name or node
        argv = ["--index", str(index), *args]
        if self.driver is None:
            return self.start(name, [sys.executable, "-m", f"roles.{role}", *argv], group)
        if group is not None or name in self.budgets:
            raise RuntimeError(f"{name}: a process group or a memory budget needs processes "
                               "(LocalCluster without in_process)")
        handle = self.driver.start(name, functools.partial(self._make, role, argv, node),
                                   node=node)
        self.procs[name] = handle
        return handle

    def _make(self, role: str, argv: list[str], name: str):
        """The role's loop, made as its process's entry point makes it (the job from this
        cluster's environment); StartError where that process would exit with a line, an
        ``Unstarted`` node where it would tell control that it cannot start."""
        from roles.job.cli import parse_role_args
        args = parse_role_args(role, argv)
        try:
            job = load_job(args.job, environ=self.env)
        except JobError as exc:
            raise StartError(f"zbus {role}: job error: {exc}") from None
        if role == "control":
            return self._make_control(job, args.resume, name)
        cls = _role_class(role)
        options = {"slowdown": args.slowdown} if hasattr(args, "slowdown") else {}
        # one that cannot start says why and tells control, as its process would
        try:
            loop, failed = make_role(lambda: cls(job, args.index, **options), job, role,
                                     args.index)
        except OSError as exc:   # nor can it tell control (no key pair for the bus)
            raise StartError(f"zbus {name}: cannot start: {exc}") from None
        if failed:
            logging.getLogger(f"zbus.{name}").error("zbus %s: cannot start: %s", name, failed)
        return loop

    def _make_control(self, job: Job, resume: str, name: str):
        # the roles here load torch: control then checks the job's network in this process
        # rather than in a child of its own (roles.control.network_check)
        import torch  # noqa: F401

        from roles.control.main import headline
        from roles.control.process import Control
        from roles.control.state import ResumeError, resumable_run
        driver = self.driver
        assert driver is not None

        def said(summary: Summary, path: Path) -> None:
            driver.say(name, "".join(line + "\n" for line in headline(summary, path)))

        try:
            run = resumable_run(job.name, resume, self.env) if resume else None
            control = Control(job, environ=self.env, resume=run, headline=said)
        except (OSError, ResumeError) as exc:
            abandon(exc)   # the sockets a half-made control bound, closed now, as its exit would
            raise StartError(f"zbus control: cannot start: {exc}") from None
        from zbus.logs import to_run_dir
        to_run_dir(control.run_dir, name)
        return control

    def start_all(self, slowdown: dict[int, float] | None = None,
                  ps_slowdown: dict[int, float] | None = None, resume: bool = False,
                  one_group: bool = False) -> None:
        """Every role of the job; ``slowdown`` maps worker indexes to --slowdown factors,
        ``ps_slowdown`` shard indexes; ``resume``: control goes on with the run;
        ``one_group``: every role in control's process group (as a terminal's foreground job:
        Ctrl-C there signals them all), not each in a session of its own."""
        c = self.job.cluster
        if one_group and self.driver is not None:
            raise RuntimeError("one_group: a process group needs processes")
        slowdown, ps_slowdown = slowdown or {}, ps_slowdown or {}
        control = self.start_role("control", 0, *(["--resume"] if resume else []),
                                  group=0 if one_group else None)  # 0: a group of its own
        group = control.pid if not isinstance(control, RoleHandle) and one_group else None
        start_role = functools.partial(self.start_role, group=group)
        for i in range(c.feeders):
            start_role("feeder", i)
        for i in range(c.shards):
            start_role("ps", i, "--slowdown", str(ps_slowdown.get(i, 1.0)))
        for i in range(c.workers):
            start_role("worker", i, "--slowdown", str(slowdown.get(i, 1.0)))
        for i in range(c.workers * (c.parts - 1)):
            start_role("member", i)
        for i in range(c.aggregators):
            start_role("aggregator", i)

    def events(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        data = path.read_bytes()
        whole = data[:data.rfind(b"\n") + 1]   # (a line control is writing now: next time)
        return [orjson.loads(line) for line in whole.splitlines() if line]

    def wait_for_event(self, predicate, timeout: float = 120.0) -> dict:
        """The first metrics event satisfying ``predicate`` (control, or the process named
        ``watched``, must stay up meanwhile)."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((e for e in self.events() if predicate(e)), None)
            if found is not None:
                return found
            if time.monotonic() > deadline or self.procs[self.watched].poll() is not None:
                raise AssertionError(f"no such event within {timeout} s:\n{self.logs()}")
            time.sleep(0.1)

    def wait(self, name: str = "control-0", timeout: float = 240.0) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout} s; its log:\n"
                                 + self.log(name)[-4000:]) from None

    def run_job(self, timeout: float = 240.0, slowdown: dict[int, float] | None = None,
                ps_slowdown: dict[int, float] | None = None) -> int:
        self.start_all(slowdown, ps_slowdown)
        return self.wait(timeout=timeout)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Feeding paused (``zbus-ctl pause``) while the block runs, resumed after unless the
        job has ended: the job cannot end meanwhile, however fast this host trains (the
        batches out are trained; serving cuts go on)."""
        if self._paused:
            yield
            return
        endpoint = self.job.cluster.endpoint("control_req")
        assert request(endpoint, "pause", timeout_s=20, cluster=self.job.cluster).ok, \
            "control refused to pause"
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            if self.procs[self.watched].poll() is None:
                request(endpoint, "resume", timeout_s=20, cluster=self.job.cluster)

    def checkpoint(self, timeout: float = 60.0) -> int:
        """A whole-job checkpoint taken now, feeding paused around it (``paused``): a test
        that needs checkpoints during a job asks for them instead of counting on
        ``every_s``. Its number once complete; a request refused or a cut abandoned (the job
        between epochs) is asked again until ``timeout``. (Control's state in it says feeding
        was paused: a job resumed from it with ``--resume`` starts paused, as an operator's
        pause is kept; a job whose every process died and whose control went back to it keeps
        what its control last had, feeding resumed here.)"""
        endpoint = self.job.cluster.endpoint("control_req")
        deadline = time.monotonic() + timeout

        def ended() -> dict[int, str]:
            return {e["number"]: e["status"] for e in self.events()
                    if e["event"] == "checkpoint" and e.get("status") in ("complete", "aborted")}

        with self.paused():
            while time.monotonic() < deadline:
                before = ended()
                if not request(endpoint, "checkpoint", timeout_s=20,
                               cluster=self.job.cluster).ok:
                    time.sleep(0.1)   # not now (between epochs; another cut under way)
                    continue
                while time.monotonic() < deadline:
                    new = {n: s for n, s in ended().items() if n not in before}
                    if "complete" in new.values():
                        return max(n for n, s in new.items() if s == "complete")
                    if new:
                        break   # abandoned: ask again
                    if self.procs[self.watched].poll() is not None:
                        raise AssertionError("the job ended before its checkpoint:\n"
                                             + self.logs())
                    time.sleep(0.05)
        raise AssertionError(f"no checkpoint completed within {timeout} s:\n{self.logs()}")

    def kill_all(self) -> None:
        """SIGKILL every process of the cluster (their process groups), as a power cut would
        leave it (but for the disk); their logs are kept as ``<name>.killed-<n>.log``."""
        for proc in self.procs.values():
            self._signal(proc, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        for name in list(self.procs):
            path = self.workdir / f"{name}.log"
            n = len(list(self.workdir.glob(f"{name}.killed-*.log")))
            if path.exists():
                path.rename(self.workdir / f"{name}.killed-{n}.log")
        self.procs.clear()

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        said = "\n".join(f"--- {name}\n{self.log(name)[-3000:]}" for name in self.procs)
        if self.driver is not None and self.driver.errors:
            said += "\n--- the in-process driver\n" + "\n".join(self.driver.errors)
        return said

    def summary(self) -> Summary:
        """The run's summary, every key checked (``roles.job.summary.read_summary``)."""
        return read_summary(self.run_dir)

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()
            for child in _children() - self._children_before:
                _kill_if_a_roles(child)
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            return
        for proc in self.procs.values():
            self._signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            self._signal(proc, signal.SIGKILL)  # the group too: children of a spawner
            proc.wait()
        for stray in self.strays():
            stray.kill()
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        for cgroup in self.cgroups.values():
            cgroup.remove()
        self.cgroups.clear()

    def strays(self) -> list[psutil.Process]:
        """Live processes started for this cluster: those that carry its run directory, and
        the forks of its forked processes (whose environment shows the zygote's)."""
        found = {}
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("ZBUS_RUN_DIR") == self.env["ZBUS_RUN_DIR"]:
                    found[proc.pid] = proc
            except (psutil.Error, OSError):
                continue
        for forked in self.procs.values():
            if isinstance(forked, ForkedProcess) and forked.poll() is None:
                try:
                    found.update((p.pid, p) for p in psutil.Process(forked.pid).children(
                        recursive=True))
                except psutil.Error:
                    continue
        return list(found.values())

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


    def _signal(self, proc: subprocess.Popen | ForkedProcess | RoleHandle, sig: int) -> None:
        if isinstance(proc, RoleHandle):
            proc.send_signal(sig)
        else:
            _signal_group(proc, sig)


def _role_class(role: str):
    """The loop class of a role other than control."""
    if role == "feeder":
        from roles.feeder.process import Feeder
        return Feeder
    if role == "ps":
        from roles.ps import Shard
        return Shard
    if role == "worker":
        from roles.worker.process import Worker
        return Worker
    if role == "aggregator":
        from roles.aggregator import Aggregator
        return Aggregator
    if role == "member":
        from roles.member import GroupMember
        return GroupMember
    raise ValueError(f"no role {role!r}")


def _kill_if_a_roles(pid: int) -> None:
    """Kill a child of this process that a role of an in-process cluster started and left: a
    fork of this process (a shard's checkpoint writer) or a multiprocessing child (control's
    capacity trainer), not another child a test started meanwhile (a server)."""
    try:
        child = psutil.Process(pid)
        line = child.cmdline()
        if line == psutil.Process().cmdline() or any("multiprocessing" in a for a in line):
            child.kill()
    except psutil.Error:
        pass


def _children() -> set[int]:
    """This process's child processes now."""
    try:
        return {c.pid for c in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def _signal_group(proc: subprocess.Popen | ForkedProcess, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
