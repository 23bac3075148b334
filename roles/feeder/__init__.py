"""A feeder: the process that reads its parts of the data and feeds them to the cluster
(``python -m roles.feeder`` or ``zbus-feeder``). Its loop, the sockets and the dispatch of
messages are in ``process``; its parts, each an object given what it needs: ``loading`` (the
data opened and indexed, the statistics pass), ``passes`` (its parts and the passes over them),
``ledger_side`` (takes, grants, acks, the ack log, a restart's reclaiming), ``hold`` (whole-job
checkpoints); the streams of its parts in ``streams``."""
