"""The feeder's algorithms: the ledger of batches in flight (``ledger``), a pass over its parts
(``passes``), what its acks add up to (``tally``), its ack log and what a restarted feeder
reclaims (``ack_log``, ``reclaim``), its share of the parts (``parts``) and where it sends
each key (``key_routing``)."""
