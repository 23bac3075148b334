# syntax=docker/dockerfile:1
# The zbus image: every role, started by `zbus-pod ROLE` (deploy/kubernetes).
#
#   docker build -t registry.example.com/zbus:0.1.0-cpu .
#   docker build -t registry.example.com/zbus:0.1.0-cuda \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 .
#
# PyTorch comes from TORCH_INDEX (CPU build by default; a bare `torch` from PyPI would pull
# several GB of CUDA packages); TORCH_SPEC pins it (e.g. torch==2.6.0). zbus is installed by
# scripts/setup.sh, as on a host, into the virtual environment /opt/zbus, without the test tools.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC=torch
# numba's cache of the compiled loops: built here, read by every role (below)
ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/opt/zbus-numba
WORKDIR /opt/zbus-src
# What setup.sh installs from (pyproject.toml names README.md as the readme), and nothing else
COPY pyproject.toml README.md ./
COPY scripts/setup.sh scripts/setup.sh
COPY zbus zbus
COPY roles roles
COPY console console
RUN ZBUS_VENV=/opt/zbus ZBUS_TORCH_INDEX="${TORCH_INDEX}" ZBUS_TORCH_SPEC="${TORCH_SPEC}" \
        ZBUS_SETUP_EXTRAS= scripts/setup.sh \
    && /opt/zbus/bin/python -m compileall -q /opt/zbus-src/zbus /opt/zbus-src/roles \
        /opt/zbus-src/console \
    && /opt/zbus/bin/python -m compileall -q -j 0 /opt/zbus/lib \
    && /opt/zbus/bin/python -c "from roles.algorithms.shard.kernels import loops; \
from roles.data.hashing import compiled_loop; from roles.model.row_sums import loop; \
loops(); compiled_loop(); loop()"
# (the venv's bytecode: setup.sh installs torch without it, and a pod's root is read-only, so
# without it every role's start would compile torch's Python again, seconds of CPU each.
# The compiled loops of the shards, the feeder's keys and the workers' gradient sums, into
# NUMBA_CACHE_DIR, so that no role starts the compiler. numba takes a cache directory only
# where it can write: the image's is owned by uid 10001, and a pod, whose root is read-only,
# mounts an emptyDir at that path that an init container filled with the image's copy
# (deploy/kubernetes/components/zbus-pod). The cache holds code for the CPU the image was
# built on: a node with another CPU compiles the loops once per pod, into that directory.)

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="zbus" \
      org.opencontainers.image.description="Distributed CTR training on a ZeroMQ bus"
# The virtual environment holds an editable install of the source: both at the same paths
COPY --from=build /opt/zbus /opt/zbus
COPY --from=build /opt/zbus-src /opt/zbus-src
COPY --from=build --chown=10001:10001 /opt/zbus-numba /opt/zbus-numba
COPY scripts /opt/zbus-src/scripts
COPY jobs /opt/zbus-src/jobs
# uid 10001 (the manifests' runAsUser); /var/lib/zbus (run directory, data cache, $HOME) is an
# emptyDir in a pod, /etc/zbus holds the job file and the keys mounted there
RUN groupadd --gid 10001 zbus \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/zbus --no-create-home \
        --shell /usr/sbin/nologin zbus \
    && mkdir -p /var/lib/zbus/run /etc/zbus/keys \
    && chown -R 10001:10001 /var/lib/zbus
ENV PATH=/opt/zbus/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/zbus \
    ZBUS_RUN_DIR=/var/lib/zbus/run \
    ZBUS_CACHE_DIR=/var/lib/zbus/cache \
    NUMBA_CACHE_DIR=/opt/zbus-numba
WORKDIR /var/lib/zbus
USER 10001:10001
ENTRYPOINT ["zbus-pod"]
