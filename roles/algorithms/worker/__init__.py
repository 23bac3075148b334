"""A worker's algorithms: its replica of the dense network and its rounds (``replica``), the
batches it pulled and their waits (``pulled``), its links to the feeders' ledgers
(``feeder_links``)."""
