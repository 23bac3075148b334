#!/usr/bin/env python
"""One training step of a network in fp32 and in bf16 (``[train] precision``), in one run.

The step is what a worker does with a batch's grid once its rows are in: the forward through
``network_logits`` (under torch's autocast to bfloat16 for bf16), the weighted loss, the
backward to the parameters and to the embedding inputs, Adam's step. The network is a
built-in (``--network``, default ``mlp``) on the Criteo layout (26 single-valued fields of
``--dim``, 13 dense features), ``--hidden``, batch ``--batch``, on ``--threads`` torch threads
(a worker's on a shared host: 1). The two precisions alternate, ``--repeats`` rounds of
``--steps`` steps each; the table gives each one's median ms per step and the ratio.

    .venv/bin/python scripts/bench_precision.py [--network mlp] [--hidden 256,128] [--dim 16]
        [--batch 1024] [--threads 1] [--steps 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from roles.job.settings import parse_job
from roles.model.network import bf16_is_native, build_network, network_logits, weighted_loss_sum
from roles.model.networks import sample_batch


def criteo_job(network: str, hidden: list[int], dim: int):
    return parse_job(f'[data]\nsource = "synthetic"\n[data.synthetic]\nvocab = {[1000] * 26}\n'
                     f'dense = 13\n[model]\nnetwork = "{network}"\nembedding_dim = {dim}\n'
                     f"hidden = {hidden}\n", environ={})


def steps(job, precision: str, batch: int, count: int) -> float:
    """The mean ms per step over ``count`` steps, after two warm-up steps."""
    net = build_network(job)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sparse, dense, lengths = sample_batch(job.layout(), len(job.dense_fields), batch, seed=1)
    for t in sparse.values():
        t.requires_grad_(True)
    labels = (torch.rand(batch, generator=torch.Generator().manual_seed(2)) < 0.25).float()
    weights = torch.ones(batch)

    def one() -> None:
        net.zero_grad(set_to_none=True)
        for t in sparse.values():
            t.grad = None
        loss = weighted_loss_sum(network_logits(net, sparse, dense, lengths, precision),
                                 labels, weights)
        (loss / batch).backward()
        opt.step()

    one(), one()
    started = time.perf_counter()
    for _ in range(count):
        one()
    return 1000 * (time.perf_counter() - started) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="mlp")
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    job = criteo_job(args.network, [int(h) for h in args.hidden.split(",")], args.dim)
    got: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(args.repeats):
        for precision in got:
            got[precision].append(steps(job, precision, args.batch, args.steps))
    fp32, bf16 = (statistics.median(got[p]) for p in ("fp32", "bf16"))
    print(f"{args.network} {args.hidden}, dim {args.dim}, batch {args.batch}, "
          f"{args.threads} thread(s); bfloat16 native on the CPU: "
          f"{bf16_is_native(torch.device('cpu'))}")
    print("| precision | ms per step (median) | each round |\n|---|---|---|")
    for precision, values in got.items():
        print(f"| {precision} | {statistics.median(values):.2f} | "
              f"{', '.join(f'{v:.2f}' for v in values)} |")
    print(f"bf16 takes {bf16 / fp32:.2f}x the time of fp32 ({fp32 / bf16:.2f}x as fast)")


if __name__ == "__main__":
    main()
