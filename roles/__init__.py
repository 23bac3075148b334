"""The zbus roles (control, feeder, ps, worker, aggregator) and the pure algorithms beside them."""
