"""``mmoe``: Multi-gate Mixture-of-Experts (Ma et al., 2018, KDD, "Modeling Task Relationships
in Multi-task Learning with Multi-gate Mixture-of-Experts"). The input is every field's vector
(a sequence field mean-pooled) and the dense features, concatenated; ``experts`` expert MLPs
(ReLU layers of ``expert``) read it; each task has a gate, a linear from the input to the
expert count, whose softmax weighs the experts' outputs; the weighted sum goes through the
task's tower (ReLU layers of ``tower``, then a linear to one logit): ``[B, T]``, column t the
t-th label of ``[data] labels``.

Options: ``experts`` (default 4), ``expert`` (each expert's layers, default ``[128, 64]``, at
least one), ``tower`` (default ``[32]``), ``hidden`` (given to every network; not used),
``tasks`` (the job's labels, two or more).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.model.networks.layers import (
    count,
    field_input,
    gated_sum,
    logit_mlp,
    read_options,
    relu_layers,
    several_tasks,
    sizes,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "experts": 4, "expert": [128, 64],
                            "tower": [32], "tasks": []}


def expert_sizes(network: str, value: Any) -> list[int]:
    """Option ``expert``: an expert's layer sizes, at least one."""
    layers = sizes(network, "expert", value)
    if not layers:
        raise ValueError(f"{network}: option expert must name at least one layer, got []")
    return layers


class Mmoe(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, experts: int, expert: list[int], tower: list[int],
                 tasks: int):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        width = sum(sparse_dims.values()) + dense_count
        self.experts = nn.ModuleList(nn.Sequential(*relu_layers(width, expert)[0])
                                     for _ in range(experts))
        self.gates = nn.ModuleList(nn.Linear(width, experts) for _ in range(tasks))
        self.towers = nn.ModuleList(logit_mlp(expert[-1], tower) for _ in range(tasks))

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x = field_input(sparse, dense, lengths, self.fields, self.sequences)
        outputs = [expert(x) for expert in self.experts]
        return torch.cat([tower(gated_sum(gate(x), outputs))
                          for gate, tower in zip(self.gates, self.towers, strict=True)], dim=1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> Mmoe:
    opts = read_options("mmoe", options, DEFAULTS)
    tasks = several_tasks("mmoe", opts["tasks"])
    return Mmoe(sparse_dims, sequence_fields, dense_count,
                count("mmoe", "experts", opts["experts"], 1), expert_sizes("mmoe", opts["expert"]),
                sizes("mmoe", "tower", opts["tower"]), len(tasks))
