"""Pure algorithms: no sockets, each tested on its own. Roles feed them messages and the
clock and act on what they return. Grouped by the role that owns them:

- ``feeding/``: a feeder's ledger of batches in flight, its passes over its parts, its tally,
  ack log and reclaim after a restart, its share of the parts, where it routes keys;
- ``shard/``: a shard's embedding table, its key index, admission, expiry, the batches it
  applied, the work of its placement windows;
- ``worker/``: a worker's replica and rounds, its pulled batches, its links to the feeders;
- ``control/``: membership, the lazy-aggregation decision, the capacity predictor, key
  placement, the status for consoles, the summary;
- ``sync/``: the sync modes' strategies, one module per side (worker, feeder, aggregator);
- ``shared/``: what several roles use: evaluation metrics, the aggregation math, the key map
  and its counts, live settings, a long task's progress.

Layers: the algorithms import ``roles.data``, ``roles.job``, ``roles.protocol`` and ``zbus``,
never ``roles.model``, ``roles.checkpoint`` or a process (``tests/test_layers.py``)."""
