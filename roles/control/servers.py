"""Control's part in serving: the serving processes that follow the job (``Servers``: their
last ``ServerReport``, for the status and the console), and the answer to a serving process on
another host that asks for the job it is to follow (``follow_job``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from roles.job.settings import Job
from roles.protocol.serving import FollowJob, ServerReport
from roles.protocol.status import ServerRow

FORGET_S = 300.0   # a server not heard from this long is no more listed (gone after
                   # SERVER_GONE_S: its row says so)
MAX_SERVERS = 256  # the most listed (the oldest reports make room)


def follow_job(job: Job, run_id: str, run_dir: Path) -> FollowJob:
    """What a serving process that follows the job needs: the run's effective job file and
    where its checkpoints are."""
    config = run_dir / "config.toml"
    return FollowJob(run_id=run_id, job_text=config.read_text(),
                     checkpoints=job.checkpoint.dir or str(run_dir / "checkpoints"))


@dataclass
class _Heard:
    report: ServerReport
    at: float


class Servers:
    def __init__(self) -> None:
        self.heard: dict[str, _Heard] = {}
        self.strangers: set[str] = set()   # servers heard from that follow another run

    def stranger(self, server: str) -> bool:
        """A server that follows another run was heard from: whether for the first time."""
        if server in self.strangers or len(self.strangers) >= MAX_SERVERS:
            return False
        self.strangers.add(server)
        return True

    def report(self, r: ServerReport, now: float) -> None:
        self.heard.pop(r.server, None)
        self.heard[r.server] = _Heard(r, now)   # (the newest last)
        while len(self.heard) > MAX_SERVERS:
            self.heard.pop(next(iter(self.heard)))

    def rows(self, now: float) -> list[ServerRow]:
        """Every server heard from in the last ``FORGET_S``, by name."""
        for name in [n for n, h in self.heard.items() if now - h.at > FORGET_S]:
            del self.heard[name]
        return [row(h.report, now - h.at) for _, h in sorted(self.heard.items())]


def row(r: ServerReport, age_s: float) -> ServerRow:
    return {"server": r.server, "url": r.url, "version": r.version, "ready": r.ready,
            "version_lag_s": None if r.version_lag_s < 0 else round(r.version_lag_s, 3),
            "requests_per_s": round(r.requests_per_s, 1), "rows_per_s": round(r.rows_per_s, 1),
            "p50_ms": None if r.p50_ms < 0 else round(r.p50_ms, 3),
            "p99_ms": None if r.p99_ms < 0 else round(r.p99_ms, 3),
            "age_s": round(age_s, 1)}
