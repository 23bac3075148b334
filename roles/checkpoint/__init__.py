"""The files a run leaves of its model. Whole-job checkpoints: the files and manifests
(``files``), writing off a role's loop (``background``), a shard's chain of full and incremental
files (``shard``), a feeder's ack log at the cut (``feeder``), a checkpoint read as a model
(``serving``); control's side, the cut itself, is ``roles.control.checkpoints`` and the messages
are ``roles.protocol.checkpoint``. The model's own files: dense-weight backups and the exported
model (``model_files``), an ``.npz`` streamed to disk entry by entry (``npz_stream``)."""
