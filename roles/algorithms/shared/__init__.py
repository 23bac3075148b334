"""Algorithms more than one role uses: AUC and log loss (``metrics``), the aggregation math
(``aggregation``), the key -> shard map and the key counts behind it (``key_map``), live
settings (``live``), a long task's progress in figures and words (``progress``)."""
