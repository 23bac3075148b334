"""``zbus-pod ROLE [ARGS...]``: a role as a Kubernetes pod's container runs it (the image's
entrypoint; ``deploy/``).

- The index is the trailing ``-<n>`` of ``ZBUS_POD_NAME`` (a StatefulSet pod's name,
  ``zbus-ps-3``: shard 3); control takes none.
- ``ZBUS_HEALTH_FILE`` defaults to ``/tmp/zbus-health.json`` (``zbus-probe live|ready`` reads
  it), and ``ZBUS_SUPERVISED`` to 1 (the StatefulSets start every role).
- The role runs as a child process (``python -m roles.<role> --index N ARGS...``) with
  ``ZBUS_SIGTERM=restart`` (``zbus.signals``): SIGTERM and SIGINT are passed on to it, and a
  SIGTERM, which here comes from Kubernetes (an eviction, a drain, a rolling update, a pod
  deleted), is the role's restart, not the job's end: control hands its records over to the
  next control, and the nodes go on.
- Control starts on the run in ``ZBUS_RUN_DIR`` with ``--resume`` when that directory holds
  control's state (its container restarted in the same pod: the emptyDir survived), or when
  the ``[checkpoint] dir`` store holds what the next control goes on from (``control_args``),
  else fresh.
- The job has ended for good (completed, stopped, or failed in a way a resume would meet
  again): the role's health file says ``ended``, whatever its exit status, and the pod idles
  until SIGTERM, then exits 0, so that the StatefulSet does not start a finished job again.
  A container of the pod started again later (the kubelet restarts it whatever made it exit)
  finds the health file saying so, or control's ended run, or the run's summary in the
  ``[checkpoint] dir`` store (a pod made again with an empty disk), and idles at once
  (``job_over``). Otherwise, when the role exits, so does the pod, with its status, and
  Kubernetes starts the container again, which is a restart of the role in zbus's recovery
  (docs/architecture.md, "Recovery").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zbus import health, signals

ROLES = {"control": "roles.control", "feeder": "roles.feeder", "ps": "roles.ps",
         "worker": "roles.worker", "aggregator": "roles.aggregator", "member": "roles.member"}
IDLE_BEAT_S = 10.0   # an ended pod rewrites its health this often (zbus-probe live: 60 s)


class PodError(Exception):
    """The pod cannot start its role (said in one line)."""


def pod_index(name: str) -> int:
    """The index in a StatefulSet pod's name: ``zbus-ps-3`` -> 3."""
    found = re.fullmatch(r".+-(\d+)", name)
    if found is None:
        raise PodError(f"ZBUS_POD_NAME must end in -<index> (a StatefulSet pod's name, such as "
                       f"zbus-ps-3), got {name!r}" if name else
                       "ZBUS_POD_NAME is not set: it names the pod (zbus-ps-3 runs shard 3)")
    return int(found.group(1))


class JobEnded(Exception):
    """The run this pod's control would start has ended (its summary says why)."""


def control_args(env: Mapping[str, str]) -> list[str]:
    """Where control starts from (the one place this is decided):

    - the run in ``ZBUS_RUN_DIR`` (``--resume``) when that holds control's state: its
      container restarted in the same pod, whose emptyDir survived; unless that run has
      ended for good (``JobEnded``: the pod idles);
    - else, with ``[checkpoint] dir`` set (a bucket that outlives every pod), unless the
      summary there says that run ended for good (``JobEnded``), the run whose records the
      control before was handing over when its pod was stopped (``--resume``: the nodes go on
      with it, ``roles.control.handover``), or the run its newest complete checkpoint belongs
      to (``--resume``: control takes its records from there, and the whole job goes back
      to it);
    - else a new run there (or under runs/ without ``ZBUS_RUN_DIR``)."""
    # imported here: the idle pod need not hold them
    from roles.checkpoint.files import latest_complete
    from roles.control.handover import handed_over
    from roles.control.state import STATE_FILE, ended_for_good
    from roles.job.settings import load_job
    from roles.storage.store import Store

    run_dir = env.get("ZBUS_RUN_DIR", "")
    if run_dir and (Path(run_dir) / STATE_FILE).is_file():
        how = ended_for_good(Path(run_dir))
        if how is not None:
            raise JobEnded(f"the run in {run_dir} has ended ({how})")
        return ["--resume", run_dir]
    where = load_job(None, environ=env).checkpoint.dir
    if not run_dir or not where:
        return []
    store = Store(where)
    how = ended_in_store(store)
    if how is not None:
        raise JobEnded(f"the run of {where} has ended ({how}); give a new job a "
                       "[checkpoint] dir of its own")
    if handed_over(store) is not None or latest_complete(store) is not None:
        return ["--resume", run_dir]
    return []


