"""The sparse fields' layout (roles/job/fields.py) and the worker's reading of a grid per field
(roles/model/sparse_input.py): unit tests, no processes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from roles.data.hashing import derived_keys, hash_value
from roles.data.readers import RawBlock
from roles.data.stream import slot_keys
from roles.job.fields import PAD, FieldLayout, LayoutError, field_of
from roles.job.settings import JobError, parse_job
from roles.model.sparse_input import SparseInputs


def layout(**kw) -> FieldLayout:
    args = dict(fields=["user", "movie", "genres", "history"],
                lists={"genres": "|", "history": "|"}, tables={"item": ["movie", "history"]},
                dim=2, dims={}, pooling={"history": "none"}, max_len={"history": 3, "genres": 2})
    args.update(kw)
    return FieldLayout.of(args["fields"], args["lists"], args["tables"], args["dim"],
                          args["dims"], args["pooling"], args["max_len"])


def test_a_layout_reads_the_jobs_fields_tables_widths_and_pooling():
    lay = layout(dims={"item": 3})
    assert lay.tables == ("user", "item", "genres", "item")
    assert lay.dims == (2, 3, 2, 3) and lay.row_dim == 3
    assert lay.widths == (1, 1, 2, 3) and lay.slots == 7
    assert lay.pooling == ("", "", "mean", "none")
    assert lay.list_fields == ["genres", "history"] and lay.sequence_fields == ["history"]
    assert lay.sparse_dims() == {"user": 2, "movie": 3, "genres": 2, "history": 3}


@pytest.mark.parametrize("kw, said", [
    (dict(lists={"nope": "|"}), "lists names 'nope'"),
    (dict(tables={"item": ["movie", "nope"]}), "names 'nope'"),
    (dict(tables={"a": ["movie"], "b": ["movie"]}), "in two tables"),
    (dict(tables={"user": ["movie"]}), "named as the field 'user'"),
    (dict(dims={"movie": 8}), "[model.dims] names 'movie'"),
    (dict(pooling={"user": "sum"}), "not a list field"),
    (dict(max_len={"movie": 5}), "not a list field"),
])
def test_fields_that_do_not_fit_together_are_refused_by_name(kw, said):
    with pytest.raises(LayoutError, match=None) as err:
        layout(**kw)
    assert said in str(err.value)


def test_a_job_file_with_a_bad_layout_is_a_job_error():
    with pytest.raises(JobError, match="not a list field"):
        parse_job("[data]\nsource = 'synthetic'\n[model.pooling]\nc0 = 'none'\n", environ={})
    with pytest.raises(JobError, match="must be one of"):
        parse_job("[data]\nsource = 'synthetic'\n[model.pooling]\nc0 = 'max'\n", environ={})
    with pytest.raises(JobError, match="exclusive"):
        parse_job("[data]\nsource = 'synthetic'\n[model]\nnetwork = 'dcn'\n"
                  "module = 'x.py:build'\n", environ={})


def slots(rows: list[list[list[int]]], lay: FieldLayout) -> np.ndarray:
    """Samples given field by field (a list per field) as the feeder's slot rows."""
    out = np.full((len(rows), lay.slots), PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        for f, ids in enumerate(row):
            r = lay.slot_range(f)
            out[i, r.start:r.start + len(ids)] = ids
    return out


def test_a_batch_becomes_a_field_major_grid_with_its_bounds_and_lengths():
    lay = layout()
    keys = slots([[[1], [10], [5, 6], [10, 11, 12]],
                  [[2], [20], [], [13]]], lay)
    grid, bounds = lay.grid(keys)
    assert grid.tolist() == [1, 2, 10, 20, 5, 6, 10, 11, 12, 13]
    assert bounds == [0, 2, 4, 6, 10]
    lengths = lay.lengths(keys)
    assert lengths.tolist() == [[2, 3], [0, 1]]
    assert lay.bounds(2, lengths) == bounds
    assert field_of(np.arange(10), bounds).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3, 3]


def test_the_worker_pools_lists_and_pads_sequences_and_the_gradients_come_back():
    lay = layout(pooling={"history": "none", "genres": "sum"})
    keys = slots([[[1], [10], [5, 6], [10, 11, 12]],
                  [[2], [20], [], [13]]], lay)
    grid, _ = lay.grid(keys)
    flat = torch.tensor(np.stack([grid, -grid]).T.astype(np.float32), requires_grad=True)
    sparse, lengths = SparseInputs(lay, torch.device("cpu")).inputs(flat, 2, lay.lengths(keys))
    assert list(sparse) == ["user", "movie", "genres", "history"]   # the job's field order
    assert sparse["user"].tolist() == [[1, -1], [2, -2]]
    assert sparse["genres"].tolist() == [[11, -11], [0, 0]]       # summed; empty: zeros
    assert sparse["history"].shape == (2, 3, 2)
    assert sparse["history"][:, :, 0].tolist() == [[10, 11, 12], [13, 0, 0]]
    assert lengths["history"].tolist() == [3, 1] and lengths["history"].dtype == torch.int64
    assert set(lengths) == {"history"}
    total = sum(t.sum() for t in sparse.values())
    total.backward()
    assert flat.grad is not None and torch.all(flat.grad == 1)


