"""``zbus-ctl``: talk to a running job's control from a shell (the console does the same).

Control's request endpoint comes from the job's cluster section (``--job``, ``ZBUS_JOB``,
``ZBUS_CLUSTER__*``) or ``--endpoint``. Each command prints control's answer in one line
(``ok: ...`` or ``refused: ...``); ``settings`` also lists every live setting; ``--json``
prints the whole answer as one JSON object instead. Exit status: 0 done, 1 refused, 2 no
answer or usage. ``wait`` follows control's status instead (``roles.tools.wait``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import orjson
import zmq

from roles.algorithms.shared import live
from roles.job.cli import load_job_or_exit
from roles.protocol.operator import ControlReply, ControlRequest
from roles.protocol.topology import ClusterConfig
from roles.tools.output import quiet_broken_pipe
from roles.tools.wait import wait
from zbus import security, sockets
from zbus.codec import ProtocolError

# the actions (roles.protocol.operator.ACTIONS), what each does, for --help
COMMANDS = {
    "settings": "list the live settings: each one's value and range",
    "set": "change live settings: zbus-ctl set net_util_max=0.5 min_local_rounds=2 (control "
           "applies all of them or none, and says why not)",
    "export": "export the model now (into runs/<run>/export-<n>/)",
    "backup": "back the dense weights up now",
    "checkpoint": "take a whole-job checkpoint now (into runs/<run>/checkpoints/; zbus-control "
                  "--resume goes back to the newest complete one if every process dies)",
    "aggregate": "call an aggregation round now (sync modes every and lazy, while training)",
    "pause": "stop feeding new batches (the batches out are trained; no stall timer runs)",
    "resume": "feed new batches again",
    "stop": "end the job: it is recorded as stopped, every process exits 0 (no export: "
            "zbus-ctl export first if you want one)",
    "wait": "wait until the job has ended: exit 0 when it completed, 1 when it ended "
            "otherwise, 2 when it cannot tell (control's status, else the summary in the "
            "checkpoint store)",
}


def request(endpoint: str, action: str, changes: dict | None = None,
            timeout_s: float = 5.0, cluster: ClusterConfig | None = None) -> ControlReply:
    """One request to control; TimeoutError when no answer comes. With ``cluster``, its CURVE
    keys (the operator's key pair) when the job uses them."""
    ctx = zmq.Context()
    try:
        curve = None if cluster is None else security.for_process(
            ctx, cluster, security.OPERATOR, authenticate=False)
        secure = None if curve is None else functools.partial(curve.client, address=endpoint)
        sock = sockets.connect(ctx, zmq.DEALER, endpoint, identity=f"ctl-{os.getpid()}",
                               secure=secure)
        traffic = sockets.Traffic()
        sockets.send(sock, ControlRequest(action=action, changes=changes or {}),
                     sender=f"ctl-{os.getpid()}", seq=1, traffic=traffic)
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer from control at {endpoint} within {timeout_s} s")
        _, env = sockets.recv(sock, router=False, traffic=traffic)
        if not isinstance(env.msg, ControlReply):
            raise ProtocolError("unexpected_type", type(env.msg).__name__)
        return env.msg
    finally:
        ctx.destroy(linger=0)


def parse_changes(pairs: list[str]) -> dict:
    changes = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            print(f"zbus ctl: {pair!r} is not name=value", file=sys.stderr)
            raise SystemExit(2)
        changes[name.strip()] = value.strip()
    return changes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zbus-ctl", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="Exit status: 0 done, 1 refused by control, 2 no answer or usage. The console "
               "(zbus-console) does the same from a terminal UI.")
    p.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    p.add_argument("--endpoint", help="control's request endpoint (default: the job's "
                                      "[cluster] control_req)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S",
                   help="seconds to wait for control's answer (default 5)")
    p.add_argument("--json", action="store_true",
                   help="print control's whole answer (ok, message, settings) as JSON")
    commands = p.add_subparsers(dest="action", required=True, metavar="COMMAND",
                                title="commands")
    for name, text in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        if name == "set":
            sub.add_argument("changes", nargs="+", metavar="NAME=VALUE",
                             help=f"live settings: {', '.join(live.describe())}")
        if name == "wait":
            sub.add_argument("--supervised", action="store_true",
                             help="a supervisor starts control again after a resumable end "
                                  "(Kubernetes): wait through it")
            sub.add_argument("--timeout", dest="wait_timeout", type=float, metavar="S",
                             help="give up (exit 2) after S seconds without control's status "
                                  "(default: never)")
    return p


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    job = load_job_or_exit(args.job, "ctl")
    if args.action == "wait":
        raise SystemExit(wait(job, args.supervised, args.wait_timeout))
    cluster = job.cluster
    endpoint = args.endpoint or cluster.endpoint("control_req")
    changes = parse_changes(args.changes) if args.action == "set" else {}
    try:
        reply = request(endpoint, args.action, changes, args.timeout, cluster)
    except (TimeoutError, ProtocolError, zmq.ZMQError, OSError) as exc:
        print(f"zbus ctl: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.json:
        print(orjson.dumps({"ok": reply.ok, "message": reply.message,
                            "settings": reply.settings}).decode())
    else:
        print(("ok: " if reply.ok else "refused: ") + reply.message)
        if args.action == "settings":
            ranges = live.describe()
            for name, value in reply.settings.items():
                r = ranges.get(name, {})
                kind = "integer" if r.get("type") == "int" else "number"
                print(f"  {name} = {value}   ({kind} in [{r.get('min')}, {r.get('max')}])")
    sys.stdout.flush()  # a reader gone away is seen here, inside the guard
    raise SystemExit(0 if reply.ok else 1)


if __name__ == "__main__":
    main()
