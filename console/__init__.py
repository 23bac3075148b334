"""The zbus operator console (Textual): ``zbus-console``."""
