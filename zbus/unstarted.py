"""A node that could not start tells control why, then exits non-zero.

A role whose loop cannot be made (a port in use, no CUDA device, a network that cannot run: its
process's entry point says so in one line) would otherwise leave control waiting for it until
``start_timeout_s``, and a supervisor such as honcho would stop every process meanwhile, so that
the job ends ``interrupted`` without its reason. ``Unstarted`` is the node the entry point runs
instead: it says Hello with ``failed`` (the one line) until control answers, then ends with
``CANNOT_START``. Control fails the job with that line as its reason and answers Stop, or
refuses it (a node this job does not know, another job's): either way the node is done. It
gives up, as any node does, after ``orphan_timeout_s`` without a word from control.
"""

from __future__ import annotations

import dataclasses
import logging

from zbus.endpoints import BusConfig
from zbus.messages import Hello
from zbus.node import Node

log = logging.getLogger(__name__)
CANNOT_START = 2   # the exit status of a node that could not start, whatever control answered


class Unstarted(Node):
    def __init__(self, cluster: BusConfig, role: str, index: int, fingerprint: str,
                 reason: str):
        self.role = role   # before Node names it
        super().__init__(cluster, index, fingerprint)
        self.reason = reason

    def hello(self) -> Hello:
        return dataclasses.replace(super().hello(), failed=self.reason)

    def on_welcome(self) -> None:
        """Control admitted it nonetheless (it cannot: ``failed`` is never admitted): leave."""
        log.error("%s: admitted although it could not start; leaving", self.node_id)
        self.stopping = True

    def close(self) -> None:
        self.exit_code = CANNOT_START
        super().close()
