"""Control: the process that owns the job's lifecycle, the cluster's membership and health,
the aggregation decision, live settings, placement and the summary (``python -m
roles.control`` or ``zbus-control``)."""
