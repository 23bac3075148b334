"""``shared_bottom`` (Caruana, 1997; the multi-task baseline of MMoE and PLE): every field's
vector (a sequence field mean-pooled) and the dense features, concatenated as ``mlp`` reads
them, through a shared ReLU MLP (``bottom``), then a tower per task (ReLU layers of ``tower``,
then a linear to one logit): ``[B, T]``, column t the t-th label of ``[data] labels``.

Options: ``bottom`` (default ``[128]``; empty: each tower reads the input), ``tower`` (default
``[64]``), ``hidden`` (given to every network, ``[model] hidden``; not used), ``tasks`` (the
job's labels, two or more).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    logit_mlp,
    over_fields,
    read_options,
    relu_layers,
    several_tasks,
    sizes,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "bottom": [128], "tower": [64], "tasks": []}


class SharedBottom(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, bottom: list[int], tower: list[int], tasks: int):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.dense_count = dense_count
        layers, width = relu_layers(sum(sparse_dims.values()) + dense_count, bottom)
        self.bottom = nn.Sequential(*layers)
        self.towers = nn.ModuleList(logit_mlp(width, tower) for _ in range(tasks))

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        shared = over_fields(self.bottom, sparse, dense, lengths, self.fields, self.sequences,
                             self.dense_count)
        return torch.cat([tower(shared) for tower in self.towers], dim=1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> SharedBottom:
    opts = read_options("shared_bottom", options, DEFAULTS)
    tasks = several_tasks("shared_bottom", opts["tasks"])
    return SharedBottom(sparse_dims, sequence_fields, dense_count,
                        sizes("shared_bottom", "bottom", opts["bottom"]),
                        sizes("shared_bottom", "tower", opts["tower"]), len(tasks))
