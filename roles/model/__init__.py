"""The dense network (PyTorch), its task graph and partition over a model-parallel group, and
the files that hold a model (backups, exports)."""
