"""Finding the job's network factory, and calling it.

``[model] module`` names a user's own network: ``path/to/file.py:factory`` (a path relative to
the job file's directory, ``job.origin``; to the working directory for a job read from no file)
or ``package.module:factory`` (imported from ``sys.path``). Without it, ``[model] network`` names
a built-in (``registry.BUILTINS``). Whatever goes wrong is one ``NetworkError`` line that names
the file and what is wrong: no such file, an import that fails (the exception, and its file and
line), no such factory, a factory that raises or returns no ``torch.nn.Module``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from roles.job.fields import FieldLayout
from roles.job.module_file import is_file_spec, module_path
from roles.job.settings import Job
from roles.model.networks.errors import NetworkError, describe, one_line
from roles.model.networks.registry import BUILTINS, Factory


def network_label(job: Job, source_file: Path | None) -> str:
    """How messages name the job's network: the built-in, or the user's file."""
    if not job.model.module:
        return f"[model] network {job.model.network}"
    if is_file_spec(job.model.module.rpartition(":")[0]) and source_file is not None:
        return f"[model] module {source_file}"
    where = f" ({source_file})" if source_file is not None else ""
    return f"[model] module {job.model.module}{where}"


def _import_file(spec: str, path: Path) -> ModuleType:
    if not path.exists():
        raise NetworkError(f"[model] module {spec!r}: no file {path}" if not spec.startswith(
            str(path)) else f"[model] module: no file {path}")
    if not path.is_file():
        raise NetworkError(f"[model] module {spec!r}: {path} is not a file")
    name = f"zbus_network_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    found = importlib.util.spec_from_file_location(name, path)
    if found is None or found.loader is None:
        raise NetworkError(f"[model] module {path}: not a Python file (name it *.py)")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module   # as an import would: dataclasses and pickle look it up
    try:
        found.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise NetworkError(f"[model] module {path}: cannot import it: "
                           f"{describe(exc, path)}") from exc
    return module


def _import_package(spec: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise NetworkError(f"[model] module {spec!r}: no module named {exc.name!r} on "
                               "sys.path (a file is named by its path: dir/file.py:factory)"
                               ) from exc
        raise NetworkError(f"[model] module {spec!r}: cannot import it: "
                           f"{describe(exc, None)}") from exc
    except Exception as exc:
        raise NetworkError(f"[model] module {spec!r}: cannot import it: "
                           f"{describe(exc, None)}") from exc


def load_factory(job: Job) -> tuple[Factory, Path | None]:
    """The job's network factory and the file it is defined in (None for a built-in)."""
    spec = job.model.module
    if not spec:
        return BUILTINS[job.model.network], None
    target, _, name = spec.rpartition(":")
    source: Path | None
    path = module_path(job)
    if path is not None:
        source = path.resolve()
        module = _import_file(spec, source)
    else:
        module = _import_package(spec, target)
        source = Path(module.__file__).resolve() if module.__file__ else None
    label = network_label(job, source)
    factory = getattr(module, name, None)
    if factory is None:
        public = sorted(n for n, v in vars(module).items()
                        if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        defined = f" (it defines {', '.join(public)})" if public else ""
        raise NetworkError(f"{label}: no factory {name!r} in it{defined}")
    if not callable(factory):
        raise NetworkError(f"{label}: {name!r} is a {type(factory).__name__}, not a function "
                           "(factory(sparse_dims, sequence_fields, dense_count, options))")
    return factory, source


def call_factory(factory: Factory, layout: FieldLayout, dense_count: int,
                 options: dict[str, Any], label: str, source_file: Path | None,
                 builtin: bool = False) -> nn.Module:
    """``factory(sparse_dims, sequence_fields, dense_count, options)``, given copies (what it
    changes is its own). A built-in's ValueError (the job's mistake: a bad option, widths
    that differ) keeps its own words, which name the network."""
    name = getattr(factory, "__name__", "factory")
    try:
        net = factory(layout.sparse_dims(), list(layout.sequence_fields), dense_count,
                      copy.deepcopy(options))
    except Exception as exc:
        if builtin and isinstance(exc, ValueError):
            raise NetworkError(one_line(str(exc))) from exc
        raise NetworkError(f"{label}: {name}(...) raised {describe(exc, source_file)}") \
            from exc
    if not isinstance(net, nn.Module):
        raise NetworkError(f"{label}: {name}(...) returned {type(net).__name__}, not a "
                           "torch.nn.Module")
    return net


def device_error(job: Job, exc: BaseException, device: Any) -> NetworkError:
    """The one line for a network that ran on the CPU (its check at build) but raises on the
    worker's ``device``: most often a tensor its forward makes on the CPU
    (``torch.arange(n)``) beside inputs on CUDA."""
    path = module_path(job)
    source = path.resolve() if path is not None else None
    hint = ""
    if "device" in str(exc):
        hint = ("; make the tensors forward creates on its inputs' device (e.g. "
                "torch.arange(n, device=dense.device))")
    return NetworkError(f"{network_label(job, source)}: forward or backward on {device} "
                        f"raised {describe(exc, source)}{hint}")
