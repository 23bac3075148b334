"""Running a freshly built network once on a small sample batch of the job's shapes, so that a
network that cannot train is refused with one line before any process waits on it.

The sample: ``SAMPLE_ROWS`` rows of random embeddings at each field's width (a sequence field
``[rows, max_len, dim]``, zero past each row's length, its lengths 0, max_len and between) and
random dense features. The network runs in eval mode, without gradients, its training mode and
the global random state as they were after (the seeded initial weights of every process stay
the same, and so does what is drawn after them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from roles.job.fields import FieldLayout
from roles.model.networks.errors import NetworkError, describe, where_raised

SAMPLE_ROWS = 4


class MissingField(KeyError):
    """A field the network asked ``sparse`` or ``lengths`` for that the job does not give."""

    def __init__(self, where: str, field: Any):
        super().__init__(field)
        self.where, self.field = where, field


class _Inputs(dict[str, torch.Tensor]):
    """The network's ``sparse`` or ``lengths``, telling a missing field from other KeyErrors."""

    def __init__(self, where: str, tensors: dict[str, torch.Tensor]):
        super().__init__(tensors)
        self.where = where

    def __missing__(self, key: Any) -> torch.Tensor:
        raise MissingField(self.where, key)


def sample_lengths(max_len: int, rows: int) -> torch.Tensor:
    """int64 [rows]: 0, max_len, 1, max_len // 2, 0, ... (empty, full and between)."""
    pattern = [0, max_len, min(1, max_len), max_len // 2]
    return torch.tensor([pattern[r % len(pattern)] for r in range(rows)], dtype=torch.int64)


def sample_batch(layout: FieldLayout, dense_count: int, rows: int = SAMPLE_ROWS, seed: int = 0
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor]]:
    """Random ``(sparse, dense, lengths)`` of the job's shapes, drawn from a generator of its own
    (the global random state is left alone). Where a worker hands the network every field as
    a strided view of one tensor (``layout.sample_major``), so does this: a network that
    needs its inputs contiguous (``.view(-1)``) fails here, at its build, not in a worker."""
    gen = torch.Generator().manual_seed(seed)
    sequences = set(layout.sequence_fields)
    sparse: dict[str, torch.Tensor] = {}
    lengths: dict[str, torch.Tensor] = {}
    if layout.sample_major:
        joined = torch.randn(rows, len(layout.fields), layout.row_dim, generator=gen)
        sparse = dict(zip(layout.fields, joined.unbind(1), strict=True))
        return sparse, torch.randn(rows, dense_count, generator=gen), lengths
    for f, dim, width in zip(layout.fields, layout.dims, layout.widths, strict=True):
        if f in sequences:
            n = sample_lengths(width, rows)
            mask = torch.arange(width).unsqueeze(0) < n.unsqueeze(1)
            sparse[f] = torch.randn(rows, width, dim, generator=gen) * mask.unsqueeze(2)
            lengths[f] = n
        else:
            sparse[f] = torch.randn(rows, dim, generator=gen)
    return sparse, torch.randn(rows, dense_count, generator=gen), lengths


def _missing(exc: MissingField, layout: FieldLayout, label: str, source_file: Path | None
             ) -> NetworkError:
    at = where_raised(exc, source_file)
    where = f" (at {at})" if at else ""
    sequences = layout.sequence_fields
    if exc.where == "lengths" and exc.field in layout.fields:
        return NetworkError(
            f"{label}: forward asks for lengths[{exc.field!r}]{where}, but {exc.field} is not a "
            f"sequence field (the job's: {', '.join(sequences) or 'none'}; "
            f"[model.pooling] {exc.field} = \"none\" makes a list field one)")
    return NetworkError(f"{label}: forward asks for {exc.where}[{exc.field!r}]{where}, a field "
                        f"this job lacks (its sparse fields: {', '.join(layout.fields)})")


def check_network(net: Any, layout: FieldLayout, dense_count: int, label: str,
                  source_file: Path | None = None, *, tasks: int = 1) -> None:
    """Refuse (``NetworkError``, naming ``label``: the built-in or the user's file) a network
    that is no ``torch.nn.Module``, whose forward raises on the sample batch, asks for a field
    the job lacks, or returns anything but finite float logits of shape ``[batch]`` (one task)
    or ``[batch, tasks]`` (several, ``[data] labels``)."""
    if not isinstance(net, nn.Module):
        raise NetworkError(f"{label}: the factory returned {type(net).__name__}, not a "
                           "torch.nn.Module")
    expected = "[batch]" if tasks == 1 else f"[batch, {tasks}]"
    sparse, dense, lengths = sample_batch(layout, dense_count)
    rows = len(dense)
    training = net.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            net.eval()
            out = net(_Inputs("sparse", sparse), dense, _Inputs("lengths", lengths))
    except MissingField as exc:
        raise _missing(exc, layout, label, source_file) from exc
    except Exception as exc:
        raise NetworkError(f"{label}: forward raised {describe(exc, source_file)} on a sample "
                           f"batch of {rows} rows") from exc
    finally:
        net.train(training)
    if not isinstance(out, torch.Tensor):
        raise NetworkError(f"{label}: forward returns {type(out).__name__}, not a tensor of "
                           f"logits of shape {expected}")
    shape = list(out.shape)
    if tasks == 1 and shape != [rows]:
        hint = " (e.g. .squeeze(1))" if shape == [rows, 1] else ""
        raise NetworkError(f"{label}: forward returns shape {shape} for a batch of {rows}; "
                           f"return logits of shape [batch]{hint}")
    if tasks > 1 and shape != [rows, tasks]:
        raise NetworkError(f"{label}: forward returns shape {shape} for a batch of {rows} and "
                           f"{tasks} labels; return logits of shape [batch, {tasks}] (a column "
                           "per label of [data] labels, in order)")
    if not out.dtype.is_floating_point:
        raise NetworkError(f"{label}: forward returns {out.dtype}; logits must be floating "
                           "point")
    if not bool(torch.isfinite(out).all()):
        raise NetworkError(f"{label}: forward returns non-finite logits (nan or inf) on a "
                           f"sample batch of {rows} rows")
