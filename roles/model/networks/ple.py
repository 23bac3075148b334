"""``ple``: Progressive Layered Extraction (Tang et al., 2020, RecSys, "Progressive Layered
Extraction (PLE): A Novel Multi-Task Learning (MTL) Model for Personalized Recommendations").
The input is every field's vector (a sequence field mean-pooled) and the dense features,
concatenated. ``levels`` extraction layers follow one another; each has ``shared_experts``
shared experts and ``task_experts`` experts of each task (ReLU layers of ``expert``). At a
level, a task's experts read the task's input (the level's output for it below; the input at
the first level), the shared experts the shared input; each task's gate (a linear from its
input, softmax) mixes its own experts and the shared ones into its output, and, in every level
but the last, the shared gate mixes all the level's experts into the shared output. Each task's
last output goes through its tower (ReLU layers of ``tower``, then a linear to one logit):
``[B, T]``, column t the t-th label of ``[data] labels``.

Options: ``levels`` (default 2), ``shared_experts`` (default 2), ``task_experts`` (default 2),
``expert`` (each expert's layers, default ``[64]``, at least one), ``tower`` (default
``[32]``), ``hidden`` (given to every network; not used), ``tasks`` (the job's labels, two or
more).
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
from roles.model.networks.mmoe import expert_sizes

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "levels": 2, "shared_experts": 2,
                            "task_experts": 2, "expert": [64], "tower": [32], "tasks": []}


def _experts(width: int, expert: list[int], n: int) -> nn.ModuleList:
    return nn.ModuleList(nn.Sequential(*relu_layers(width, expert)[0]) for _ in range(n))


class Extraction(nn.Module):
    """One level: the tasks' inputs then the shared input in, the tasks' outputs then (but at
    the last level) the shared output out, each ``[B, expert[-1]]``."""

    def __init__(self, width: int, expert: list[int], tasks: int, task_experts: int,
                 shared_experts: int, last: bool):
        super().__init__()
        self.per_task = task_experts
        self.task_experts = _experts(width, expert, tasks * task_experts)   # task by task
        self.shared_experts = _experts(width, expert, shared_experts)
        self.task_gates = nn.ModuleList(nn.Linear(width, task_experts + shared_experts)
                                        for _ in range(tasks))
        self.shared_gate = None if last else nn.Linear(width, tasks * task_experts
                                                       + shared_experts)

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        *task_inputs, shared_input = inputs
        shared = [e(shared_input) for e in self.shared_experts]
        k = self.per_task
        own = [e(task_inputs[i // k]) for i, e in enumerate(self.task_experts)]
        out = [gated_sum(gate(x), [*own[t * k:(t + 1) * k], *shared])
               for t, (gate, x) in enumerate(zip(self.task_gates, task_inputs, strict=True))]
        if self.shared_gate is not None:   # fixed when built: every level but the last
            out.append(gated_sum(self.shared_gate(shared_input), [*own, *shared]))
        return out


class Ple(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, levels: int, shared_experts: int, task_experts: int,
                 expert: list[int], tower: list[int], tasks: int):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.tasks = tasks
        width = sum(sparse_dims.values()) + dense_count
        self.levels = nn.ModuleList(
            Extraction(width if level == 0 else expert[-1], expert, tasks, task_experts,
                       shared_experts, last=level == levels - 1) for level in range(levels))
        self.towers = nn.ModuleList(logit_mlp(expert[-1], tower) for _ in range(tasks))

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        x = field_input(sparse, dense, lengths, self.fields, self.sequences)
        inputs = [x] * (self.tasks + 1)
        for level in self.levels:
            inputs = level(inputs)
        return torch.cat([tower(h) for tower, h in zip(self.towers, inputs, strict=True)], dim=1)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> Ple:
    opts = read_options("ple", options, DEFAULTS)
    tasks = several_tasks("ple", opts["tasks"])
    return Ple(sparse_dims, sequence_fields, dense_count,
               count("ple", "levels", opts["levels"], 1),
               count("ple", "shared_experts", opts["shared_experts"], 1),
               count("ple", "task_experts", opts["task_experts"], 1),
               expert_sizes("ple", opts["expert"]), sizes("ple", "tower", opts["tower"]),
               len(tasks))