def ended_in_store(store: Any) -> str | None:
    """How the run whose checkpoints ``store`` holds ended for good, from its summary there,
    or None (no summary, or one that says it can be resumed)."""
    from roles.checkpoint.files import SUMMARY

    if store.size(SUMMARY) is None:
        return None
    summary = json.loads(store.read_bytes(SUMMARY))
    if summary.get("resume_from") is not None:
        return None
    return f"{summary.get('status')}{': ' + summary['reason'] if summary.get('reason') else ''}"


def job_over(env: Mapping[str, str]) -> str | None:
    """Why this pod has nothing to run, or None: its health file says the job ended for good
    (written by an earlier container of this pod, whose emptyDir survived), or the run's
    summary in the ``[checkpoint] dir`` store does (a pod made again with an empty disk after
    the job's end: a node would otherwise wait for a control that idles). A job file or store
    that cannot be read: None (the role, or ``control_args``, says why)."""
    record = health.read(env.get(health.ENV, health.DEFAULT_PATH))
    if record is not None and record.get("state") == "ended":
        return "the job has ended (this pod's health file says so)"
    try:
        from roles.job.settings import load_job
        from roles.storage.store import Store

        where = load_job(None, environ=env).checkpoint.dir
        how = ended_in_store(Store(where)) if where else None
    except Exception:   # the role says what is wrong with the job or the store
        return None
    return f"the run of {where} has ended ({how})" if how is not None else None


def ended_by(record: dict[str, Any] | None, pid: int) -> bool:
    """The role's process ``pid`` said in its health file that the job has ended for good (a
    status of its own aside: a failed job's roles exit 1)."""
    return record is not None and record.get("state") == "ended" and record.get("pid") == pid


def role_argv(role: str, env: Mapping[str, str], extra: list[str] | None = None) -> list[str]:
    """The command that runs ``role`` in this pod."""
    if role not in ROLES:
        raise PodError(f"no role {role!r}; one of {', '.join(ROLES)}")
    argv = [sys.executable, "-m", ROLES[role]]
    if role == "control":
        argv += control_args(env)
    else:
        argv += ["--index", str(pod_index(env.get("ZBUS_POD_NAME", "")))]
    return argv + list(extra or [])


def pod_environ(env: Mapping[str, str]) -> dict[str, str]:
    """The role's environment: the pod's, with the defaults above."""
    out = dict(env)
    out.setdefault(health.ENV, health.DEFAULT_PATH)
    out.setdefault("ZBUS_SUPERVISED", "1")
    out.setdefault(signals.ENV, signals.RESTART)   # a SIGTERM here: the pod goes away
    return out


class Pod:
    def __init__(self, node: str, argv: list[str], env: dict[str, str]):
        self.node = node
        self.argv, self.env = argv, env
        self.health = health.HealthFile(env[health.ENV], self.node)
        self.child: subprocess.Popen[bytes] | None = None
        self.signalled = 0

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.child = subprocess.Popen(self.argv, env=self.env)
        self.health.write("starting", pid=self.child.pid)  # until the role's loop writes
        code = self.child.wait()
        if code < 0:
            code = 128 - code   # killed by a signal: as a shell reports it
        if ended_by(health.read(self.health.path), self.child.pid):
            return self.idle()   # (at once when a SIGTERM came meanwhile)
        say(f"{self.node} exited with status {code}" + (
            " (the pod is being stopped: a restart of the role)" if self.signalled else ""))
        return code

    def idle(self) -> int:
        """The job is over for this pod: say so, and wait for SIGTERM."""
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.health.write("ended")
        say(f"{self.node} ended; the pod idles until it is stopped (SIGTERM)")
        while not self.signalled:
            time.sleep(0.2)
            if time.monotonic() - self.health.written_at >= IDLE_BEAT_S:
                self.health.write("ended")
        return 0


def say(line: str) -> None:
    print(f"zbus-pod: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-pod", description=__doc__.splitlines()[0])
    parser.add_argument("role", help=f"one of {', '.join(ROLES)}")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="passed on to the role (e.g. --slowdown 2)")
    args = parser.parse_args(argv)
    env = pod_environ(os.environ)
    node = args.role
    try:
        node = "control-0" if args.role == "control" else \
            f"{args.role}-{pod_index(env.get('ZBUS_POD_NAME', ''))}"
        over = job_over(env) if args.role in ROLES else None
        if over is not None:
            raise JobEnded(over)
        command = role_argv(args.role, env, args.args)
    except PodError as exc:
        say(str(exc))
        raise SystemExit(2) from None
    except JobEnded as exc:   # nothing to run: as a pod whose role has ended
        say(str(exc))
        raise SystemExit(Pod(node, [], env).idle()) from None
    except Exception as exc:  # the job file, the store: said in one line, then restarted
        say(f"cannot start control: {exc}")
        raise SystemExit(2) from None
    raise SystemExit(Pod(node, command, env).run())


if __name__ == "__main__":
    main()
