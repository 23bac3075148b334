"""``mlp``: every field's vector (a sequence field mean-pooled over its length) concatenated in
field order, then the dense features, through ReLU layers of ``hidden`` to one logit per task.
Where the worker's grid already holds the fields' vectors side by side (``JoinedFields``), they
are neither copied nor joined to the dense features (``mlp_over``); a plain dict (a user's
inputs, torch.fx's tracing for model parallelism) goes through the concatenation and the layers
as modules, as before.

Options: ``hidden`` (list of ints, default ``[128, 64]`` from ``[model] hidden``); ``tasks``
(the job's labels when it has several: the last linear gives one logit each, ``[B, T]``).

For a job without sequence fields it makes the very layers the worker's network had before
list fields (``CtrNet``), in the same order: the same seed gives the same initial weights and the
same flat parameter order, so earlier results and checkpoints still hold.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    logit_mlp,
    over_fields,
    read_options,
    sizes,
    task_logits,
    task_names,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "tasks": []}


class MlpNet(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int], tasks: int = 1):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.dense_count = dense_count
        self.several = tasks > 1
        self.mlp = logit_mlp(sum(sparse_dims.values()) + dense_count, hidden, tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        return task_logits(over_fields(self.mlp, sparse, dense, lengths, self.fields,
                                       self.sequences, self.dense_count), self.several)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> MlpNet:
    opts = read_options("mlp", options, DEFAULTS)
    tasks = task_names("mlp", opts["tasks"])
    return MlpNet(sparse_dims, sequence_fields, dense_count,
                  sizes("mlp", "hidden", opts["hidden"]), max(1, len(tasks)))
