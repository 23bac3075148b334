#!/usr/bin/env python
"""Write a Criteo-layout file (label, 13 integer counts I1..I13, 26 categorical values C1..C26
as 8 hex digits; tab-separated, no header) of N rows from the built-in generator, block by block
(bounded memory). The rows follow a planted logistic model with Criteo's cardinalities, so a
model trained on them has something to learn; ``--missing`` of the values are left empty, as in
the real logs (``roles.testbed.criteo``, which tests call).

    .venv/bin/python scripts/make_criteo.py --rows 10000000 --out /tmp/criteo-10m.tsv [--gz]
"""

from __future__ import annotations

import argparse
import time

from roles.testbed.criteo import write_criteo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--gz", action="store_true", help="gzip the output (level 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--missing", type=float, default=0.05)
    parser.add_argument("--signal", type=float, default=0.3)
    parser.add_argument("--zipf", type=float, default=1.1)
    args = parser.parse_args()
    started = time.monotonic()
    write_criteo(args.out, args.rows, gz=args.gz, seed=args.seed, missing=args.missing,
                 signal=args.signal, zipf=args.zipf)
    print(f"{args.rows} rows written to {args.out} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
