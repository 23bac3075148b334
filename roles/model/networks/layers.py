"""What the built-in networks share: ReLU towers, sequence masks and mean pooling (written
without Python branching on tensor values, so that torch.fx traces them), one logit per task
(option ``tasks``: the job's labels when it has several, ``[data] labels``), and the reading of
``[model.options]`` (an unknown name or a value of the wrong kind is a ValueError that names
the network, the option and what it takes)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

# -- layers ------------------------------------------------------------------------------------


def relu_layers(width: int, sizes: Sequence[int]) -> tuple[list[nn.Module], int]:
    """Linear + ReLU for each size, and the width that comes out."""
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return layers, width


def logit_mlp(width: int, hidden: Sequence[int], outputs: int = 1) -> nn.Sequential:
    """The ``hidden`` ReLU layers, then a linear to ``outputs`` logits (``[B, outputs]``)."""
    layers, width = relu_layers(width, hidden)
    return nn.Sequential(*layers, nn.Linear(width, outputs))


def task_logits(out: torch.Tensor, several: bool) -> torch.Tensor:
    """The contract's logits from ``[B, T]``: as they are for several tasks, ``[B]`` for one.
    ``several`` is fixed when the network is built (no branching on tensor values)."""
    return out if several else out.squeeze(1)


class JoinedFields(dict):
    """The ``sparse`` dict of the network contract, as a worker (and the references) give it
    when every field is single-valued at the full row width: ``joined`` is [B, sum of the
    widths], the fields' vectors side by side in ``fields`` order, each ``self[f]`` a view of
    it. A network may read ``joined`` where it would concatenate the fields (``joined_of``),
    and so skip a copy of the batch's grid in its forward and another in its backward."""

    __slots__ = ("fields", "joined")

    def __init__(self, values: Mapping[str, torch.Tensor], joined: torch.Tensor):
        super().__init__(values)
        self.fields = list(values)
        self.joined = joined


def joined_of(sparse: Mapping[str, torch.Tensor], fields: Sequence[str]) -> torch.Tensor | None:
    """``sparse.joined`` when it is ``fields``' vectors side by side, in that order; else None
    (a plain dict: a user's own inputs, the build's check, torch.fx's tracing)."""
    if isinstance(sparse, JoinedFields) and sparse.fields == list(fields):
        return sparse.joined
    return None


def mlp_over(mlp: nn.Sequential, x: torch.Tensor, dense: torch.Tensor,
             dense_count: int) -> torch.Tensor:
    """``mlp`` over ``[x | dense]`` without joining the two (``x``: ``JoinedFields.joined``,
    the batch's grid as it is): its first linear as two products on its weight's columns,
    then its other layers, each ReLU overwriting its input (the output of a linear this
    forward made). Not for torch.fx: it would trace the products as functions on slices of a
    weight, which model parallelism neither costs nor places as the layers, and a cut before
    an in-place ReLU would hand a stage a leaf. MlpNet on a Criteo batch, forward and
    backward on one thread: 11.4 against 12.9 ms for the concatenation and the layers, the
    same results to float32 rounding (the first product is summed in two parts)."""
    first = mlp[0]
    assert isinstance(first, nn.Linear), "a logit_mlp begins with a linear"
    width = first.in_features - dense_count
    if dense_count:   # the dense features' product and the bias, added to in the fields'
        h = torch.addmm(functional.linear(dense, first.weight[:, width:], first.bias), x,
                        first.weight[:, :width].t())
    else:
        h = functional.linear(x, first.weight, first.bias)
    for layer in itertools.islice(mlp, 1, None):
        h = torch.relu_(h) if isinstance(layer, nn.ReLU) else layer(h)
    return h


def field_input(sparse: Mapping[str, torch.Tensor], dense: torch.Tensor,
                lengths: Mapping[str, torch.Tensor], fields: Sequence[str],
                sequences: Sequence[str]) -> torch.Tensor:
    """Every field's vector (a sequence field mean-pooled), then the dense features, side by
    side: ``[B, sum of the widths + dense_count]``."""
    return torch.cat([*field_vectors(sparse, lengths, fields, sequences), dense], dim=1)


