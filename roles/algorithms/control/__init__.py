"""Control's algorithms: its view of the cluster (``membership``), the lazy-aggregation decision
and its figures (``decision``), the shards' capacity predictor (``capacity``), skew-aware key
placement (``placement``), the status it publishes (``status``) and the run's summary
(``summary``)."""
