"""Command-line tools: ``zbus-spawn`` (starts a role's processes), ``zbus-ctl``,
``zbus-predict``, ``zbus-reference``, ``zbus-keys``, ``zbus-partition``."""
