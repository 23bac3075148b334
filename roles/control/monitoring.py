"""Control's outlets to the monitoring stack operators already run (``[monitoring]``):

- ``prometheus_port``: the cluster's figures at ``http://<prometheus_host>:<port>/metrics``
  (``roles.control.prometheus``), from each status snapshot control publishes;
- ``tensorboard = true``: TensorBoard event files in ``runs/<run>/tensorboard/``: the training
  loss and samples per second (step: samples trained), each epoch's eval AUC and log loss
  (step: the epoch, from 1), and sync mode lazy's aggregation decisions (cumulative counts,
  step: the round). Written with PyTorch's ``SummaryWriter``, which needs the ``tensorboard``
  package (``pip install 'zbus[tensorboard]'``): a job that does not ask for events does not
  need it.

Both read only the status snapshot (``roles.protocol.status``) and the summary: what
consoles see is what the monitoring stack sees."""

from __future__ import annotations

import logging
from pathlib import Path

from roles.job.rundir import shown
from roles.job.settings import Job
from roles.job.summary import Summary
from roles.protocol.status import Final, StatusSnapshot

log = logging.getLogger(__name__)


class MonitoringError(OSError):
    """A monitoring outlet cannot start (the port is taken, a package is missing)."""


def final_figures(summary: Summary, path: Path) -> Final:
    """How the job ended, for the status's ``final``."""
    return {"status": summary["status"], "reason": summary["reason"],
            "auc": summary["auc"], "logloss": summary["logloss"],
            "summary": shown(path), "wall_s": summary["wall_s"],
            "samples_per_s": summary["samples_per_s"], "resume_from": summary["resume_from"]}


class PrometheusEndpoint:
    def __init__(self, host: str, port: int):
        from prometheus_client import CollectorRegistry, start_http_server

        from roles.control.prometheus import StatusCollector

        self.collector = StatusCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise MonitoringError(f"cannot serve Prometheus metrics on {host}:{port} "
                                  f"({exc.strerror or exc}): change [monitoring] "
                                  "prometheus_port") from None
        log.info("Prometheus metrics at http://%s:%d/metrics", host, port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TensorBoardEvents:
    def __init__(self, directory: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MonitoringError(
                "[monitoring] tensorboard = true needs the tensorboard package: "
                "pip install 'zbus[tensorboard]' (or pip install tensorboard)") from None
        self.writer = SummaryWriter(str(directory))
        self.directory = directory
        self.last_t: float | None = None
        self.epochs: set[int] = set()
        self.decisions: dict[str, int] = {}
        log.info("TensorBoard events in %s", directory)

    def show(self, snap: StatusSnapshot) -> None:
        t = snap["training"]
        history = t.get("history", {})
        times = history.get("t", [])
        if times and times[-1] != self.last_t:
            self.last_t = times[-1]
            step = int(t.get("samples_acked") or 0)
            loss = history.get("loss", [None])[-1]
            if loss is not None:
                self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/samples_per_s", history["samples_per_s"][-1], step)
        for e in t["epochs"]:
            epoch = e["epoch"]
            if e["auc"] is None or epoch in self.epochs:
                continue
            self.epochs.add(epoch)
            self.writer.add_scalar("eval/auc", e["auc"], epoch + 1)
            self.writer.add_scalar("eval/logloss", e["logloss"], epoch + 1)
            if e["train_loss"] is not None:
                self.writer.add_scalar("train/epoch_loss", e["train_loss"], epoch + 1)
        decisions = snap.get("cluster", {}).get("decisions", {})
        if decisions and decisions != self.decisions and any(decisions.values()):
            self.decisions = dict(decisions)
            for verdict, count in decisions.items():
                self.writer.add_scalar(f"decisions/{verdict}", count, int(snap.get("round", 0)))

    def close(self) -> None:
        self.writer.close()


class Monitoring:
    def __init__(self, job: Job, run_dir: Path):
        m = job.monitoring
        self.prometheus = PrometheusEndpoint(m.prometheus_host, m.prometheus_port) \
            if m.prometheus_port else None
        self.tensorboard = TensorBoardEvents(run_dir / "tensorboard") if m.tensorboard \
            else None

    def show(self, snapshot: StatusSnapshot) -> None:
        """A status control published."""
        if self.prometheus is not None:
            self.prometheus.collector.latest = snapshot
        if self.tensorboard is not None:
            self.tensorboard.show(snapshot)

    def close(self) -> None:
        """The job has ended: the event files are closed; the metrics endpoint serves the
        final figures until control exits."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def stop(self) -> None:
        self.close()
        if self.prometheus is not None:
            self.prometheus.close()
            self.prometheus = None
