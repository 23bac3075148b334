"""``dlrm`` (Naumov et al., 2019): a bottom MLP takes the dense features to the embedding
width; the dot products of every pair of vectors (each field's, a sequence field mean-pooled,
and the bottom MLP's output) are its interactions; the bottom output and the interactions go
through a top MLP to one logit per task.

Options: ``hidden`` (the top MLP, default ``[model] hidden``); ``bottom`` (the bottom MLP's
layers, ReLU after each, default ``[64, dim]``; the last must be the embedding width ``dim``);
``tasks`` (the job's labels when it has several: the top MLP's last linear gives one logit
each, ``[B, T]``). Every field must have the same width. A job without dense features has no
bottom MLP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    field_vectors,
    logit_mlp,
    one_width,
    read_options,
    relu_layers,
    sizes,
    task_logits,
    task_names,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "bottom": None, "tasks": []}


class Dlrm(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, bottom: list[int], hidden: list[int], tasks: int = 1):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.has_dense = dense_count > 0
        self.several = tasks > 1
        layers, width = relu_layers(dense_count, bottom) if self.has_dense else ([], 0)
        self.bottom = nn.Sequential(*layers)
        self.vectors = len(self.fields) + int(self.has_dense)
        self.top = logit_mlp(width + self.vectors * (self.vectors - 1) // 2, hidden,
                             tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        vectors = field_vectors(sparse, lengths, self.fields, self.sequences)
        if self.has_dense:   # a setting, fixed when built: no branching on tensor values
            vectors = [self.bottom(dense), *vectors]
        stacked = torch.stack(vectors, dim=1)                       # [B, n, dim]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))          # [B, n, n]
        # the pairs i > j, row by row (as torch.tril_indices(n, n, -1)): [B, n (n - 1) / 2]
        interactions = torch.cat([dots[:, i, :i] for i in range(1, self.vectors)], dim=1)
        top_in = torch.cat([vectors[0], interactions], dim=1) if self.has_dense \
            else interactions
        return task_logits(self.top(top_in), self.several)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> Dlrm:
    opts = read_options("dlrm", options, DEFAULTS)
    dim = one_width("dlrm", sparse_dims)
    bottom = sizes("dlrm", "bottom", [64, dim] if opts["bottom"] is None else opts["bottom"])
    if len(sparse_dims) + (dense_count > 0) < 2:
        raise ValueError("dlrm needs two vectors to interact: two sparse fields, or one and "
                         "dense features")
    if dense_count and (not bottom or bottom[-1] != dim):
        raise ValueError(f"dlrm: option bottom must end with the embedding width {dim}, "
                         f"got {bottom!r}")
    return Dlrm(sparse_dims, sequence_fields, dense_count, bottom,
                sizes("dlrm", "hidden", opts["hidden"]),
                max(1, len(task_names("dlrm", opts["tasks"]))))
