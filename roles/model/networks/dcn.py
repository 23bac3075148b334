"""``dcn``: DCN-v2 (Wang et al., 2021). The input x0 is every field's vector (a sequence field
mean-pooled) and the dense features, concatenated; each full-rank cross layer makes
x_{l+1} = x0 * (W x_l + b) + x_l; a deep tower of ReLU layers runs beside the cross layers
(``parallel``: both read x0, their outputs concatenated) or after them (``stacked``); a linear
makes the logit (one per task).

Options: ``hidden`` (the deep tower, default ``[model] hidden``), ``cross_layers`` (default 3,
0 or more), ``structure`` (``"parallel"``, the default, or ``"stacked"``), ``tasks`` (the
job's labels when it has several: one logit each, ``[B, T]``, from one linear head per task on
the shared network).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    choice,
    count,
    field_vectors,
    read_options,
    relu_layers,
    sizes,
    task_logits,
    task_names,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "cross_layers": 3, "structure": "parallel",
                            "tasks": []}
STRUCTURES = ("parallel", "stacked")


class Dcn(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int], cross_layers: int, structure: str,
                 tasks: int = 1):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.stacked = structure == "stacked"
        self.several = tasks > 1
        width = sum(sparse_dims.values()) + dense_count
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(cross_layers))
        layers, deep_width = relu_layers(width, hidden)
        self.deep = nn.Sequential(*layers)
        self.out = nn.Linear(deep_width if self.stacked else width + deep_width, tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x0 = torch.cat([*field_vectors(sparse, lengths, self.fields, self.sequences), dense],
                       dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        if self.stacked:
            return task_logits(self.out(self.deep(x)), self.several)
        return task_logits(self.out(torch.cat([x, self.deep(x0)], dim=1)), self.several)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> Dcn:
    opts = read_options("dcn", options, DEFAULTS)
    return Dcn(sparse_dims, sequence_fields, dense_count, sizes("dcn", "hidden", opts["hidden"]),
               count("dcn", "cross_layers", opts["cross_layers"], 0),
               choice("dcn", "structure", opts["structure"], STRUCTURES),
               max(1, len(task_names("dcn", opts["tasks"]))))
