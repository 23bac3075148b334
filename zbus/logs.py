"""Logging set-up for role processes: one line per record on stderr, tagged with the node id
(honcho adds the time and the process name)."""

from __future__ import annotations

import logging
import os


def setup_logging(node_id: str) -> None:
    level = os.environ.get("ZBUS_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format=f"%(levelname)s [{node_id}] %(name)s: %(message)s",
        force=True,
    )
