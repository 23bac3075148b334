"""A job's own network file (``[model] module = "file.py:factory"``) travels with the model:
an export and every checkpoint hold a copy (``MODULE_COPY``) and a job file that names it, so
that ``zbus-predict`` (and a resume on another host) needs nothing but the export.

A ``package.module:factory`` module is copied too when its file can be found without importing
it (``importlib.util.find_spec``); what that file imports must be importable where the copy is
used (docs/limits.md).

The rules for the spec itself are here, once: which targets are files (``is_file_spec``), how
the job file makes a relative one absolute (``module_at``, when the job is read) and where one
still relative is looked for (``module_path``: a job read from an export or a checkpoint names
its copy beside it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # settings reads the rules below when it reads a job
    from roles.job.settings import Job

MODULE_COPY = "network.py"


def is_file_spec(target: str) -> bool:
    """``file.py`` or a path (rather than ``package.module``): the part before the ``:``."""
    return target.endswith(".py") or "/" in target or "\\" in target


def module_at(spec: str, base_dir: Path) -> str:
    """``[model] module`` with its file made absolute from ``base_dir`` (a
    ``package.module:factory`` stays as it is)."""
    target, sep, factory = spec.rpartition(":")
    if not sep or not is_file_spec(target):
        return spec
    return f"{os.path.normpath(base_dir / Path(target).expanduser())}:{factory}"


def module_path(job: Job) -> Path | None:
    """The file a file spec names, absolute: a relative one beside the job file it was read
    from, or in the working directory for a job read from no file (the built-in job, a text);
    None for a built-in or a package module."""
    target = job.model.module.rpartition(":")[0]
    if not job.model.module or not is_file_spec(target):
        return None
    path = Path(target).expanduser()
    if path.is_absolute():
        return path
    origin = Path(job.origin).expanduser() if job.origin else None
    base = origin.absolute().parent if origin is not None and origin.is_file() else Path.cwd()
    return base / path


def module_file(job: Job) -> tuple[Path, str] | None:
    """The file of the job's own network and its factory's name (None: a built-in, or a
    package module whose file cannot be found)."""
    spec = job.model.module
    if not spec:
        return None
    where, _, factory = spec.rpartition(":")
    path = module_path(job)
    if path is not None:
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
