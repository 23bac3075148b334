#!/usr/bin/env bash
# Make .venv (once) and install zbus with its test tools into it; quick when nothing changed.
# PyTorch: the CPU build is installed first when torch is missing, because a bare `torch`
# requirement pulls several GB of CUDA packages. To use a CUDA build, install it into .venv
# yourself first (or set ZBUS_TORCH_SPEC, e.g. ZBUS_TORCH_SPEC="torch==2.5.1", and/or
# ZBUS_TORCH_INDEX, the package index torch comes from, e.g.
# https://download.pytorch.org/whl/cu124). ZBUS_SETUP_EXTRAS: the extras of zbus installed
# (default "test"; empty: zbus alone, as the container image does).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ZBUS_VENV:-$root/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "zbus needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }
  echo "zbus setup: creating $venv" >&2
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  if [ -n "${ZBUS_TORCH_INDEX:-}" ]; then
    echo "zbus setup: installing PyTorch from $ZBUS_TORCH_INDEX" >&2
    "${pip[@]}" install -q "${ZBUS_TORCH_SPEC:-torch}" --index-url "$ZBUS_TORCH_INDEX"
  elif [ -n "${ZBUS_TORCH_SPEC:-}" ]; then
    echo "zbus setup: installing PyTorch ($ZBUS_TORCH_SPEC)" >&2
    "${pip[@]}" install -q "$ZBUS_TORCH_SPEC"
  else
    echo "zbus setup: installing PyTorch (CPU build)" >&2
    if ! "${pip[@]}" install -q --no-compile "torch==2.13.0+cpu" 2>/dev/null; then
      # No local CPU wheel of that version: take the current CPU build from PyTorch's index.
      "${pip[@]}" install -q torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi

extras=${ZBUS_SETUP_EXTRAS-test}
target=$root${extras:+[$extras]}
stamp="$venv/.zbus-installed"
want=$({ cat "$root/pyproject.toml"; [ "$extras" = test ] || echo "extras=$extras"; } \
       | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "zbus setup: installing zbus${extras:+ with [$extras]}" >&2
  uv=()
  if [ "${ZBUS_SETUP_PIP:-}" != 1 ]; then
    "$venv/bin/python" -m uv --version >/dev/null 2>&1 \
      || "${pip[@]}" install -q --no-compile "uv>=0.5,<1" >/dev/null 2>&1 || true
    if "$venv/bin/python" -m uv --version >/dev/null 2>&1; then
      uv=("$venv/bin/python" -m uv pip install --python "$venv/bin/python" -q)
    fi
  fi
  if [ ${#uv[@]} -gt 0 ] && "${uv[@]}" -e "$target"; then
    :   # uv keeps what is installed when it satisfies the requirement: torch above, say
  # pip's own status decides (pipefail): only the filter of one harmless warning may find nothing
  elif ! "${pip[@]}" install -q -e "$target" 2>&1 \
      | { grep -v "is ignored: it is neither" >&2 || true; }; then
    echo "zbus setup: installing zbus into $venv failed (pip's message above)" >&2
    exit 1
  fi
  # The bytecode of everything the roles import, written now, once, and only that (not the
  # whole venv: 50 s more on a 2-core host): torch is installed without it, and where
  # PYTHONDONTWRITEBYTECODE is set no import writes it, so that every process would compile
  # torch's Python again (7 s of CPU for `import torch` on a 2-core host, 3.5 s with it).
  # scripts/test and scripts/start let imports write the rest (test tools, modules imported
  # later). This import fails loudly if the install is incomplete, and the bytecode is in
  # place before a job's processes start at once.
  echo "zbus setup: writing the roles' bytecode" >&2
  env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c 'import zbus, roles, console.app, zmq, msgspec, numba, torch, honcho
import roles.control.main, roles.feeder.process, roles.ps, roles.worker.process, roles.aggregator
import roles.tools.spawn, roles.tools.ctl, roles.tools.reference, roles.algorithms.shared.dense_optimizer
import roles.tools.pod, roles.tools.predict, roles.member, pyarrow.csv, pyarrow.parquet
import roles.serving.main, roles.serving.app, uvicorn'
  # numba's cache of the compiled loops (beside their modules, or in NUMBA_CACHE_DIR), as the
  # image builds it: made once here, not by each of the first shards and feeders at once
  "$venv/bin/python" -c 'from roles.algorithms.shard.kernels import loops
from roles.data.hashing import compiled_loop
from roles.model.row_sums import loop
loops(); compiled_loop(); loop()'
  echo "$want" > "$stamp"
fi
