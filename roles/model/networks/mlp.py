"""``mlp``: every field's vector (a sequence field mean-pooled over its length) concatenated in
field order, then the dense features, through ReLU layers of ``hidden`` to one logit. Where
the worker's grid already holds the fields' vectors side by side (``JoinedFields``), they are
neither copied nor joined to the dense features (``mlp_over``); a plain dict (a user's inputs,
torch.fx's tracing for model parallelism) goes through the concatenation and the layers as
modules, as before.

Options: ``hidden`` (list of ints, default ``[128, 64]`` from ``[model] hidden``).

For a job without sequence fields it makes the very layers the worker's network had before
list fields (``CtrNet``), in the same order: the same seed gives the same initial weights and the
same flat parameter order, so earlier results and checkpoints still hold.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    field_vectors,
    joined_of,
    logit_mlp,
    mlp_over,
    read_options,
    sizes,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64]}


class MlpNet(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int]):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.dense_count = dense_count
        self.mlp = logit_mlp(sum(sparse_dims.values()) + dense_count, hidden)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x = None if self.sequences else joined_of(sparse, self.fields)
        if x is not None:   # the worker's grid as it is: no copy in, none of the gradient out
            return mlp_over(self.mlp, x, dense, self.dense_count).squeeze(1)
        vectors = field_vectors(sparse, lengths, self.fields, self.sequences)
        return self.mlp(torch.cat([*vectors, dense], dim=1)).squeeze(1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> MlpNet:
    opts = read_options("mlp", options, DEFAULTS)
    return MlpNet(sparse_dims, sequence_fields, dense_count, sizes("mlp", "hidden",
                                                                   opts["hidden"]))
