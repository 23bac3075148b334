"""Where files live: a local path or an object-store URI (``s3://bucket/prefix``), through
pyarrow's filesystems (``roles.storage.fs``)."""
