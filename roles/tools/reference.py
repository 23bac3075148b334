"""The no-communication limit: the same model, optimisers and data trained in one process.

Embeddings live in one ``nn.Embedding`` over every key of the data (sparse Adagrad, as on the
shards), the dense network trains with Adam, batches come from the same shuffled order rules.
Used by the throughput benchmark and as the quality reference.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import orjson
import torch

from roles.algorithms.metrics import auc, logloss
from roles.data.dataset import Dataset, load_dataset
from roles.job.settings import Job, load_job
from roles.model.network import build_model, set_threads, weighted_loss_sum


def train_reference(job: Job, data: Dataset, threads: int = 0) -> dict:
    set_threads(threads or os.cpu_count() or 1)
    torch.sparse.check_sparse_tensor_invariants.disable()  # torch warns when left implicit
    uniq, inverse = np.unique(data.keys, return_inverse=True)
    index = torch.from_numpy(inverse.reshape(data.keys.shape).astype(np.int64))
    dim = job.model.embedding_dim
    net = build_model(job)
    table = torch.nn.Embedding(len(uniq), dim, sparse=True)
    torch.nn.init.uniform_(table.weight, -job.train.embedding_init, job.train.embedding_init)
    dense_opt = torch.optim.Adam(net.parameters(), lr=job.train.dense_lr)
    emb_opt = torch.optim.Adagrad(table.parameters(), lr=job.train.embedding_lr)
    dense = torch.from_numpy(data.dense)
    labels = torch.from_numpy(data.labels)
    sample_weights = torch.from_numpy(data.weights)
    n_train, bs = data.n_train, job.train.batch_size
    epochs, train_s = [], 0.0
    for epoch in range(job.train.epochs):
        order = np.arange(n_train)
        if job.train.shuffle:
            np.random.default_rng(job.train.seed * 1000 + epoch).shuffle(order)
        order_t = torch.from_numpy(order)
        start = time.perf_counter()
        loss_sum = weight_sum = 0.0
        for lo in range(0, n_train, bs):
            idx = order_t[lo:lo + bs]
            logits = net(table(index[idx]), dense[idx])
            w = sample_weights[idx]
            loss = weighted_loss_sum(logits, labels[idx], w)
            dense_opt.zero_grad()
            emb_opt.zero_grad()
            (loss / w.sum().clamp_min(1e-12)).backward()
            dense_opt.step()
            emb_opt.step()
            loss_sum += float(loss.detach())
            weight_sum += float(w.sum())
        train_s += time.perf_counter() - start
        with torch.no_grad():
            ev = torch.arange(n_train, len(labels))
            probs = torch.sigmoid(net(table(index[ev]), dense[ev])).numpy()
        y_eval = data.labels[n_train:]
        epochs.append({"epoch": epoch, "train_loss": loss_sum / weight_sum,
                       "auc": auc(y_eval, probs), "logloss": logloss(y_eval, probs)})
    return {"auc": epochs[-1]["auc"], "logloss": epochs[-1]["logloss"],
            "oracle_auc": data.oracle_auc, "samples_trained": n_train * job.train.epochs,
            "train_s": train_s, "samples_per_s": n_train * job.train.epochs / train_s,
            "per_epoch": epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job file (default: ZBUS_JOB or the built-in job)")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    job = load_job(args.job)
    result = train_reference(job, load_dataset(job), args.threads)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