def test_mean_pooling_divides_by_the_lists_length_and_narrow_tables_read_their_width():
    lay = layout(dims={"item": 3})   # rows are kept 3 wide; user and genres read 2
    keys = slots([[[1], [10], [4, 8], [10]]], lay)
    grid, _ = lay.grid(keys)
    flat = torch.tensor(np.repeat(grid[:, None], 3, axis=1).astype(np.float32))
    sparse, _ = SparseInputs(lay, torch.device("cpu")).inputs(flat, 1, lay.lengths(keys))
    assert sparse["genres"].tolist() == [[6, 6]] and sparse["movie"].shape == (1, 3)
    assert sparse["user"].shape == (1, 2)


def test_lengths_beyond_max_len_or_of_another_job_are_named():
    inputs = SparseInputs(layout(), torch.device("cpu"))
    assert inputs.check_lengths(np.array([[2, 3]], np.int32)) is None
    assert "max_len is 3" in inputs.check_lengths(np.array([[1, 4]], np.int32))
    assert "the job has 2" in inputs.check_lengths(np.zeros((1, 1), np.int32))


def test_a_layout_of_single_valued_fields_is_read_sample_by_sample_without_a_copy():
    """Every field single-valued at the full width (Criteo's layout): the worker lays the grid
    out sample by sample, and the network gets the fields side by side as a view of it."""
    lay = layout(fields=["user", "movie", "ad"], lists={}, tables={}, pooling={}, max_len={})
    inputs = SparseInputs(lay, torch.device("cpu"))
    assert inputs.sample_major
    keys = np.array([[1, 10, 100], [2, 20, 200]], dtype=np.int64)
    field_major, _ = lay.grid(keys)
    assert field_major.tolist() == [1, 2, 10, 20, 100, 200]
    grid = inputs.sample_order(field_major, 2)
    assert grid.tolist() == [1, 10, 100, 2, 20, 200]
    rows = np.stack([field_major, -field_major], axis=1)   # a row per position, too
    assert inputs.sample_order(rows, 2)[:, 0].tolist() == grid.tolist()
    flat = torch.tensor(np.stack([grid, -grid], axis=1).astype(np.float32), requires_grad=True)
    sparse, lengths = inputs.inputs(flat, 2, lay.lengths(keys))
    assert lengths == {} and list(sparse) == ["user", "movie", "ad"]
    assert sparse["movie"].tolist() == [[10, -10], [20, -20]]
    assert sparse.joined.tolist() == [[1, -1, 10, -10, 100, -100], [2, -2, 20, -20, 200, -200]]
    assert sparse.joined.data_ptr() == flat.data_ptr()   # a view: no copy
    (sparse["ad"].sum() + 2 * sparse.joined[:, :2].sum()).backward()
    assert flat.grad is not None
    assert flat.grad[:, 0].tolist() == [2, 0, 1, 2, 0, 1]


def test_a_layout_with_lists_or_narrow_fields_keeps_the_field_major_grid():
    for lay in (layout(), layout(fields=["user", "movie"], lists={}, tables={}, pooling={},
                                 max_len={}, dims={"movie": 1})):
        inputs = SparseInputs(lay, torch.device("cpu"))
        grid = np.arange(12)
        assert not inputs.sample_major and inputs.sample_order(grid, 3) is grid


# -- weights per id (wide_deep's wide part, deepfm's first order) ---------------------------------


def test_a_layout_with_weights_per_id_has_a_field_per_data_field_and_per_cross_after_them():
    lay = layout().with_derived(2, [["user", "movie"]])
    assert lay.fields[:4] == ("user", "movie", "genres", "history") and lay.data_fields == 4
    assert lay.derived_fields == ["wide:user", "wide:movie", "wide:genres", "wide:history",
                                  "cross:user*movie"]
    assert lay.tables[4:] == tuple(lay.derived_fields)   # a table each, none shared
    assert lay.dims[4:] == (2,) * 5 and lay.row_dim == 2
    # a list field's weights per id are a list (its slots), summed; a cross is one slot
    assert lay.widths[4:] == (1, 1, 2, 3, 1) and lay.slots == 7 + 8
    assert lay.pooling[4:] == ("", "", "sum", "sum", "")
    assert lay.sources[4:] == ((0,), (1,), (2,), (3,), (0, 1)) and lay.sources[:4] == ((),) * 4
    assert lay.sequence_fields == ["history"]   # the derived lists are pooled


