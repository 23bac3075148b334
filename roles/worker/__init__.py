"""A worker: the process that trains one replica of the dense network (``python -m
roles.worker`` or ``zbus-worker``); its loop is ``process``, the model-parallel group it leads
``group_link``."""
from roles.worker.process import main

__all__ = ["main"]
