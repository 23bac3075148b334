"""``deepfm`` (Guo et al., 2017): three logits summed. First order: one weight per id of every
sparse field (its ``wide:<field>`` table, one row per id at the width of the tasks: the shards
hold and train them like any embedding; a list field's ids' weights summed), a weight per dense
feature and a bias; second order: the factorisation machine's pairwise dot products of the
field vectors, 1/2 ((sum v)^2 - sum v^2); deep: ReLU layers over the field vectors and the
dense features concatenated, to one logit. A sequence field is mean-pooled over its length.
With several tasks the first order and the deep part give a logit each, and the second-order
term is added to every one.

Options: ``hidden`` (the deep part, default ``[model] hidden``), ``tasks`` (the job's labels
when it has several: one logit each, ``[B, T]``), ``wide_fields`` (the first order's fields:
the job's layout gives them; a network built without them has no weight per id). Every field
must have the same width (the FM term multiplies their vectors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    field_vectors,
    logit_mlp,
    one_width,
    over_fields,
    read_options,
    sizes,
    task_logits,
    task_names,
)
from roles.model.networks.wide_deep import WeightsPerId, field_names, split_fields

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "tasks": [], "wide_fields": []}


class DeepFm(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int], tasks: int = 1,
                 wide_fields: list[str] | None = None):
        super().__init__()
        self.fields, first = split_fields("deepfm", sparse_dims, wide_fields or [], tasks)
        one_width("deepfm", {f: sparse_dims[f] for f in self.fields})
        self.sequences = [f for f in sequence_fields if f in self.fields]
        self.dense_count = dense_count
        self.several = tasks > 1
        self.first = WeightsPerId(first, dense_count, tasks)
        self.deep = logit_mlp(sum(sparse_dims[f] for f in self.fields) + dense_count, hidden,
                              tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        first = self.first(sparse, dense)   # (the parameters used in their modules' order)
        stacked = torch.stack(field_vectors(sparse, lengths, self.fields, self.sequences),
                              dim=1)                                  # [B, fields, dim]
        second = 0.5 * (stacked.sum(1).pow(2) - stacked.pow(2).sum(1)).sum(1, keepdim=True)
        deep = over_fields(self.deep, sparse, dense, lengths, self.fields, self.sequences,
                           self.dense_count)
        return task_logits(first + second + deep, self.several)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> DeepFm:
    opts = read_options("deepfm", options, DEFAULTS)
    return DeepFm(sparse_dims, sequence_fields, dense_count,
                  sizes("deepfm", "hidden", opts["hidden"]),
                  max(1, len(task_names("deepfm", opts["tasks"]))),
                  field_names("deepfm", "wide_fields", opts["wide_fields"]))
