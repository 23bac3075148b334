"""The built-in data generator: click data with a known answer, generated block by block so that
any range of rows is produced on its own, in bounded memory, the same on every host.

Each categorical field draws its values from a Zipf law over ``vocab`` values (rank k has
probability about proportional to k^-zipf; drawn by inverting the law's continuous CDF, so a
vocabulary of millions costs no table), each value has a planted weight ~ N(0, signal) that is
a pure function of the field and the value (no table either), each dense column is a log-normal
count whose standardised log1p has a planted weight ~ N(0, signal), and the label is
Bernoulli(sigmoid(bias + sum of weights)), with the bias set for about 25 % positives. The true
probabilities give ``oracle_auc``: the best AUC any model can reach. Timestamps (unix seconds)
rise through the rows over ``days`` days ending 2026-01-01.

Items (``items`` = N > 0; without, the rows are those above, bit for bit): three fields more,
``item`` (the candidate shown), ``genres`` (a list: the candidate's genres) and ``history`` (a
list: the items the user clicked before, newest last), drawn from a random stream of their own,
(seed, b, ``ITEM_STREAM``), so the fields above stay as they are. Items are Zipf-popular over N;
the item of popularity rank r has 1 to 3 distinct genres out of ``genres`` (G), a pure function
of r (so of the item id): its first genre is (r - 1) mod P (P = min(G, N)), so that the items of
genre g are the ranks g + 1, g + 1 + P, ..., drawn Zipf within it; the others hashed. Each row
has a latent interest, a genre g_u uniform over P; its history holds 0..``history`` items
(uniform), each drawn from g_u with probability ``HISTORY_IN_INTEREST`` and from every item
otherwise, and the candidate from g_u half the time (``CANDIDATE_IN_INTEREST``), else from every
item. The planted model adds to the logit

    signal * w_item(candidate)                                  the candidate's own weight
    + signal * mean over g in genres(candidate) of w_genre(g)    its genres
    + affinity * (history items sharing a genre with the candidate) / max(1, len(history))

(``w`` ~ N(0, 1), pure functions of (seed, id)): the interest term is a product of the
candidate with each history item, what an attention of the candidate over the history (DIN)
finds and a pooled history barely shows. The probabilities stay exact, so ``oracle_auc`` holds.

Drift (``drift`` = d radians a day; 0, the default, leaves the rows above bit for bit): the
planted weights of the categorical values and of the candidate item turn with event time, each
w(t) = cos(d t) w0 + sin(d t) w1 (w0, w1 ~ N(0, signal^2), pure functions of the value; t the
row's day, its nominal place in the rows), so any instant's weights are distributed as without
drift (the bias holds) while two instants k days apart correlate cos(d k): a model that stops
learning falls behind, and the true probabilities still give each window's oracle AUC.

Rows come in blocks of ``BLOCK_ROWS``; block b is drawn from its own random stream (seed, b),
so rows [a, b) are the same whichever process generates them and however the rows are cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roles.data.keyspace import splitmix64

END_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z
POSITIVE_RATE = 0.25
BLOCK_ROWS = 1 << 16
CALIBRATION_ROWS = 1 << 17   # rows whose logits set the bias (and the dense standardisation)
ITEM_STREAM = 0x17E45        # the items' random stream of block b: (seed, b, ITEM_STREAM)
DRIFT_SEED = 0xD51F7         # the second weights (w1) a value's weight turns towards
HISTORY_IN_INTEREST = 0.8    # a history item is of the user's genre of interest this often
CANDIDATE_IN_INTEREST = 0.5  # and the candidate this often
MAX_GENRES = 3               # genres of one item, at most
AFFINITY = 1.5               # the interest term's weight (logit units) by default
# Criteo's categorical cardinalities (the Kaggle set), for files of the Criteo layout
CRITEO_VOCAB = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                142572]
_TWO53 = float(2 ** 53)


@dataclass(frozen=True)
class SyntheticBlock:
    values: np.ndarray      # int64 [rows, fields]: value ids (0 .. vocab-1; -1: missing), then
    #                         the candidate item's id with items
    dense: np.ndarray       # float64 [rows, dense]: raw counts (NaN: missing)
    labels: np.ndarray      # float32 [rows] ([rows, 2] with conversion: click, purchase)
    probs: np.ndarray       # float64 [rows]: the true click probability ([rows, 2]: and the
    #                         purchase's, p(click) · p(purchase | click))
    timestamps: np.ndarray  # int64 [rows]
    genres: np.ndarray      # int64 [rows, 3]: the candidate's genres, -1 after them ([rows, 0]
    #                         without items)
    history_lengths: np.ndarray  # int64 [rows]: items in each row's history (0 without items)
    history: np.ndarray     # int64 [sum of history_lengths]: the histories' item ids, row
    #                         after row, each oldest first

    def slice(self, lo: int, hi: int) -> SyntheticBlock:
        """Rows [lo, hi)."""
        ends = np.cumsum(self.history_lengths)
        first = int(ends[lo - 1]) if lo > 0 else 0
        last = int(ends[hi - 1]) if hi > lo else first
        return SyntheticBlock(self.values[lo:hi], self.dense[lo:hi], self.labels[lo:hi],
                              self.probs[lo:hi], self.timestamps[lo:hi], self.genres[lo:hi],
                              self.history_lengths[lo:hi], self.history[first:last])

    @classmethod
    def join(cls, parts: list[SyntheticBlock]) -> SyntheticBlock:
        return cls(*(np.concatenate([getattr(p, k) for p in parts])
                     for k in ("values", "dense", "labels", "probs", "timestamps", "genres",
                               "history_lengths", "history")))


@dataclass(frozen=True)
class _Items:
    """The item fields of a block's rows (``SyntheticBlock``'s) and their logit terms."""

    item: np.ndarray             # int64 [n]: the candidate's id
    genres: np.ndarray           # int64 [n, 3]
    history_lengths: np.ndarray  # int64 [n]
    history: np.ndarray          # int64 [total]
    logit: np.ndarray            # float64 [n]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _bias_for_rate(logit: np.ndarray, rate: float) -> float:
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _sigmoid(logit + mid).mean() < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class ZipfLaw:
    """Ranks 1..size with P(k) proportional to k^-s: the head (the first ``HEAD`` ranks) from
    its exact cumulative table, the tail by inverting the continuous law over it, so that a
    vocabulary of millions costs a table of ``HEAD`` entries."""

    HEAD = 4096

    def __init__(self, size: int, s: float):
        self.size, self.s = size, s
        head = np.arange(1, min(size, self.HEAD) + 1, dtype=np.float64) ** -s
        self.cum = np.cumsum(head)
        self.h = len(head)
        self.tail = self._tail_mass(self.h + 0.5, size + 0.5) if size > self.h else 0.0
        self.total = self.cum[-1] + self.tail

    def _tail_mass(self, a: float, b: float) -> float:
        if abs(self.s - 1.0) < 1e-9:
            return float(np.log(b / a))
        return float((b ** (1 - self.s) - a ** (1 - self.s)) / (1 - self.s))

    def ranks(self, u: np.ndarray) -> np.ndarray:
        x = u * self.total
        out = np.searchsorted(self.cum, x, side="right").astype(np.int64) + 1
        tail = x >= self.cum[-1]
        if tail.any():
            rest = x[tail] - self.cum[-1]
            a = self.h + 0.5
            if abs(self.s - 1.0) < 1e-9:
                t = a * np.exp(rest)
            else:
                t = (a ** (1 - self.s) + rest * (1 - self.s)) ** (1 / (1 - self.s))
            out[tail] = np.floor(t + 0.5).astype(np.int64)
        return np.clip(out, 1, self.size)


def hashed_normal(seed: np.uint64, ids: np.ndarray) -> np.ndarray:
    """A standard normal draw that is a pure function of (seed, id) (Box-Muller on two hashed
    uniforms)."""
    h1 = splitmix64(np.asarray(ids, dtype=np.uint64) ^ seed)
    h2 = splitmix64(h1)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / _TWO53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / _TWO53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class Generator:
    """Rows of one synthetic data set; ``missing``: the share of values left out (empty
    categorical values and missing counts), as real logs have."""

    def __init__(self, rows: int, vocab: list[int], dense: int, zipf: float, signal: float,
                 days: int, seed: int, missing: float = 0.0, items: int = 0, history: int = 20,
                 genres: int = 40, affinity: float = AFFINITY, drift: float = 0.0,
                 conversion: bool = False, shared: float = 0.5, cvr_bias: float = -0.5):
        self.rows, self.vocab, self.n_dense = rows, list(vocab), dense
        self.zipf, self.signal, self.days, self.seed = zipf, signal, days, seed
        self.missing = missing
        self.items, self.max_history, self.n_genres = items, history, genres
        self.affinity = affinity
        self.drift = drift
        self.conversion, self.shared, self.cvr_bias = conversion, shared, cvr_bias
        base = splitmix64(np.array([seed], dtype=np.uint64))[0]
        self.cvr_seeds = splitmix64(np.uint64(seed) ^ np.arange(101, 101 + len(vocab),
                                                                dtype=np.uint64))
        if items:
            self.item_stride = self._stride(items, len(vocab))
            self.item_law = ZipfLaw(items, zipf)
            self.primary = min(genres, items)   # genres that are some item's first
            self.genre_law = ZipfLaw(-(-items // self.primary), zipf)
            self.item_seed, self.genre_seed, self.genre_pick = splitmix64(
                base ^ np.array([0x17E4_0001, 0x17E4_0002, 0x17E4_0003], dtype=np.uint64))
        self.field_seeds = splitmix64(base ^ np.arange(1, len(vocab) + 1, dtype=np.uint64))
        # a value's id is a fixed bijection of its popularity rank (rank and id unrelated)
        self.strides = [self._stride(size, f) for f, size in enumerate(vocab)]
        self.laws = [ZipfLaw(size, zipf) for size in vocab]
        self.dense_weights = signal * hashed_normal(base ^ np.uint64(0xDE45E),
                                                    np.arange(dense, dtype=np.uint64))
        rng = np.random.default_rng([seed, 1 << 40])
        sample = np.log1p(np.floor(np.exp(rng.normal(1.5, 1.0, size=(CALIBRATION_ROWS,
                                                                    dense)))))
        self.z_mean = sample.mean(axis=0) if dense else np.zeros(0)
        std = sample.std(axis=0) if dense else np.zeros(0)
        self.z_std = np.where(std > 0, std, 1.0)
        self.bias = 0.0
        calibration = [self._logits(b)[0] for b in range(self._blocks(CALIBRATION_ROWS))]
        self.bias = _bias_for_rate(np.concatenate(calibration)[:CALIBRATION_ROWS],
                                   POSITIVE_RATE)

    @staticmethod
    def _stride(size: int, field: int) -> int:
        """A step coprime with ``size``: id = (rank - 1) * stride + field mod size is then a
        bijection of ranks onto ids."""
        step = 0x9E3779B1 + 2 * field
        while np.gcd(step, size) != 1:
            step += 1
        return step % size if size > 1 else 0

    def _weights(self, seed: np.uint64, ids: np.ndarray, angle: np.ndarray | None
                 ) -> np.ndarray:
        """The planted weight (before ``signal``) of each id, turned by ``angle`` (radians,
        per row) with drift."""
        w0 = hashed_normal(seed, ids)
        if angle is None:
            return w0
        return np.cos(angle) * w0 + np.sin(angle) * hashed_normal(seed ^ np.uint64(DRIFT_SEED),
                                                                  ids)

    def angles(self, start: int, n: int) -> np.ndarray | None:
        """The drift's angle of rows [start, start + n): drift x the row's day (0 at the
        last row), None without drift."""
        if not self.drift:
            return None
        position = (start + np.arange(n) + 0.5) / max(self.rows, 1)
        return self.drift * self.days * (position - 1.0)

    def _blocks(self, rows: int) -> int:
        return -(-rows // BLOCK_ROWS)

    # -- items -------------------------------------------------------------------------------
    def item_ids(self, ranks: np.ndarray) -> np.ndarray:
        """The id of the item of each popularity rank (a bijection, as the fields' values)."""
        return ((ranks - 1) * self.item_stride + len(self.vocab)) % self.items

    def item_genres(self, ranks: np.ndarray) -> np.ndarray:
        """int64 [n, 3]: the genres of the item of each rank, distinct, -1 after them: the
        first is (rank - 1) mod P, then 0 to 2 more (as many as G allows) hashed from the
        rank."""
        g, first = self.n_genres, (ranks - 1) % self.primary
        h0 = splitmix64(ranks.astype(np.uint64) ^ self.genre_pick)
        h1 = splitmix64(h0)
        h2 = splitmix64(h1)
        count = np.minimum(1 + (h0 % np.uint64(MAX_GENRES)).astype(np.int64), g)
        step1 = 1 + (h1 % np.uint64(max(g - 1, 1))).astype(np.int64)   # 1 .. G-1
        step2 = 1 + (h2 % np.uint64(max(g - 2, 1))).astype(np.int64)   # 1 .. G-2, then
        step2 += step2 >= step1                                          # skipping step1
        out = np.full((len(ranks), MAX_GENRES), -1, dtype=np.int64)
        out[:, 0] = first
        out[:, 1] = np.where(count >= 2, (first + step1) % g, -1)
        out[:, 2] = np.where(count >= 3, (first + step2) % g, -1)
        return out

    def _in_genre(self, genre: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Ranks of items whose first genre is ``genre``, Zipf within it."""
        k = self.genre_law.ranks(u)
        ranks = (k - 1) * self.primary + genre + 1
        return np.where(ranks > self.items, ranks - self.primary, ranks)

    def _items(self, b: int, angle: np.ndarray | None = None) -> _Items:
        """Block ``b``'s item fields and their terms of the logit (module docstring)."""
        n = BLOCK_ROWS
        rng = np.random.default_rng([self.seed, b, ITEM_STREAM])
        interest = rng.integers(0, self.primary, n)
        lengths = rng.integers(0, self.max_history + 1, n)
        owner = np.repeat(np.arange(n), lengths)
        u = rng.random((3, len(owner)))
        history = np.where(u[0] < HISTORY_IN_INTEREST, self._in_genre(interest[owner], u[1]),
                           self.item_law.ranks(u[2]))
        v = rng.random((3, n))
        candidate = np.where(v[0] < CANDIDATE_IN_INTEREST, self._in_genre(interest, v[1]),
                             self.item_law.ranks(v[2]))
        genres = self.item_genres(candidate)
        theirs, mine = self.item_genres(history), genres[owner]
        shared = np.zeros(len(owner), dtype=bool)
        for a in range(MAX_GENRES):   # a history item's genre a is one of the candidate's
            shared |= (theirs[:, a] >= 0) & (mine == theirs[:, a:a + 1]).any(axis=1)
        sharing = np.bincount(owner, weights=shared, minlength=n) / np.maximum(lengths, 1)
        present = genres >= 0
        genre_w = np.where(present, hashed_normal(self.genre_seed, np.maximum(genres, 0)), 0.0)
        ids = self.item_ids(candidate)
        logit = self.signal * (self._weights(self.item_seed, ids, angle)
                               + genre_w.sum(axis=1) / present.sum(axis=1)) \
            + self.affinity * sharing
        return _Items(ids, genres, lengths, self.item_ids(history), logit)

    # -- rows --------------------------------------------------------------------------------
    def _logits(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.Generator,
                                       _Items | None]:
        n = BLOCK_ROWS
        rng = np.random.default_rng([self.seed, b])
        values = np.empty((n, len(self.vocab)), dtype=np.int64)
        logit = np.zeros(n)
        angle = self.angles(b * BLOCK_ROWS, n)
        for f, size in enumerate(self.vocab):
            rank = self.laws[f].ranks(rng.random(n))
            ids = ((rank - 1) * self.strides[f] + f) % size
            values[:, f] = ids
            logit += self.signal * self._weights(self.field_seeds[f], ids, angle)
        counts = np.floor(np.exp(rng.normal(1.5, 1.0, size=(n, self.n_dense))))
        if self.n_dense:
            logit += ((np.log1p(counts) - self.z_mean) / self.z_std) @ self.dense_weights
        items = self._items(b, angle) if self.items else None
        if items is not None:
            logit += items.logit
        return logit, values, counts, rng, items

    def block(self, b: int) -> SyntheticBlock:
        """Block ``b``: rows [b * BLOCK_ROWS, ...) of the data (the last one is short)."""
        logit, values, counts, rng, items = self._logits(b)
        probs = _sigmoid(logit + self.bias)
        labels = (rng.random(len(probs)) < probs).astype(np.float32)
        start = b * BLOCK_ROWS
        n = max(0, min(BLOCK_ROWS, self.rows - start))
        position = (start + np.arange(BLOCK_ROWS) + rng.random(BLOCK_ROWS)) / max(self.rows, 1)
        stamps = (END_TIME - self.days * 86400 * (1.0 - position)).astype(np.int64)
        if self.missing > 0:
            gone = rng.random(counts.shape) < self.missing
            counts = np.where(gone, np.nan, counts)
            values = np.where(rng.random(values.shape) < self.missing, -1, values)
        if self.conversion:   # drawn last: the clicks and the values are the same without it
            p_cvr = self.purchase_given_click(values, logit + self.bias)
            purchase = (labels == 1) & (rng.random(len(probs)) < p_cvr)
            labels = np.stack([labels, purchase.astype(np.float32)], axis=1)
            probs = np.stack([probs, probs * p_cvr], axis=1)
        if items is None:
            genres = np.zeros((BLOCK_ROWS, 0), np.int64)
            lengths, history = np.zeros(BLOCK_ROWS, np.int64), np.zeros(0, np.int64)
        else:
            values = np.concatenate([values, items.item[:, None]], axis=1)
            genres, lengths, history = items.genres, items.history_lengths, items.history
        return SyntheticBlock(values=values, dense=counts, labels=labels, probs=probs,
                              timestamps=stamps, genres=genres, history_lengths=lengths,
                              history=history).slice(0, n)

    def purchase_given_click(self, values: np.ndarray, click_logit: np.ndarray) -> np.ndarray:
        """The planted p(purchase | click): a weight per value of its own (``signal`` as the
        click's; none for a missing value, -1), ``shared`` of the click's logit and
        ``cvr_bias``."""
        own = sum(hashed_normal(self.cvr_seeds[f], values[:, f]) * (values[:, f] >= 0)
                  for f in range(len(self.vocab)))
        return _sigmoid(self.signal * own + self.shared * click_logit + self.cvr_bias)

    def rows_between(self, start: int, stop: int) -> SyntheticBlock:
        """Rows [start, stop), from the blocks that hold them."""
        stop = min(stop, self.rows)
        parts = []
        for b in range(start // BLOCK_ROWS, self._blocks(stop)):
            block = self.block(b)
            lo = max(start - b * BLOCK_ROWS, 0)
            hi = min(stop - b * BLOCK_ROWS, len(block.labels))
            parts.append(block.slice(lo, hi))
        if not parts:
            fields = len(self.vocab) + (1 if self.items else 0)
            tasks = (0, 2) if self.conversion else 0
            return SyntheticBlock(np.zeros((0, fields), np.int64), np.zeros((0, self.n_dense)),
                                  np.zeros(tasks, np.float32), np.zeros(tasks),
                                  np.zeros(0, np.int64),
                                  np.zeros((0, MAX_GENRES if self.items else 0), np.int64),
                                  np.zeros(0, np.int64), np.zeros(0, np.int64))
        return SyntheticBlock.join(parts) if len(parts) > 1 else parts[0]
