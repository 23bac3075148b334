"""``zbus-keys``: make the CURVE key pairs of a job's nodes and its allow-list.

    zbus-keys --job job.toml                 a key pair for every node of the job, and console
    zbus-keys --job job.toml --node worker-7 one more (a worker that will join later)
    zbus-keys --job job.toml --workers 16    also workers 0–15 (a worker StatefulSet scaled to 16)

Into ``[cluster] keys_dir`` (or ``--dir``): ``<node>.key`` (public), ``<node>.key_secret``
(public and secret, mode 0600) and ``allowed/<node>.key``, the public keys a node accepts. An
existing pair is kept (``--force`` makes a new one). Copy to each host the secret key of the
nodes it runs, every public key and ``allowed/``. A node's authenticator reads ``allowed/``
when it starts: make the key of a node that will join later before starting the job.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from pathlib import Path

import zmq.auth

from roles.job.cli import MAX_WORKERS, load_job_or_exit
from zbus.security import ALLOWED, OPERATOR


def make_keys(keys_dir: Path, names: list[str], force: bool = False) -> list[str]:
    """Key pairs for ``names`` (those missing, or all with ``force``); returns those made."""
    allowed = keys_dir / ALLOWED
    allowed.mkdir(parents=True, exist_ok=True)
    made = []
    for name in names:
        secret = keys_dir / f"{name}.key_secret"
        if force or not secret.exists():
            zmq.auth.create_certificates(str(keys_dir), name)
            os.chmod(secret, 0o600)
            made.append(name)
        shutil.copyfile(keys_dir / f"{name}.key", allowed / f"{name}.key")
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-keys", description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--dir", help="keys directory (default: the job's [cluster] keys_dir)")
    parser.add_argument("--node", action="append", default=[],
                        help="only this node (repeatable), e.g. worker-7")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="also the nodes of N workers (worker-0 … worker-N-1, and their "
                             "members with [cluster] parts > 1): the most that will ever run")
    parser.add_argument("--force", action="store_true", help="replace existing key pairs")
    args = parser.parse_args(argv)
    if not 0 <= args.workers <= MAX_WORKERS:
        parser.error(f"--workers must be between 0 and {MAX_WORKERS}")
    cluster = load_job_or_exit(args.job, "keys").cluster
    keys_dir = Path(args.dir or cluster.keys_dir)
    names = args.node or [*cluster.expected_nodes(), "control-0", OPERATOR]
    if args.workers:  # the workers (and members) the job would expect with that many workers
        names += [n for n in dataclasses.replace(cluster, workers=args.workers).expected_nodes()
                  if n.startswith(("worker-", "member-"))]
    names = list(dict.fromkeys(names))
    made = make_keys(keys_dir, names, args.force)
    print(f"zbus keys: {len(made)} key pair(s) made, {len(names)} allowed, in {keys_dir}")


if __name__ == "__main__":
    main()
