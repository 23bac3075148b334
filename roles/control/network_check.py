"""Control's check of the job's network at the job's start, before any node waits on it.

A network that cannot be loaded, built or run on a sample batch of the job's own fields
(``roles.model.network.build_network``: the contract of docs/models.md) fails the job at once,
for good, with its one ``NetworkError`` line as the reason: the file named, what is wrong.
Without the check a worker or the aggregator met it first, in its own start.

It checks what the job's author wrote: a network of their own (``[model] module``), or a
built-in given ``[model.options]``. A built-in with its defaults is zbus's own (its tests build
every one); what the job's fields make of it still fails a node's start, in one line, if it
cannot run (``roles.job.starting``).

Control itself stays without torch (a third of its memory): the check runs in a child process
(``python -m roles.control.network_check``, given the effective job on stdin), unless this
process has torch loaded already (a job run in one process, for tests). With model parallelism
the plan (``roles.control.model_plan``) builds and traces the network instead.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

from roles.job.settings import Job, job_to_toml, parse_job

log = logging.getLogger(__name__)
CHECKED_NETWORK = 1   # the child's status for a network refused: its line on stdout


def network_refusal(job: Job) -> str:
    """Why the job's network cannot train ("" when it can, or is not checked here)."""
    if job.cluster.parts > 1 or not (job.model.module or job.model.options):
        return ""   # the model plan builds it; a built-in as it comes
    began = time.monotonic()
    refusal = refusal_here(job) if "torch" in sys.modules else in_a_child(job)
    log.info("%s %s on a sample batch in %.1f s", label(job),
             "refused" if refusal else "built and run", time.monotonic() - began)
    return refusal


def in_a_child(job: Job) -> str:
    timeout = job.cluster.start_timeout_s
    try:
        done = subprocess.run([sys.executable, "-m", "roles.control.network_check", job.origin],
                              input=job_to_toml(job), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return (f"{label(job)}: not built and run on a sample batch within start_timeout_s = "
                f"{timeout:g} s")
    except OSError as exc:
        log.warning("the network was not checked at the start (%s): the nodes check it", exc)
        return ""
    if done.returncode == 0:
        return ""
    said = done.stdout.strip().splitlines()
    if done.returncode == CHECKED_NETWORK and said:
        return said[-1]
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"{label(job)}: checking it failed (status {done.returncode}): {last}"


def label(job: Job) -> str:
    return f"[model] module {job.model.module}" if job.model.module \
        else f"[model] network {job.model.network}"


def refusal_here(job: Job) -> str:
    from roles.model.network import build_network
    from roles.model.networks import NetworkError
    try:
        build_network(job)
    except NetworkError as exc:
        return str(exc)
    return ""


def main() -> None:
    """The child: the effective job on stdin (as TOML), where it was read from as the only
    argument; its network's refusal on stdout with status ``CHECKED_NETWORK``, or status 0."""
    origin = sys.argv[1] if len(sys.argv) > 1 else "<job>"
    job = parse_job(sys.stdin.read(), origin, None, environ={})
    refusal = refusal_here(job)
    if refusal:
        print(refusal)
    sys.stdout.flush()
    raise SystemExit(CHECKED_NETWORK if refusal else 0)


if __name__ == "__main__":
    main()
