"""A job's own network file (``[model] module = "file.py:factory"``) travels with the model:
an export and every checkpoint hold a copy (``MODULE_COPY``) and a job file that names it, so
that ``zbus-predict`` (and a resume on another host) needs nothing but the export.

A ``package.module:factory`` module is copied too when its file can be found without importing
it (``importlib.util.find_spec``); what that file imports must be importable where the copy is
used (docs/limits.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from roles.job.settings import Job

MODULE_COPY = "network.py"


def module_file(job: Job) -> tuple[Path, str] | None:
    """The file of the job's own network and its factory's name (None: a built-in, or a
    package module whose file cannot be found)."""
    spec = job.model.module
    if not spec:
        return None
    where, _, factory = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_absolute() and job.origin:
            path = Path(job.origin).parent / path
        return path, factory
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    return Path(found.origin), factory


def portable(job: Job) -> tuple[Job, dict[str, bytes]]:
    """The job as an export or a checkpoint records it, and the files to write beside it: with
    a module of its own, the module copied as ``MODULE_COPY`` and the job naming that copy
    (relative: ``roles.model`` finds it beside the job file it is read from)."""
    found = module_file(job)
    if found is None:
        return job, {}
    path, factory = found
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"[model] module {path}: {exc.strerror}") from None
    model = dataclasses.replace(job.model, module=f"{MODULE_COPY}:{factory}")
    return dataclasses.replace(job, model=model), {MODULE_COPY: source}