@pytest.mark.parametrize("crosses, said", [
    ([["user", "genres"]], "'genres', a list field"),
    ([["user", "nope"]], "names 'nope', which is not a sparse field"),
    ([["user"]], "two or more different sparse fields"),
    ([["user", "user"]], "two or more different sparse fields"),
    (["user"], "two or more different sparse fields"),
    ([["user", "movie"], ["user", "movie"]], "twice"),
])
def test_a_cross_that_cannot_be_made_is_refused_by_name(crosses, said):
    with pytest.raises(LayoutError) as err:
        layout().with_derived(1, crosses)
    assert said in str(err.value)


def test_a_job_gets_weights_per_id_from_wide_deep_and_deepfm_and_a_bad_cross_is_a_job_error():
    def job(model: str):
        return parse_job("[data]\nsource = 'synthetic'\n[model]\n" + model, environ={})

    wide = job('network = "wide_deep"\n[model.options]\ncrosses = [["c0", "c1"]]\n').layout()
    assert wide.derived_fields[-1] == "cross:c0*c1" and wide.data_fields == len(
        wide.derived_fields) - 1
    fm = job('network = "deepfm"\n').layout()
    assert fm.derived_fields == [f"wide:{f}" for f in fm.fields[:fm.data_fields]]
    assert job('network = "mlp"\n').layout().derived_fields == []
    with pytest.raises(JobError, match="'c9', which is not a sparse field"):
        job('network = "wide_deep"\n[model.options]\ncrosses = [["c0", "c9"]]\n')
    with pytest.raises(JobError, match="crosses must be a list of lists"):
        job('network = "wide_deep"\n[model.options]\ncrosses = "c0"\n')
    with pytest.raises(JobError, match="or of lists of them"):   # options nest lists once
        job('network = "wide_deep"\n[model.options]\ncrosses = [[["c0", "c1"]]]\n')


def test_the_keys_of_the_weights_per_id_are_made_from_the_fields_keys():
    lay = layout().with_derived(1, [["user", "movie"]])
    users, movies = ["u1", "u2", "u1", "u1"], ["m1", "m1", "m2", "m1"]
    genres, history = [["g1", "g2"], [], ["g1"], ["g1", "g2"]], [["m1"], ["m2", "m1"], [], ["m1"]]
    block = RawBlock(labels=np.zeros(4, np.float32), dense=np.zeros((4, 0)),
                     sparse=[pa.array(users), pa.array(movies), pa.array(genres),
                             pa.array(history)], timestamps=None, rows_read=4)
    keys = slot_keys(lay, block)
    assert keys.shape == (4, lay.slots)
    col = {f: keys[:, lay.slot_range(i)] for i, f in enumerate(lay.fields)}
    wide_user = col["wide:user"][:, 0]
    # one id, one weight: u1's rows share a key, unlike u2's, and unlike u1's own embedding key
    assert wide_user[0] == wide_user[2] == wide_user[3] != wide_user[1]
    assert wide_user[0] != hash_value("user", "u1")
    assert wide_user[0] == derived_keys("wide:user", [np.array([hash_value("user", "u1")])])[0]
    # a table shared by two fields: one key for m1 in each, but a weight per field
    assert col["movie"][0, 0] == col["history"][0, 0]
    assert col["wide:movie"][0, 0] != col["wide:history"][0, 0]
    # the cross: a key per pair, (u1, m1) twice the same, (u1, m2) and (u2, m1) others
    cross = col["cross:user*movie"][:, 0]
    assert cross[0] == cross[3] and len({cross[0], cross[1], cross[2]}) == 3
    assert not np.isin(cross, np.concatenate([wide_user, col["wide:movie"][:, 0]])).any()
    # a list's weights per id: a key per id where the list has one, PAD where it has none
    assert ((col["wide:genres"] == PAD) == (col["genres"] == PAD)).all()
    assert ((col["wide:history"] == PAD) == (col["history"] == PAD)).all()
    assert lay.lengths(keys)[:, 2:].tolist() == lay.lengths(keys)[:, :2].tolist()
    assert col["wide:genres"][0, 0] == col["wide:genres"][2, 0] == col["wide:genres"][3, 0]
