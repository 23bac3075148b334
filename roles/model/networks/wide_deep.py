"""``wide_deep`` (Cheng et al., 2016): the wide part, a linear (with bias) of every field's
vector and the dense features concatenated, and the deep part, ReLU layers over the same
concatenation to one logit, summed (one of each per task). A sequence field is mean-pooled
over its length.

Options: ``hidden`` (the deep part, default ``[model] hidden``), ``tasks`` (the job's labels
when it has several: the wide part and the deep part's last linear give one logit each,
``[B, T]``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    field_vectors,
    logit_mlp,
    read_options,
    sizes,
    task_logits,
    task_names,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "tasks": []}


class WideDeep(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int], tasks: int = 1):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.several = tasks > 1
        width = sum(sparse_dims.values()) + dense_count
        self.wide = nn.Linear(width, tasks)
        self.deep = logit_mlp(width, hidden, tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([*field_vectors(sparse, lengths, self.fields, self.sequences), dense],
                      dim=1)
        return task_logits(self.wide(x) + self.deep(x), self.several)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> WideDeep:
    opts = read_options("wide_deep", options, DEFAULTS)
    return WideDeep(sparse_dims, sequence_fields, dense_count,
                    sizes("wide_deep", "hidden", opts["hidden"]),
                    max(1, len(task_names("wide_deep", opts["tasks"]))))
