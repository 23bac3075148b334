"""``zbus-pod ROLE [ARGS...]``: a role as a Kubernetes pod's container runs it (the image's
entrypoint; ``deploy/``).

- The index is the trailing ``-<n>`` of ``ZBUS_POD_NAME`` (a StatefulSet pod's name,
  ``zbus-ps-3``: shard 3); control takes none.
- ``ZBUS_HEALTH_FILE`` defaults to ``/tmp/zbus-health.json`` (``zbus-probe live|ready`` reads
  it), and ``ZBUS_SUPERVISED`` to 1 (the StatefulSets start every role).
- The role runs as a child process (``python -m roles.<role> --index N ARGS...``); SIGTERM and
  SIGINT are passed on to it.
- Control starts on the run in ``ZBUS_RUN_DIR`` with ``--resume`` when that directory holds
  control's state (its container restarted in the same pod: the emptyDir survived), else
  fresh (``control_args``).
- The role exits 0 (the job is over): the health file says ``ended`` and the pod idles until
  SIGTERM, then exits 0, so that the StatefulSet does not start a finished job again. The
  role exits non-zero: so does the pod, with its status, and Kubernetes starts the container
  again, which is a restart of the role in zbus's recovery
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

from zbus import health

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
      container restarted in the same pod, whose emptyDir survived;
    - else, with ``[checkpoint] dir`` set (a bucket that outlives every pod), the run its
      newest complete checkpoint belongs to (``--resume``: control takes its records from
      there, and the whole job goes back to it), unless the summary there says that run
      ended for good (``JobEnded``: the pod idles);
    - else a new run there (or under runs/ without ``ZBUS_RUN_DIR``)."""
    # imported here: the idle pod need not hold them
    from roles.checkpoint.files import SUMMARY, latest_complete
    from roles.control.state import STATE_FILE
    from roles.job.settings import load_job
    from roles.storage.store import Store

    run_dir = env.get("ZBUS_RUN_DIR", "")
    if run_dir and (Path(run_dir) / STATE_FILE).is_file():
        return ["--resume", run_dir]
    where = load_job(None, environ=env).checkpoint.dir
    if not run_dir or not where:
        return []
    store = Store(where)
    if store.size(SUMMARY) is not None:
        summary = json.loads(store.read_bytes(SUMMARY))
        if summary.get("resume_from") is None:
            raise JobEnded(f"the run of {where} has ended ({summary.get('status')}"
                           f"{': ' + summary['reason'] if summary.get('reason') else ''}); "
                           "give a new job a [checkpoint] dir of its own")
    if latest_complete(store) is not None:
        return ["--resume", run_dir]
    return []


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
        if code != 0:
            say(f"{self.node} exited with status {code}")
            return code
        if self.signalled:   # stopped on purpose (the pod is going away)
            self.health.write("ended")
            return 0
        return self.idle()

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
    try:
        command = role_argv(args.role, env, args.args)
        node = "control-0" if args.role == "control" else \
            f"{args.role}-{pod_index(env.get('ZBUS_POD_NAME', ''))}"
    except PodError as exc:
        say(str(exc))
        raise SystemExit(2) from None
    except JobEnded as exc:   # nothing to run: as a pod whose role has ended
        say(str(exc))
        raise SystemExit(Pod("control-0", [], env).idle()) from None
    except Exception as exc:  # the job file, the store: said in one line, then restarted
        say(f"cannot start control: {exc}")
        raise SystemExit(2) from None
    raise SystemExit(Pod(node, command, env).run())


if __name__ == "__main__":
    main()
