"""From a batch's grid of embedding rows to what the network receives (torch; no sockets).

A worker puts each shard's rows at their grid positions (``roles.job.fields``: field-major,
a field's run of occurrences between two bounds), giving ``flat`` [grid, row_dim]. Where every
field is single-valued at the full row width (Criteo's layout), the worker lays the grid out
sample by sample instead (``sample_order``): ``flat`` viewed as [B, fields x row_dim] is then
every field's vector side by side, which the network gets as ``JoinedFields`` beside the
fields' views, and the MLP reads without a copy. Otherwise each field reads its run at its
own width: a single-valued field is its run ([B, dim]); a pooled list
field is the mean (or sum) of each sample's ids ([B, dim]; an empty list is zeros); a sequence
is its samples' ids in order, zero padded to ``max_len`` ([B, max_len, dim]) with its lengths
([B], int64). Every step is differentiable, so ``flat.grad`` after the backward pass holds each
occurrence's gradient, which the worker sums per row for the shards.

The index arithmetic (which sample and which place each occurrence has) is done once per batch
with numpy, vectorised, from the batch's lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roles.job.fields import FieldLayout
from roles.model.networks.layers import JoinedFields


@dataclass(frozen=True)
class FieldRun:
    start: int
    stop: int
    rows: torch.Tensor | None = None     # list fields: each occurrence's sample
    places: torch.Tensor | None = None   # sequences: each occurrence's place in its sample's
    lengths: torch.Tensor | None = None  # list fields: ids per sample (int64 [B])


class SparseInputs:
    def __init__(self, layout: FieldLayout, device: torch.device):
        self.layout, self.device = layout, device
        self.lists = [f for f in range(len(layout.fields)) if layout.is_list(f)]

    @property
    def sample_major(self) -> bool:
        """The grid is laid out sample by sample (``FieldLayout.sample_major``)."""
        return self.layout.sample_major

    def sample_order(self, grid: np.ndarray, samples: int) -> np.ndarray:
        """A field-major grid (the protocol's positions; a value, or a row, per position) in
        the order ``inputs`` reads the grid: sample by sample where ``sample_major``, else as
        it is."""
        if not self.sample_major:
            return grid
        fields = len(self.layout.fields)
        return np.ascontiguousarray(grid.reshape(fields, samples, *grid.shape[1:])
                                    .swapaxes(0, 1)).reshape(grid.shape)

    def grid_size(self, samples: int, lengths: np.ndarray) -> int:
        return self.layout.bounds(samples, lengths)[-1]

    def check_lengths(self, lengths: np.ndarray) -> str | None:
        """What is wrong with a batch's lengths for this job (None: nothing)."""
        if lengths.ndim != 2 or lengths.shape[1] != len(self.lists):
            return (f"lengths for {lengths.shape[1] if lengths.ndim == 2 else '?'} list "
                    f"field(s), the job has {len(self.lists)}")
        for j, f in enumerate(self.lists):
            if lengths.size and int(lengths[:, j].max()) > self.layout.widths[f]:
                return (f"a list of {int(lengths[:, j].max())} ids in field "
                        f"{self.layout.fields[f]!r}, whose max_len is {self.layout.widths[f]}")
        return None

    def runs(self, samples: int, lengths: np.ndarray) -> list[FieldRun]:
        """Each field's run of the grid, and for list fields where each occurrence goes."""
        bounds = self.layout.bounds(samples, lengths)
        out, j = [], 0
        for f in range(len(self.layout.fields)):
            start, stop = bounds[f], bounds[f + 1]
            if not self.layout.is_list(f):
                out.append(FieldRun(start, stop))
                continue
            counts = lengths[:, j].astype(np.int64)
            j += 1
            rows = np.repeat(np.arange(samples, dtype=np.int64), counts)
            places = np.arange(len(rows), dtype=np.int64) - np.repeat(
                np.cumsum(counts) - counts, counts)
            out.append(FieldRun(start, stop, self._tensor(rows), self._tensor(places),
                                self._tensor(counts)))
        return out

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def inputs(self, flat: torch.Tensor, samples: int, lengths: np.ndarray
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(sparse, lengths) as the network contract has them, from ``flat`` [grid, row_dim]
        (sample by sample where ``sample_major``: ``sample_order``)."""
        layout = self.layout
        if self.sample_major:
            joined = flat.view(samples, len(layout.fields) * layout.row_dim)
            # one unbind: its backward, if a network reads the fields, is one stack
            views = joined.view(samples, len(layout.fields), layout.row_dim).unbind(1)
            return JoinedFields(dict(zip(layout.fields, views, strict=True)), joined), {}
        tensors: dict[int, torch.Tensor] = {}
        seq_lengths: dict[str, torch.Tensor] = {}
        runs = self.runs(samples, lengths)
        # one split into the fields' runs: its backward is one concatenation (a slice per
        # field would write a zero gradient the size of the whole grid for each field)
        pieces = flat.split([run.stop - run.start for run in runs])
        for f, (run, piece) in enumerate(zip(runs, pieces, strict=True)):
            name, dim = layout.fields[f], layout.dims[f]
            values = piece if dim == layout.row_dim else piece[:, :dim]
            if run.rows is None:
                tensors[f] = values
                continue
            assert run.places is not None and run.lengths is not None
            if layout.pooling[f] == "none":
                padded = torch.zeros((samples, layout.widths[f], dim), dtype=flat.dtype,
                                     device=flat.device)
                tensors[f] = padded.index_put((run.rows, run.places), values)
                seq_lengths[name] = run.lengths
                continue
            pooled = torch.zeros((samples, dim), dtype=flat.dtype, device=flat.device)
            pooled = pooled.index_add(0, run.rows, values)
            if layout.pooling[f] == "mean":
                pooled = pooled / run.lengths.clamp(min=1).unsqueeze(1).to(flat.dtype)
            tensors[f] = pooled
        return {name: tensors[f] for f, name in enumerate(layout.fields)}, seq_lengths
