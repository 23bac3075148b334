"""Load figures a node reports in its heartbeats, from psutil."""

from __future__ import annotations

from typing import Any

import psutil


class LoadSampler:
    """CPU percent of this process since the last sample, resident memory, cumulative network
    bytes per interface of the host (control turns them into rates) and each interface's speed
    in Mbit/s as psutil reports it (0 where unknown: loopback, most virtual NICs)."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call only primes the counter
        try:
            self._speeds = {n: s.speed for n, s in psutil.net_if_stats().items()}
        except OSError:
            self._speeds = {}

    def sample(self) -> dict[str, Any]:
        try:
            nics = psutil.net_io_counters(pernic=True)
        except OSError:  # some containers hide /proc/net/dev
            nics = {}
        return {
            "cpu": self._proc.cpu_percent(None),
            "rss": self._proc.memory_info().rss,
            "net": {name: [c.bytes_sent, c.bytes_recv] for name, c in nics.items()},
            "speed": self._speeds,
        }
