"""The layers (docs/architecture.md, "The layers"): every import of every module, at the top of the
file or inside a function, goes down the stack or stays in its own layer, never up.

    zbus < roles.protocol < roles.job < roles.data < roles.algorithms < roles.model
         < roles.checkpoint < the processes < roles.tools

Inside ``roles.algorithms`` each owner's group (``feeding``, ``shard``, ``worker``, ``control``)
imports only itself and ``shared``; ``shared`` imports no group; ``sync`` (the modes'
strategies, one module per side) may import any group. The console talks to control only: it
imports the transport, the protocol, the job's command line and the wording of progress."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

LAYERS = ["zbus", "roles.protocol", "roles.storage", "roles.job", "roles.data",
          "roles.algorithms", "roles.model", "roles.checkpoint", "process", "roles.tools",
          "roles.testbed"]
PROCESSES = ("roles.control", "roles.feeder", "roles.ps", "roles.worker", "roles.aggregator",
             "roles.member", "roles.serving")
ALGORITHM_GROUPS = ("feeding", "shard", "worker", "control")
CONSOLE_MAY_IMPORT = ("zbus", "roles.protocol", "roles.job.cli",
                      "roles.algorithms.shared.progress", "console")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    """The layer's rank, or None outside the project (numpy, torch, ...) or at ``roles``
    itself (its ``__init__`` sets a thread count, imported by every module)."""
    if any(module == p or module.startswith(p + ".") for p in PROCESSES):
        return LAYERS.index("process")
    for rank, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def imported_module(base: str, name: str) -> str:
    """``from base import name``: the module ``base.name`` where it is one, else ``base``."""
    where = REPO / base.replace(".", "/") / name
    return f"{base}.{name}" if where.with_suffix(".py").exists() or where.is_dir() else base


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every project import in the file, wherever it stands (a function's
    imports too)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found += [(node.lineno, imported_module(base, a.name)) for a in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] in ("zbus", "roles", "console")]


def sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (REPO / top).rglob("*.py"))


def group_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["roles", "algorithms"] else None


@pytest.mark.parametrize("path", sources("zbus", "roles"), ids=lambda p: module_name(p))
def test_no_module_imports_a_layer_above_its_own(path):
    me = module_name(path)
    rank = layer_of(me)
    if rank is None:   # roles/__init__.py
        return
    upward = [f"line {line}: {m} ({LAYERS[r]})" for line, m in imports(path)
              if (r := layer_of(m)) is not None and r > rank]
    assert not upward, f"{me} ({LAYERS[rank]}) imports up: {upward}"


@pytest.mark.parametrize("path", sources("roles/algorithms"), ids=lambda p: module_name(p))
def test_an_algorithm_group_imports_only_itself_and_the_shared_group(path):
    mine = group_of(module_name(path))
    if mine in (None, "sync"):
        return
    allowed = {mine, "shared"} if mine in ALGORITHM_GROUPS else {"shared"}
    crossing = [f"line {line}: {m}" for line, m in imports(path)
                if (g := group_of(m)) is not None and g not in allowed]
    assert not crossing, f"{module_name(path)} imports another owner's algorithms: {crossing}"


@pytest.mark.parametrize("path", sources("console"), ids=lambda p: module_name(p))
def test_the_console_imports_only_the_transport_the_protocol_and_the_command_line(path):
    outside = [f"line {line}: {m}" for line, m in imports(path)
               if not any(m == a or m.startswith(a + ".") for a in CONSOLE_MAY_IMPORT)]
    assert not outside, f"{module_name(path)}: {outside}"


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    """The checks above read real imports: a module of the data layer that imports a process
    and an algorithm inside a function is found out (in a copy of the tree's layout)."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    for d in ("roles/data", "roles/feeder", "roles/algorithms/shared"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "roles/feeder/streams.py").write_text("")
    (tmp_path / "roles/algorithms/shared/live.py").write_text("")
    bad = tmp_path / "roles/data/probe.py"
    bad.write_text("def f():\n    from roles.feeder.streams import PartStreams\n"
                   "    from roles.algorithms.shared import live\n    from . import probe\n")
    found = [(m, layer_of(m)) for _, m in imports(bad)]
    assert found == [("roles.feeder.streams", LAYERS.index("process")),
                     ("roles.algorithms.shared.live", LAYERS.index("roles.algorithms")),
                     ("roles.data.probe", LAYERS.index("roles.data"))]


@pytest.mark.integration
def test_a_shard_loads_neither_pyarrow_nor_torch():
    """A shard's memory is its table: the modules it runs import neither (pyarrow alone would
    cost it about 35 MB; its storage loads pyarrow's filesystems only for an ``s3://`` store)."""
    code = ("import sys, roles.ps, roles.checkpoint.shard, roles.storage.store\n"
            "print(sorted(m for m in ('pyarrow', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
