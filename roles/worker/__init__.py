"""A worker: the process that trains one replica of the dense network (``python -m
roles.worker`` or ``zbus-worker``). Its loop, the sockets and the dispatch of messages are in
``process``; its parts, each an object given what it needs: ``feeders`` (the sample queue, the
feeders' ledgers: takes, grants, acks), ``shards`` (embeddings in, gradient rows out), ``dense``
(the replica, its rounds, the aggregators), ``running`` (one batch at a time), ``group_link``
(the model-parallel group it leads, its work waiting through the loop)."""
