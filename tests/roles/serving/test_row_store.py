"""A served model's rows on disk (``roles.serving.row_store``): the store against a dict
through upserts and drops, and ``.npz`` entries read in place as ``np.load`` reads them."""

from __future__ import annotations

import numpy as np

from roles.checkpoint.npz_stream import Entry, whole, write_npz
from roles.serving.row_store import RowStore, keys_in, mapped


def test_the_store_agrees_with_a_dict_through_upserts_and_drops(tmp_path):
    rng = np.random.default_rng(3)
    store = RowStore(3000, 4, parent=str(tmp_path))
    want: dict[int, np.ndarray] = {}
    for _ in range(6):
        keys = np.unique(rng.integers(-2**63, 2**63 - 1, 400, dtype=np.int64))
        keys = np.concatenate([keys, rng.choice(np.array(list(want) or [0], np.int64), 50)])
        keys = np.unique(keys)
        rows = rng.normal(0, 1, (len(keys), 4)).astype(np.float32)
        store.upsert(keys, rows)
        want.update(zip(keys.tolist(), rows, strict=True))
        gone = rng.choice(np.array(list(want), np.int64), 60, replace=False)
        store.drop(np.concatenate([gone, [12345]]))   # (an absent key: ignored)
        for k in gone.tolist():
            del want[k]
    asked = np.array([*want, 7, -7], np.int64)
    found, got = store.find(asked)
    assert found.tolist() == [True] * len(want) + [False, False]
    assert np.array_equal(got[:len(want)], np.stack(list(want.values())))
    assert not got[len(want):].any()
    where = store.dir
    assert where.is_dir()
    del store, got
    import gc
    gc.collect()
    assert not where.exists()   # removed once no longer used


def test_npz_entries_are_read_in_place_as_np_load_reads_them(tmp_path):
    a = np.arange(12, dtype=np.int64)
    b = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    saved = tmp_path / "saved.npz"
    np.savez(saved, keys=a, rows=b, empty=np.zeros((0, 3), np.float32),
             meta=np.array([{"kind": "full"}], dtype=object))
    streamed = tmp_path / "streamed.npz"
    write_npz(streamed, [whole("keys", a),
                         Entry("rows", np.dtype(np.float32), (5, 3), [b[:2], b[2:]])])
    for path in (saved, streamed):
        m = mapped(path)
        assert np.array_equal(m["keys"], a) and np.array_equal(m["rows"], b)
        assert isinstance(m["keys"], np.memmap) and "meta" not in m
    assert mapped(saved)["empty"].shape == (0, 3)
    assert keys_in([saved, streamed]) == 24
