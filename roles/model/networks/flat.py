"""A network with positional tensor inputs, for torch.fx: model parallelism traces the network
(``roles.model.graph``), and a traced graph's inputs are placeholders, one per argument of
``forward``, where the contract's forward takes two dicts.

``FlatInputs(net, fields, sequence_fields)`` takes one tensor per sparse field (in field order),
then the dense features, then one lengths tensor per sequence field, and calls ``net`` with the
dicts. Its forward has a real signature, ``forward(self, s0, .., s{F-1}, dense, l0, ..)``, so
``fx.symbolic_trace`` makes exactly those placeholders: the signature is generated once per
(fields, sequence fields) count, as a subclass of ``FlatInputs`` (the names are made of counts
only, nothing of the job's text reaches the generated source). ``net`` is its only submodule,
named ``net``: its parameters are ``net.<name>``, in ``net.parameters()`` order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from roles.job.fields import FieldLayout


def input_names(fields: int, sequences: int) -> list[str]:
    """The placeholders, in order: ``s0..``, ``dense``, ``l0..``."""
    return [f"s{i}" for i in range(fields)] + ["dense"] + [f"l{i}" for i in range(sequences)]


class FlatInputs(nn.Module):
    """``net`` called with positional tensors (see the module's docstring)."""

    def __init__(self, net: nn.Module, fields: Sequence[str], sequence_fields: Sequence[str]):
        super().__init__()
        self.net = net
        self.fields = tuple(fields)
        self.sequence_fields = tuple(sequence_fields)
        self.__class__ = _with_signature(len(self.fields), len(self.sequence_fields))

    def call(self, sparse: tuple[torch.Tensor, ...], dense: torch.Tensor,
             lengths: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """What every generated forward does: the dicts of the contract, then ``net``."""
        return self.net(dict(zip(self.fields, sparse, strict=True)), dense,
                        dict(zip(self.sequence_fields, lengths, strict=True)))


@functools.cache
def _with_signature(fields: int, sequences: int) -> type[FlatInputs]:
    """The subclass of ``FlatInputs`` whose forward takes ``input_names(fields, sequences)``."""
    names = input_names(fields, sequences)
    sparse = "".join(f"{n}, " for n in names[:fields])
    lengths = "".join(f"{n}, " for n in names[fields + 1:])
    source = (f"def forward(self, {', '.join(names)}):\n"
              f"    return self.call(({sparse}), dense, ({lengths}))\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<FlatInputs forward of {fields} fields, {sequences} sequences>",
                 "exec"), namespace)
    return type(FlatInputs.__name__, (FlatInputs,), {"forward": namespace["forward"],
                                                     "__module__": __name__})


def example_inputs(layout: FieldLayout, dense_count: int, rows: int
                   ) -> tuple[torch.Tensor, ...]:
    """Zero inputs of ``rows`` rows in ``FlatInputs``' order, every sequence full
    (lengths = max_len)."""
    sequences = layout.sequence_fields
    sparse = [torch.zeros(rows, width, dim) if f in sequences else torch.zeros(rows, dim)
              for f, dim, width in zip(layout.fields, layout.dims, layout.widths, strict=True)]
    lengths = [torch.full((rows,), layout.widths[layout.fields.index(f)], dtype=torch.int64)
               for f in sequences]
    return (*sparse, torch.zeros(rows, dense_count), *lengths)
