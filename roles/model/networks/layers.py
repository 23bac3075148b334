"""What the built-in networks share: ReLU towers, sequence masks and mean pooling (written
without Python branching on tensor values, so that torch.fx traces them), and the reading of
``[model.options]`` (an unknown name or a value of the wrong kind is a ValueError that names
the network, the option and what it takes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

# -- layers ------------------------------------------------------------------------------------


def relu_layers(width: int, sizes: Sequence[int]) -> tuple[list[nn.Module], int]:
    """Linear + ReLU for each size, and the width that comes out."""
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return layers, width


def logit_mlp(width: int, hidden: Sequence[int]) -> nn.Sequential:
    """The ``hidden`` ReLU layers, then a linear to one logit (``[B, 1]``)."""
    layers, width = relu_layers(width, hidden)
    return nn.Sequential(*layers, nn.Linear(width, 1))


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
