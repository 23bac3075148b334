"""The zbus application, on the transport in ``zbus/``.

Processes, one module each: ``control/`` (a package of collaborating components), ``feeder``,
``ps``, ``worker``, ``aggregator``, ``member`` (a member of a model-parallel group).
Beside them: ``protocol/`` (every message and protocol fact, by concern), ``algorithms/`` (pure
code: batching, the ledger, placement, capacity, the aggregation decision and math, ...),
``model/`` (the network, its graph and partition, model files), ``data/`` (reading, hashing,
transforming, generating data), ``job/`` (settings, command line, run files) and ``tools/``
(command-line tools).
"""

import os

# numpy's BLAS (OpenBLAS) runs a pool of threads that spin for a while after every call: a role
# that calls it now and then (the aggregator's backup check, the synthetic data's logits) kept a
# whole core busy spinning, taken from the workers on a shared host (measured: a vector norm
# every 5 ms, 1.0 core with the pool against 0.01 without). zbus's roles make no BLAS call
# large enough to gain from threads, so the pool is one thread unless the user sets it; this
# must happen before numpy is first imported, which is why it is here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
