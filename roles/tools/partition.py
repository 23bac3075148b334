"""``zbus-partition``: print how the job's dense network would be split over K devices (the plan
control publishes for a model-parallel job), without running anything.

    zbus-partition --job jobs/adult_mp.toml --parts 2 [--json]
"""

from __future__ import annotations

import argparse
import sys

import orjson

from roles.job.cli import integer, load_job_or_exit
from roles.protocol.topology import MAX_PARTS


def render(summary: dict, critical_bytes: float, critical_path: bool) -> str:
    total = sum(summary["load"]) or 1.0
    lines = [f"{summary['parts']} parts: {summary['edges']} edges, {summary['critical_edges']} "
             f"critical (bytes > {critical_bytes:.0f}"
             f"{' or on the longest path' if critical_path else ''})",
             f"cut edges {summary['cut_edges']}, cut critical edges {summary['cut_critical']}, "
             f"{summary['bytes_per_step']:,} bytes per training step over the bus",
             f"balance (max / mean load) {summary['balance']:.3f}"
             f"{'' if summary['balanced'] else '  -- over the bound: a sub-task is too heavy'}",
             f"partitioned in {summary['seconds'] * 1000:.1f} ms", "",
             f"{'part':>4}  {'load (FLOPs)':>14}  {'share':>6}  sub-tasks"]
    for part, (load, nodes) in enumerate(zip(summary["load"], summary["nodes"], strict=True)):
        lines.append(f"{part:>4}  {load:>14,.0f}  {load / total:>6.1%}  "
                     f"{', '.join(nodes) or '(none)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbus-partition", description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job file (default: $ZBUS_JOB, else the built-in job)")
    parser.add_argument("--parts", type=integer, help="devices (default: [cluster] parts, at "
                                                  "least 2)")
    parser.add_argument("--json", action="store_true", help="the plan as JSON, with owners")
    args = parser.parse_args(argv)
    job = load_job_or_exit(args.job, "partition")
    parts = args.parts or max(2, job.cluster.parts)
    if not 1 <= parts <= MAX_PARTS:
        print(f"zbus partition: --parts must be 1..{MAX_PARTS}", file=sys.stderr)
        raise SystemExit(2)
    from roles.model.graph import plan_job  # torch

    plan = plan_job(job, parts)
    if args.json:
        sys.stdout.write(orjson.dumps({**plan.summary(), "owner": plan.owner},
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(plan.summary(), job.partition.critical_bytes,
                     job.partition.critical_path))


if __name__ == "__main__":
    main()
