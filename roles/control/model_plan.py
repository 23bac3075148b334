"""Control's plan of the dense network over the members of every model-parallel group
(``[cluster] parts`` > 1): the traced network partitioned (``roles.model.graph``), written to
the run directory, and published as a standing ModelPlan. A network that cannot be built or
traced (torch.fx) is a ``PlanError``, its one line the job's failure reason."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.model_parallel import ModelPlan
from zbus.files import atomic_write

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """The job's network cannot be planned: one line (the network's ``NetworkError``)."""


def plan_model(job: Job, run_dir: Path, metrics: MetricsLog) -> tuple[dict, ModelPlan]:
    """The plan's figures (for the status and the summary) and its message."""
    from roles.model.graph import plan_job  # torch: only for model-parallel jobs
    from roles.model.networks import NetworkError

    try:
        plan = plan_job(job)
    except NetworkError as exc:
        log.error("no model plan: %s", exc)
        raise PlanError(str(exc)) from exc
    summary = plan.summary()
    (run_dir / "partition").mkdir(exist_ok=True)
    atomic_write(run_dir / "partition" / "plan.json",
                 orjson.dumps({**summary, "owner": plan.owner}, option=orjson.OPT_INDENT_2))
    metrics.write("model_plan", **{k: v for k, v in summary.items() if k != "nodes"})
    log.info("model plan: %d parts, loads %s (balance %.2f%s), %d cut edges of which %d "
             "critical, %d bytes per step", plan.parts, plan.load, plan.balance,
             "" if plan.balanced else f" > bound {job.partition.balance}",
             plan.cut_edges, plan.cut_critical, plan.bytes_per_step)
    return summary, ModelPlan(parts=plan.parts, owner=plan.owner, summary=summary)
