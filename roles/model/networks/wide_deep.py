"""``wide_deep`` (Cheng et al., 2016): a wide part and a deep part, their logits summed (one of
each per task).

- Wide: a generalised linear model, memorising: one weight per id of every sparse field (its
  ``wide:<field>`` table, one row per id at the width of the tasks; a list field's ids'
  weights summed), one weight per crossed tuple of ids (``[model.options] crosses =
  [["user_id", "movie_id"]]``: a ``cross:user_id*movie_id`` table whose keys hash the pair),
  a weight per dense feature and a bias. The weights per id are rows of the shards like any
  embedding (``roles.job.fields``'s derived fields), trained by the embeddings' optimizer.
- Deep: ReLU layers (``hidden``) over the fields' vectors and the dense features
  concatenated, to one logit. A sequence field is mean-pooled over its length.

Options: ``hidden`` (the deep part, default ``[model] hidden``), ``crosses`` (the crossed
columns: read by the job's layout, which makes their fields), ``tasks`` (the job's labels when
it has several: ``[B, T]``), ``wide_fields`` (the weights per id's fields: the job's layout
gives them; a network built without them has no weight per id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from roles.job.fields import FieldLayout
from roles.model.networks.layers import (
    logit_mlp,
    over_fields,
    read_options,
    sizes,
    task_logits,
    task_names,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "tasks": [], "crosses": [], "wide_fields": []}


def layout_defaults(layout: FieldLayout, options: dict[str, Any]) -> dict[str, Any]:
    """The weights per id's fields of the job's layout (``wide:``, ``cross:``)."""
    return {"wide_fields": layout.derived_fields}


def split_fields(network: str, sparse_dims: Mapping[str, int], wide_fields: Sequence[str],
                 tasks: int) -> tuple[list[str], list[str]]:
    """(the deep fields, the weight-per-id fields) of ``sparse_dims``; a weight-per-id field
    must be one weight per task wide."""
    wide = [f for f in sparse_dims if f in set(wide_fields)]
    missing = sorted(set(wide_fields) - set(wide))
    if missing:
        raise ValueError(f"{network}: option wide_fields names {missing}, not sparse fields")
    for f in wide:
        if sparse_dims[f] != tasks:
            raise ValueError(f"{network}: the weight-per-id field {f} must be {tasks} wide (one "
                             f"weight per task), got {sparse_dims[f]}")
    return [f for f in sparse_dims if f not in set(wide)], wide


class WeightsPerId(nn.Module):
    """The linear part over the ids: the sum of the weight-per-id fields' rows (each [B, T]),
    plus a weight per dense feature and a bias: ``[B, T]``."""

    def __init__(self, fields: list[str], dense_count: int, tasks: int):
        super().__init__()
        self.fields = fields
        self.dense = nn.Linear(dense_count, tasks)

    def forward(self, sparse: Mapping[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        out = self.dense(dense)
        for f in self.fields:
            out = out + sparse[f]
        return out


class WideDeep(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, hidden: list[int], tasks: int = 1,
                 wide_fields: Sequence[str] = ()):
        super().__init__()
        self.fields, wide = split_fields("wide_deep", sparse_dims, wide_fields, tasks)
        self.sequences = [f for f in sequence_fields if f in self.fields]
        self.dense_count = dense_count
        self.several = tasks > 1
        self.wide = WeightsPerId(wide, dense_count, tasks)
        self.deep = logit_mlp(sum(sparse_dims[f] for f in self.fields) + dense_count, hidden,
                              tasks)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        wide = self.wide(sparse, dense)   # (the parameters used in their modules' order)
        deep = over_fields(self.deep, sparse, dense, lengths, self.fields, self.sequences,
                           self.dense_count)
        return task_logits(wide + deep, self.several)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> WideDeep:
    opts = read_options("wide_deep", options, DEFAULTS)
    tasks = max(1, len(task_names("wide_deep", opts["tasks"])))
    return WideDeep(sparse_dims, sequence_fields, dense_count,
                    sizes("wide_deep", "hidden", opts["hidden"]), tasks,
                    field_names("wide_deep", "wide_fields", opts["wide_fields"]))


def field_names(network: str, option: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{network}: option {option} must be a list of field names, "
                         f"got {value!r}")
    return list(value)
