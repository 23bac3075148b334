"""``deepfm`` (Guo et al., 2017): three logits summed. First order: a linear of every field's
vector and the dense features to 1 (one weight per input column: each field's own linear,
summed, and one on the dense features); second order: the factorisation machine's pairwise
dot products of the field vectors, 1/2 ((sum v)^2 - sum v^2); deep: ReLU layers over their
concatenation to one logit. A sequence field is mean-pooled over its length.

Options: ``hidden`` (the deep part, default ``[model] hidden``). Every field must have the same
width (the FM term multiplies their vectors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import field_vectors, logit_mlp, one_width, read_options, sizes

DEFAULTS: dict[str, Any] = {"hidden": [128, 64]}


class DeepFm(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int]):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        width = sum(sparse_dims.values()) + dense_count
        self.linear = nn.Linear(width, 1)
        self.deep = logit_mlp(width, hidden)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        vectors = field_vectors(sparse, lengths, self.fields, self.sequences)
        x = torch.cat([*vectors, dense], dim=1)
        first = self.linear(x).squeeze(1)
        stacked = torch.stack(vectors, dim=1)                       # [B, fields, dim]
        second = 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(1)
        return first + second + self.deep(x).squeeze(1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> DeepFm:
    opts = read_options("deepfm", options, DEFAULTS)
    one_width("deepfm", sparse_dims)
    return DeepFm(sparse_dims, sequence_fields, dense_count,
                  sizes("deepfm", "hidden", opts["hidden"]))
