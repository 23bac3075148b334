"""A shard's algorithms: its embedding table (``embedding_table``) and key -> row map
(``key_index``), admission (``admission``), expiry and eviction (``expiry``), the batches it
applied after each checkpoint (``applied_log``) and its work per placement window
(``window_work``)."""
