"""A worker's algorithms: its replica of the dense network, its weights and its rounds
(``replica``), the batches it pulled and their waits (``pulled``), its links to the feeders'
ledgers (``feeder_links``), how many batches it asks for ahead (``window``)."""
