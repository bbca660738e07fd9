"""The module's `columns` against every Parquet file at submission, not only the first.

Preflight reads the first shard alone: a later file without a column the module names
used to fail its training task part way through the job (after all of the first file
was trained). Every file's footer schema is checked when the shards are planned, and
every offending file is named (the first few and a count).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flextrain.cli import main
from flextrain.data import DataError, DataOptions, make_shards

FEATURES = ["x0", "x1", "x2", "x3"]

MODULE = '''
import torch
from torch import nn

columns = ["x0", "x1", "x2", "x3", "label"]


def Model():
    return nn.Linear(4, 2)


def loss(labels, predictions):
    return nn.functional.cross_entropy(predictions, labels)


def optimizer(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr)


def feed(records, mode, metadata):
    x = torch.tensor([[r[k] for k in ("x0", "x1", "x2", "x3")] for r in records])
    return x if mode == "prediction" else (x, torch.tensor([r["label"] for r in records]))
'''


def write(path, rows: int, names=(*FEATURES, "label")):
    data = {n: pa.array(np.arange(rows) % 2 if n == "label" else np.arange(rows) / 7.0) for n in names}
    pq.write_table(pa.table(data), path, row_group_size=64)
    return path


@pytest.fixture
def mixed(tmp_path):
    """a.parquet has every column; b_missing.parquet (after it in name order) lacks x3."""
    d = tmp_path / "pqmix"
    d.mkdir()
    write(d / "a.parquet", 120)
    write(d / "b_missing.parquet", 40, names=("x0", "x1", "x2", "label"))
    return d


def test_a_later_file_without_a_column_is_named_with_what_it_has(mixed):
    with pytest.raises(DataError) as info:
        make_shards(mixed, options=DataOptions(columns=(*FEATURES, "label")), what="training data")
    assert str(info.value) == (f"Parquet file {mixed / 'b_missing.parquet'} has no column 'x3' "
                               "(its columns: 'x0', 'x1', 'x2', 'label')")


def test_every_offending_file_is_named_up_to_five_and_counted(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    write(d / "a.parquet", 10)
    for i in range(7):
        write(d / f"b{i}.parquet", 10, names=("x0", "label"))
    write(d / "c_empty.parquet", 0, names=("x0",))  # no rows: never read, so never refused
    with pytest.raises(DataError) as info:
        make_shards(d, options=DataOptions(columns=(*FEATURES, "label")), what="training data")
    text = str(info.value)
    assert text.startswith(f"training data {d}: 7 Parquet files lack columns the module's `columns` names: "
                           f"Parquet file {d / 'b0.parquet'} has no columns 'x1', 'x2', 'x3' (its columns: "
                           "'x0', 'label'); ")
    assert [f"b{i}.parquet" in text for i in range(7)] == [True] * 5 + [False] * 2
    assert text.endswith("; and 2 more") and "c_empty" not in text
    assert len(make_shards(d, options=DataOptions(columns=("x0", "label")))) == 8  # the empty file gives none


@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "no-preflight"])
def test_train_refuses_the_mixed_directory_at_submission(mixed, tmp_path, capsys, monkeypatch, preflight):
    """Preflight's child checks the columns (it imports the module); without it, the CLI's process does."""
    started = []
    monkeypatch.setattr("flextrain.master.main.run_master", lambda spec, **kw: started.append(spec) or 0)
    (tmp_path / "pqcols.py").write_text(MODULE)
    code = main(["train", "--model-def", f"{tmp_path / 'pqcols.py'}:Model", "--training-data", str(mixed),
                 "--job-dir", str(tmp_path / "job"), "--global-batch-size", "8",
                 *([] if preflight else ["--no-preflight"])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"Parquet file {mixed / 'b_missing.parquet'} has no column 'x3'" in err, err
    assert not started and not (tmp_path / "job").exists()
    if preflight:
        return
    # the same data without the odd file passes
    (mixed / "b_missing.parquet").unlink()
    assert main(["train", "--model-def", f"{tmp_path / 'pqcols.py'}:Model", "--training-data", str(mixed),
                 "--job-dir", str(tmp_path / "job"), "--no-preflight", "--global-batch-size", "8"]) == 0
    assert len(started) == 1
