"""``deepfm`` (Guo et al., 2017): three logits summed. First order: a linear of every field's
vector and the dense features to 1 (one weight per input column: each field's own linear,
summed, and one on the dense features); second order: the factorisation machine's pairwise
dot products of the field vectors, 1/2 ((sum v)^2 - sum v^2); deep: ReLU layers over their
concatenation to one logit. A sequence field is mean-pooled over its length. With several
tasks the first order and the deep part give a logit each, and the second-order term is added
to every one.

Options: ``hidden`` (the deep part, default ``[model] hidden``), ``tasks`` (the job's labels
when it has several: one logit each, ``[B, T]``). Every field must have the same width (the FM
term multiplies their vectors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    field_vectors,
    one_width,
    read_options,
    sizes,
    task_names,
)
from roles.model.networks.wide_deep import WideDeep

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "tasks": []}


class DeepFm(nn.Module):
    """``wide_deep`` (its wide part is the first order, its deep part the same) plus the
    factorisation machine's second-order term."""

    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int], tasks: int = 1):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.several = tasks > 1
        self.first_and_deep = WideDeep(sparse_dims, sequence_fields, dense_count, hidden,
                                       tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(field_vectors(sparse, lengths, self.fields, self.sequences),
                              dim=1)                                  # [B, fields, dim]
        second = 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(1)
        if self.several:   # fixed when built: [B, T] + the one term, [B, 1]
            second = second.unsqueeze(1)
        return self.first_and_deep(sparse, dense, lengths) + second


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> DeepFm:
    opts = read_options("deepfm", options, DEFAULTS)
    one_width("deepfm", sparse_dims)
    return DeepFm(sparse_dims, sequence_fields, dense_count,
                  sizes("deepfm", "hidden", opts["hidden"]),
                  max(1, len(task_names("deepfm", opts["tasks"]))))
