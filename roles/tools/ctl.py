"""``zbus-ctl``: talk to a running job's control from a shell (the console does the same).

    zbus-ctl settings                       the live settings, their values and ranges
    zbus-ctl set net_util_max=0.5 ...       change live settings (all or none are applied)
    zbus-ctl export                         export the model now (runs/<run>/export-<n>/)
    zbus-ctl backup                         back the dense weights up now
    zbus-ctl checkpoint                     take a whole-job checkpoint now
    zbus-ctl aggregate                      call an aggregation round now (sync every, lazy)
    zbus-ctl pause | resume                 stop or restart feeding new batches
    zbus-ctl stop                           end the job (status "stopped", exit 0)

Control's request endpoint comes from the job's cluster section (``--job``, ``ZBUS_JOB``,
``ZBUS_CLUSTER__*``) or ``--endpoint``. Exit status: 0 done, 1 refused, 2 no answer or usage.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import orjson
import zmq

from roles.algorithms import live
from roles.job.cli import load_job_or_exit
from roles.protocol.operator import ACTIONS, ControlReply, ControlRequest
from roles.protocol.topology import ClusterConfig
from zbus import security, sockets
from zbus.codec import ProtocolError


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
        if not sep or not name:
            raise SystemExit(f"zbus ctl: {pair!r} is not name=value")
        changes[name.strip()] = value.strip()
    return changes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-ctl", description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--endpoint", help="control's request endpoint (default: from the job)")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("changes", nargs="*", help="name=value (with set)")
    args = parser.parse_args(argv)
    cluster = load_job_or_exit(args.job, "ctl").cluster
    endpoint = args.endpoint or cluster.endpoint("control_req")
    changes = parse_changes(args.changes) if args.action == "set" else {}
    try:
        reply = request(endpoint, args.action, changes, args.timeout, cluster)
    except (TimeoutError, ProtocolError, zmq.ZMQError, OSError) as exc:
        print(f"zbus ctl: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(("ok: " if reply.ok else "refused: ") + reply.message)
    if args.action == "settings":
        ranges = live.describe()
        for name, value in reply.settings.items():
            r = ranges.get(name, {})
            print(f"  {name} = {value}   [{r.get('min')}, {r.get('max')}]")
    else:
        print(orjson.dumps(reply.settings).decode())
    raise SystemExit(0 if reply.ok else 1)


if __name__ == "__main__":
    main()
