"""``wide_deep`` (Cheng et al., 2016): the wide part, a linear (with bias) of every field's
vector and the dense features concatenated, and the deep part, ReLU layers over the same
concatenation to one logit, summed. A sequence field is mean-pooled over its length.

Options: ``hidden`` (the deep part, default ``[model] hidden``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import field_vectors, logit_mlp, read_options, sizes

DEFAULTS: dict[str, Any] = {"hidden": [128, 64]}


class WideDeep(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int]):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        width = sum(sparse_dims.values()) + dense_count
        self.wide = nn.Linear(width, 1)
        self.deep = logit_mlp(width, hidden)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([*field_vectors(sparse, lengths, self.fields, self.sequences), dense],
                      dim=1)
        return (self.wide(x) + self.deep(x)).squeeze(1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> WideDeep:
    opts = read_options("wide_deep", options, DEFAULTS)
    return WideDeep(sparse_dims, sequence_fields, dense_count,
                    sizes("wide_deep", "hidden", opts["hidden"]))
