"""Whole-job checkpoints on disk: the files and manifests (``files``), writing off a role's
loop (``background``), a shard's chain of full and incremental files (``shard``), a feeder's
ack log at the cut (``feeder``). Control's side, the cut itself, is
``roles.control.checkpoints``; the messages are ``roles.protocol.checkpoint``."""