def over_fields(mlp: nn.Sequential, sparse: Mapping[str, torch.Tensor], dense: torch.Tensor,
                lengths: Mapping[str, torch.Tensor], fields: Sequence[str],
                sequences: Sequence[str], dense_count: int) -> torch.Tensor:
    """``mlp`` (linears and ReLUs) over ``field_input``: on the worker's joined grid as it is
    (``mlp_over``) where there is one and ``mlp`` begins with a linear, else on the
    concatenation."""
    x = None if sequences or not len(mlp) or not isinstance(mlp[0], nn.Linear) \
        else joined_of(sparse, fields)
    if x is not None:   # the worker's grid as it is: no copy in, none of the gradient out
        return mlp_over(mlp, x, dense, dense_count)
    return mlp(field_input(sparse, dense, lengths, fields, sequences))


def gated_sum(gate: torch.Tensor, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The experts' ``outputs`` (each ``[B, d]``) weighted by the softmax of ``gate``'s logits
    (``[B, len(outputs)]``) and summed: ``[B, d]`` (a mixture of experts' gate)."""
    weights = torch.softmax(gate, dim=1).unsqueeze(1)                   # [B, 1, n]
    return torch.bmm(weights, torch.stack(list(outputs), dim=1)).squeeze(1)


def lengths_mask(lengths: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` in ``sequence``'s dtype: 1 where a position of ``sequence`` (``[B, L, dim]``)
    holds an id (position < its row's length), 0 past it. Float from the first step: in a
    traced graph the only integer value is ``lengths`` itself, and there are no ``shape`` or
    ``device`` values (a cut between two members carries float tensors only)."""
    n = lengths.type_as(sequence).unsqueeze(1)
    positions = torch.ones_like(sequence[:, :, 0]).cumsum(1) - 1     # 0, 1, ..., L - 1
    return (n - positions).clamp(0, 1)


def masked_mean(sequence: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The mean over each row's first ``lengths`` positions of ``[B, L, dim]``: ``[B, dim]``,
    0 for an empty sequence; what lies past a row's length counts for nothing."""
    total = (sequence * lengths_mask(lengths, sequence).unsqueeze(2)).sum(1)
    return total / lengths.type_as(sequence).clamp(min=1).unsqueeze(1)


def field_vectors(sparse: Mapping[str, torch.Tensor], lengths: Mapping[str, torch.Tensor],
                  fields: Sequence[str], sequences: Sequence[str]) -> list[torch.Tensor]:
    """One ``[B, dim_f]`` vector per field, in field order: a sequence field mean-pooled."""
    return [masked_mean(sparse[f], lengths[f]) if f in sequences else sparse[f]
            for f in fields]


# -- options -----------------------------------------------------------------------------------


def read_options(network: str, given: Mapping[str, Any],
                 defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by ``given``; a name ``defaults`` lacks is refused."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"{network}: unknown option {unknown[0]!r} in [model.options] "
                         f"({network} knows {', '.join(sorted(defaults))})")
    return {**defaults, **given}


def sizes(network: str, name: str, value: Any) -> list[int]:
    """A list of layer sizes, each >= 1 (may be empty)."""
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ValueError(f"{network}: option {name} must be a list of layer sizes >= 1, "
                         f"got {value!r}")
    return list(value)


def task_names(network: str, value: Any) -> list[str]:
    """Option ``tasks``: the label names, one logit each (empty or one name: one task)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{network}: option tasks must be a list of label names, got {value!r}")
    return list(value)


def several_tasks(network: str, value: Any) -> list[str]:
    """Option ``tasks`` of a network that trains several labels: two names or more."""
    tasks = task_names(network, value)
    if len(tasks) < 2:
        raise ValueError(f"{network} trains several labels: set [data] labels")
    return tasks


def count(network: str, name: str, value: Any, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{network}: option {name} must be an integer >= {least}, "
                         f"got {value!r}")
    return value


def choice(network: str, name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{network}: option {name} must be one of "
                         f"{', '.join(map(repr, choices))}, got {value!r}")
    return str(value)


def one_width(network: str, sparse_dims: Mapping[str, int]) -> int:
    """The embedding width every field shares; a job whose tables differ is refused."""
    widths = sorted(set(sparse_dims.values()))
    if len(widths) != 1:
        by_width = "; ".join(
            f"{w}: {', '.join(f for f, d in sparse_dims.items() if d == w)}" for w in widths)
        raise ValueError(f"{network} needs one embedding width for every table, got {by_width} "
                         "([model] embedding_dim, [model.dims])")
    return widths[0]
