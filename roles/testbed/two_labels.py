"""A CSV file of the built-in generator's rows with two labels that form a chain, as
impressions, clicks and purchases do (``roles.data.synthetic``'s ``conversion``: ``click`` from
the planted model, ``purchase`` 1 only on a clicked row, with a probability given the click from
a second planted model over the same values). ``masked`` of the rows leave ``purchase`` empty
(unknown: that task is masked for the row). Written block by block (bounded memory).
``write_two_labels`` returns each task's oracle AUC over the last ``eval_fraction`` of the rows:
the true probabilities' (click: p(click); purchase: p(click)·p(purchase | click), over every
impression with a purchase value)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as csv

from roles.algorithms.shared.metrics import auc
from roles.data.synthetic import BLOCK_ROWS, Generator


def write_two_labels(out: Path | str, rows: int, *, seed: int = 1,
                     vocab: tuple[int, ...] = (1000, 300, 50, 20000), dense: int = 2,
                     signal: float = 0.8, masked: float = 0.05,
                     eval_fraction: float = 0.2) -> dict[str, float]:
    """``rows`` rows to ``out`` (columns ``click``, ``purchase``, ``c0``.., ``d0``..); each
    task's oracle AUC over the eval rows (the last ``eval_fraction``)."""
    gen = Generator(rows, list(vocab), dense, 1.1, signal, 7, seed, missing=0.02,
                    conversion=True)
    rng = np.random.default_rng([seed, 2])
    first_eval = int(rows * (1 - eval_fraction))
    oracle: dict[str, list[np.ndarray]] = {k: [] for k in ("click", "purchase", "p_click",
                                                          "p_purchase")}
    options = csv.WriteOptions(include_header=True)
    with open(out, "wb") as sink:
        writer = None
        for b in range(-(-rows // BLOCK_ROWS)):
            block = gen.block(b)
            values, n = block.values, len(block.values)
            click, purchase = block.labels[:, 0], block.labels[:, 1]
            hidden = rng.random(n) < masked
            columns = {"click": pa.array(click.astype(np.int8)),
                       "purchase": pa.array(purchase.astype(np.int8), mask=hidden)}
            for f in range(values.shape[1]):
                ids = values[:, f]
                columns[f"c{f}"] = pa.array(ids, mask=ids < 0).cast(pa.string())
            for j in range(block.dense.shape[1]):
                col = block.dense[:, j]
                columns[f"d{j}"] = pa.array(np.nan_to_num(col).astype(np.int64),
                                            mask=np.isnan(col))
            table = pa.table(columns)
            if writer is None:
                writer = csv.CSVWriter(sink, table.schema, write_options=options)
            writer.write_table(table)
            at = np.arange(b * BLOCK_ROWS, b * BLOCK_ROWS + n) >= first_eval
            oracle["click"].append(click[at])
            oracle["p_click"].append(block.probs[at, 0])
            known = at & ~hidden
            oracle["purchase"].append(purchase[known])
            oracle["p_purchase"].append(block.probs[known, 1])
        if writer is not None:
            writer.close()
    joined = {k: np.concatenate(v) for k, v in oracle.items()}
    return {"click": auc(joined["click"], joined["p_click"]),
            "purchase": auc(joined["purchase"], joined["p_purchase"])}


def columns(vocab_fields: int = 4, dense: int = 2) -> tuple[list[str], list[str]]:
    """The sparse and dense column names of such a file."""
    return [f"c{f}" for f in range(vocab_fields)], [f"d{j}" for j in range(dense)]
