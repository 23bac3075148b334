"""Reading, transforming and generating training data (no sockets here)."""
