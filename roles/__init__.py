"""The zbus application, on the transport in ``zbus/``.

Processes, one module each: ``control/`` (a package of collaborating parts), ``feeder``,
``ps``, ``worker``, ``aggregator``, ``part`` (a member of a model-parallel group).
Beside them: ``protocol/`` (every message and protocol fact, by concern), ``algorithms/`` (pure
code: batching, the ledger, placement, capacity, the aggregation decision and math, ...),
``model/`` (the network, its graph and partition, model files), ``data/`` (reading, hashing,
transforming, generating data), ``job/`` (settings, command line, run files) and ``tools/``
(command-line tools).
"""
