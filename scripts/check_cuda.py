"""Prove the worker's CUDA path on a machine with a GPU (CI has none; run it by hand there).

1. For every built-in network on a job with a pooled list field and a sequence sharing the
   candidate's table (the synthetic items; the grid field-major), and on one whose fields are
   all single-valued (the grid sample-major, read joined by ``mlp``), one batch's arithmetic
   (``BatchCompute``: the grid put together from a shard's reply, read per field, forward,
   backward, each row's gradient) on the CPU and on CUDA from the same weights: the loss,
   every row's gradient and every parameter's gradient agree (to 1e-4, relative to their
   scale).
2. A whole ``din`` job on the synthetic items and a whole ``mlp`` job on the single-valued
   fields (2 workers, 2 shards) with ``[train] device = "cuda"``: each completes, every worker
   says it ran on CUDA, and its AUC and rate are printed.

    .venv/bin/python scripts/check_cuda.py [--rows 100000] [--skip-job]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from roles.algorithms.worker.pulled import PulledBatch  # noqa: E402
from roles.job.settings import NETWORKS, parse_job  # noqa: E402
from roles.model.compute import BatchCompute  # noqa: E402
from roles.model.network import build_network  # noqa: E402
from roles.model.networks.registry import SEVERAL_LABELS  # noqa: E402
from roles.protocol.datapath import Embeddings, SampleBatch  # noqa: E402

JOB = """
name = "cuda-check"
[data]
source = "synthetic"
[data.synthetic]
rows = {{rows}}
{items}[model]
network = "{{network}}"
embedding_dim = 16
hidden = [64, 32]
{pooling}[train]
epochs = 2
device = "{{device}}"
[cluster]
workers = 2
shards = 2
[checkpoint]
every_s = 0
"""
# a pooled list field and a sequence sharing the candidate's table: the grid is field-major
ITEMS = JOB.format(items="items = 1000\nhistory = 20\n",
                   pooling='[model.pooling]\nhistory = "none"\n')
# every field single-valued at one width (Criteo's layout): the grid is sample-major and the
# mlp reads it joined (``SparseInputs``, ``JoinedFields``)
PLAIN = JOB.format(items="", pooling="")


def one_batch(job, rows: int = 64, seed: int = 0) -> PulledBatch:
    """A batch of random lengths whose whole grid one shard answers, every row distinct."""
    layout = job.layout()
    rng = np.random.default_rng(seed)
    drawn = [rng.integers(0, layout.widths[f] + 1, rows)
             for f in range(len(layout.fields)) if layout.is_list(f)]
    lengths = (np.stack(drawn, axis=1) if drawn else np.zeros((rows, 0))).astype(np.int32)
    grid = layout.bounds(rows, lengths)[-1]
    inverse = rng.integers(0, grid // 2, grid).astype(np.int32)   # rows used several times
    sample = SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                         dense=rng.normal(size=(rows, len(job.dense_fields))).astype(np.float32),
                         labels=(rng.random(rows) < 0.3).astype(np.float32),
                         weights=np.ones(rows, np.float32), lengths=lengths)
    reply = Embeddings(batch_id=1, grid=grid, mask=Embeddings.mask_of(np.arange(grid), grid),
                       inverse=inverse,
                       rows=rng.normal(0, 0.1, (grid // 2, layout.row_dim)).astype(np.float32))
    return PulledBatch(sample, [reply], [reply.positions()], granted=True)


def close(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> bool:
    a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max().clamp(min=1))))


def arithmetic(template: str, networks: list[str]) -> bool:
    ok = True
    for network in networks:
        job = parse_job(template.format(rows=10000, network=network, device="cpu"),
                        environ={})
        cpu_net = build_network(job)
        gpu_net = copy.deepcopy(cpu_net).to("cuda")
        batch = one_batch(job)
        got = {}
        for device, net in (("cpu", cpu_net), ("cuda", gpu_net)):
            compute = BatchCompute(job.layout(), torch.device(device))
            loss, _, grads, _ = compute.train(net, batch)
            params = [p.grad.detach().cpu() for p in net.parameters()]
            got[device] = (loss, grads[0], params)
        (l_cpu, g_cpu, p_cpu), (l_gpu, g_gpu, p_gpu) = got["cpu"], got["cuda"]
        same = abs(l_cpu - l_gpu) <= 1e-4 * max(1.0, abs(l_cpu)) and close(g_gpu, g_cpu) \
            and all(close(b, a) for a, b in zip(p_cpu, p_gpu, strict=True))
        ok &= same
        order = "sample-major" if compute.sparse.sample_major else "field-major"
        print(f"{network:10s} {order:12s} loss cpu {l_cpu:.6f} cuda {l_gpu:.6f}  rows "
              f"{g_cpu.shape}  params {len(p_cpu)}  {'same' if same else 'DIFFERENT'}")
    return ok


def whole_job(template: str, network: str, rows: int) -> bool:
    from roles.testbed.local_cluster import LocalCluster
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / f"{network}.toml"
        job.write_text(template.format(rows=rows, network=network, device="cuda"))
        with LocalCluster(Path(tmp) / "run", job) as c:
            code = c.run_job(timeout=500)
            s = c.summary()
            devices = s.get("worker_devices") or {}
            print(f"{network} job on cuda: exit {code}, {s['status']}, AUC {s['auc']:.4f} (oracle "
                  f"{s['oracle_auc']:.4f}), {s['samples_per_s']:,.0f} samples/s, "
                  f"{s['samples_trained']:,} samples; workers on cuda: {devices}")
            if code != 0:
                print(c.logs()[-4000:])
            return code == 0 and s["ok"] and sorted(devices.values()) == ["cuda", "cuda"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--skip-job", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    single = [n for n in NETWORKS if n not in SEVERAL_LABELS]   # (these jobs have one label)
    ok = arithmetic(ITEMS, single)
    ok &= arithmetic(PLAIN, [n for n in single if n != "din"])   # din needs a sequence
    if not args.skip_job:
        ok &= whole_job(ITEMS, "din", args.rows)
        ok &= whole_job(PLAIN, "mlp", args.rows)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
