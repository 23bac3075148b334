"""``din``: Deep Interest Network (Zhou et al., 2018). A candidate field's vector q attends over
a sequence field's vectors k_1..k_L: an attention unit (ReLU layers of ``attention_hidden``,
then a linear to 1) scores each position from [q, k, q - k, q * k]; positions past the row's
length get no weight; the interest vector is sum(weight * k), unnormalised as in DIN (an empty
sequence gives 0). The interest vector takes the sequence field's place among the field
vectors (other sequence fields mean-pooled), and they and the dense features go through ReLU
layers of ``hidden`` to one logit per task (the attention unit's score stays one).

Options: ``hidden`` (default ``[model] hidden``), ``attention_hidden`` (default ``[36]``),
``candidate`` (a single-valued or pooled field; default the first such field, and in a job the
single-valued field of the sequence's table: ``layout_defaults``), ``sequence`` (a sequence
field; default the first). The candidate and the sequence must have the same width (typically
they share a table: ``[data.tables] item = ["item", "history"]``). ``tasks``: the job's labels
when it has several (one logit each, ``[B, T]``, from one linear head per task).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from roles.job.fields import FieldLayout
from roles.model.networks.layers import (
    lengths_mask,
    logit_mlp,
    masked_mean,
    read_options,
    sizes,
    task_logits,
    task_names,
)

DEFAULTS: dict[str, Any] = {"hidden": [128, 64], "attention_hidden": [36], "candidate": None,
                            "sequence": None, "tasks": []}


class Din(nn.Module):
    def __init__(self, sparse_dims: dict[str, int], sequence_fields: list[str],
                 dense_count: int, candidate: str, sequence: str, attention_hidden: list[int],
                 hidden: list[int], tasks: int = 1):
        super().__init__()
        self.fields = list(sparse_dims)
        self.sequences = list(sequence_fields)
        self.candidate, self.sequence = candidate, sequence
        self.several = tasks > 1
        self.attention = logit_mlp(4 * sparse_dims[sequence], attention_hidden)
        self.mlp = logit_mlp(sum(sparse_dims.values()) + dense_count, hidden, tasks)

    def interest(self, query: torch.Tensor, keys: torch.Tensor,
                 lengths: torch.Tensor) -> torch.Tensor:
        """[B, dim] from the candidate [B, dim] over the sequence [B, L, dim]."""
        mask = lengths_mask(lengths, keys)                              # [B, L]
        keys = keys * mask.unsqueeze(2)
        q = query.unsqueeze(1).expand_as(keys)
        weights = self.attention(torch.cat([q, keys, q - keys, q * keys], dim=2)).squeeze(2)
        return ((weights * mask).unsqueeze(2) * keys).sum(1)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                lengths: dict[str, torch.Tensor]) -> torch.Tensor:
        vectors = []
        for f in self.fields:
            if f == self.sequence:
                vectors.append(self.interest(sparse[self.candidate], sparse[f], lengths[f]))
            elif f in self.sequences:
                vectors.append(masked_mean(sparse[f], lengths[f]))
            else:
                vectors.append(sparse[f])
        return task_logits(self.mlp(torch.cat([*vectors, dense], dim=1)), self.several)


def layout_defaults(layout: FieldLayout, options: dict[str, Any]) -> dict[str, Any]:
    """The defaults a job's layout gives beyond what ``build`` sees: the candidate is the
    single-valued field that looks up the sequence's table (the item beside the items clicked
    before), when one does."""
    sequences = layout.sequence_fields
    seq = options.get("sequence")
    seq = seq if seq in sequences else (sequences[0] if sequences else None)
    if seq is None:
        return {}
    table = layout.tables[layout.fields.index(seq)]
    candidate = next((f for i, f in enumerate(layout.fields)
                      if not layout.is_list(i) and layout.tables[i] == table), None)
    return {} if candidate is None else {"candidate": candidate}


def _field(value: Any, name: str, allowed: list[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"din: option {name} must name {what} "
                         f"({', '.join(allowed) or 'the job has none'}), got {value!r}")
    return str(value)


def build(sparse_dims: dict[str, int], sequence_fields: list[str], dense_count: int,
          options: dict[str, Any]) -> Din:
    opts = read_options("din", options, DEFAULTS)
    if not sequence_fields:
        raise ValueError("din needs a sequence field ([model.pooling] <field> = \"none\")")
    singles = [f for f in sparse_dims if f not in sequence_fields]
    candidate = _field(singles[0] if opts["candidate"] is None and singles
                       else opts["candidate"], "candidate", singles,
                       "a single-valued or pooled field")
    sequence = _field(sequence_fields[0] if opts["sequence"] is None else opts["sequence"],
                      "sequence", list(sequence_fields), "a sequence field")
    if sparse_dims[candidate] != sparse_dims[sequence]:
        raise ValueError(f"din: the candidate {candidate} (width {sparse_dims[candidate]}) "
                         f"and the sequence {sequence} (width {sparse_dims[sequence]}) need "
                         "one width (share a table, [data.tables])")
    return Din(sparse_dims, sequence_fields, dense_count, candidate, sequence,
               sizes("din", "attention_hidden", opts["attention_hidden"]),
               sizes("din", "hidden", opts["hidden"]),
               max(1, len(task_names("din", opts["tasks"]))))
