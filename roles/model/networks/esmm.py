"""``esmm``: Entire Space Multi-task Model (Ma et al., 2018, SIGIR, "Entire Space Multi-Task
Model: An Effective Approach for Estimating Post-Click Conversion Rate"). Two towers (ReLU
layers of ``tower``, then a linear to one logit) read the same input, every field's vector (a
sequence field mean-pooled) and the dense features concatenated: one gives pCTR, the other
pCVR. Both are trained over every impression through what is observed there: the click, whose
logit is pCTR's, and the conversion after a click, whose probability is pCTCVR = pCTR · pCVR.
The network returns ``[B, 2]``: the logit of pCTR in the column of ``chain[0]`` and the logit of
pCTCVR in that of ``chain[1]`` (columns in ``[data] labels`` order).

The logit of a product of probabilities, stably: log p = logsigmoid(a) + logsigmoid(b), and
logit p = log p - log(1 - p) = log p - log(-expm1(log p)), with log p kept below 0 by the
smallest float32 (so that a logit stays finite, at most about 87, where p rounds to 1). It runs
in float32 under bf16 autocast too.

Options: ``chain`` (the click's label then the conversion's, default the tasks in order; a
permutation of them), ``tower`` (default ``[128, 64]``), ``hidden`` (given to every network;
not used), ``tasks`` (the job's labels: exactly two).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from roles.model.networks.layers import (
    field_input,
    logit_mlp,
    read_options,
    several_tasks,
    sizes,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "chain": None, "tower": [128, 64], "tasks": []}
TINY = float(torch.finfo(torch.float32).tiny)


def product_logit(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The logit of sigmoid(a) · sigmoid(b), finite for any finite ``a`` and ``b``."""
    log_p = (functional.logsigmoid(a) + functional.logsigmoid(b)).clamp(max=-TINY)
    return log_p - torch.log(-torch.expm1(log_p))


class Esmm(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, tower: list[int], ctr_first: bool):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.ctr_first = ctr_first
        width = sum(sparse_dims.values()) + dense_count
        self.ctr = logit_mlp(width, tower)
        self.cvr = logit_mlp(width, tower)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x = field_input(sparse, dense, lengths, self.fields, self.sequences)
        ctr = self.ctr(x).float()                                      # [B, 1]
        ctcvr = product_logit(ctr, self.cvr(x).float())
        if self.ctr_first:   # fixed when built
            return torch.cat([ctr, ctcvr], dim=1)
        return torch.cat([ctcvr, ctr], dim=1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> Esmm:
    opts = read_options("esmm", options, DEFAULTS)
    tasks = several_tasks("esmm", opts["tasks"])
    if len(tasks) != 2:
        raise ValueError(f"esmm trains exactly two labels (a click, then a conversion), "
                         f"got {len(tasks)}: {', '.join(tasks)}")
    chain = tasks if opts["chain"] is None else opts["chain"]
    if not (isinstance(chain, list) and all(isinstance(c, str) for c in chain)
            and sorted(chain) == sorted(tasks)):
        raise ValueError(f"esmm: option chain must name the click's label then the "
                         f"conversion's, a permutation of {tasks!r}, got {chain!r}")
    return Esmm(sparse_dims, sequence_fields, dense_count, sizes("esmm", "tower", opts["tower"]),
                ctr_first=chain[0] == tasks[0])
