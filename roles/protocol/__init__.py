"""The application's protocol: every message that crosses the bus besides the base node
messages (``zbus.messages``), grouped by concern, and the protocol facts beside them (the
batch-id layout, the status layout, the operators' actions, the shards' work slots, the
topology). Importing any module of this package registers every message type, so that any
role decodes (and counts, or rejects by kind) whatever arrives.
"""

from roles.protocol import (  # noqa: F401  (registers every message type)
    checkpoint,
    datapath,
    dense_sync,
    lifecycle,
    model_parallel,
    operator,
    placement,
    serving,
    stream,
    topology,
)
