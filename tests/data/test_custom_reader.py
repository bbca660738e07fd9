"""A module's custom_data_reader as a data source (flextrain.data.custom, flextrain.worker.reading)."""

from __future__ import annotations

import textwrap

import pytest

from flextrain.data import CustomReaderError, CustomSource, DataError, Shard, custom_source, plan_shards
from flextrain.data.custom import clear_custom_sources
from flextrain.job.usermodule import ModelDefError


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_custom_sources()
    yield
    clear_custom_sources()


class Reader:
    """Shards given; records are ``f"{shard}:{i}"`` strings (or what ``read`` returns)."""

    def __init__(self, shards, read=None):
        self._shards, self._read, self.tasks = shards, read, []

    def create_shards(self):
        return self._shards() if callable(self._shards) else self._shards

    def read_records(self, task):
        self.tasks.append(task)
        if self._read is not None:
            return self._read(task)
        return (f"{task.shard_name}:{i}" for i in range(task.start, task.end))


def factory_of(shards, read=None, calls=None):
    def custom_data_reader(data_origin, records_per_task=None, **kwargs):
        if calls is not None:
            calls.append((data_origin, records_per_task))
        return Reader(shards, read)
    return custom_data_reader


def test_dict_form_gives_one_shard_per_name():
    source = CustomSource(factory_of({"a": (0, 10), "b": (5, 3), "empty": (0, 0)}), "origin")
    assert source.shards() == [Shard("a", 0, 10), Shard("b", 5, 8)]


def test_list_form_and_numpy_ints():
    np = pytest.importorskip("numpy")
    source = CustomSource(factory_of([("x", 0, 4), ["x", 4, np.int64(4)], ("y", 2, 1)]), "origin")
    assert source.shards() == [Shard("x", 0, 4), Shard("x", 4, 8), Shard("y", 2, 3)]


def test_records_per_task_passed_when_accepted():
    calls = []
    CustomSource(factory_of({"a": (0, 1)}, calls=calls), "o", records_per_task=64)
    assert calls == [("o", 64)]

    def only_origin(data_origin):  # an older signature: no records_per_task
        return Reader({"a": (0, 1)})
    assert CustomSource(only_origin, "o", records_per_task=64).shards() == [Shard("a", 0, 1)]


def test_factory_raising_is_named():
    def custom_data_reader(data_origin, records_per_task=None, **kwargs):
        raise ValueError(f"cannot open {data_origin}")
    with pytest.raises(CustomReaderError) as info:
        CustomSource(custom_data_reader, "db://x", what="training data")
    text = str(info.value)
    assert "test_custom_reader.py: custom_data_reader(data_origin='db://x')" in text
    assert "raised ValueError: cannot open db://x" in text
    assert isinstance(info.value, DataError)


@pytest.mark.parametrize("returned, words", [(None, "returned None"), (object(), "returned object")])
def test_factory_returning_no_reader(returned, words):
    with pytest.raises(CustomReaderError, match=f"{words}, which has no create_shards\\(\\) and no read_records"):
        CustomSource(lambda data_origin: returned, "o")


@pytest.mark.parametrize("shards, words", [
    (None, "create_shards\\(\\) .* returned None; expected a dict"),
    ("a", "returned str; expected a dict"),
    ({"a": 5}, "gave the shard \\('a', 5\\); each shard must be a name"),
    ([("a", 0)], "gave the shard \\('a', 0\\)"),
    ([(3, 0, 1)], "gave the shard \\(3, 0, 1\\)"),
    ({"a": (0, "ten")}, "shard 'a' has start 0 and num_records 'ten'; both must be integers"),
    ({"a": (0, True)}, "both must be integers"),
    ({"a": (-1, 3)}, "shard 'a' has a negative start \\(-1, 3\\)"),
    ({"a": (0, -3)}, "shard 'a' has a negative num_records \\(0, -3\\)"),
    ({"a": (0, 0), "b": (3, 0)}, "gave no records for the training data \\(2 shards, all empty\\)"),
    ({}, "gave no records"),
])
def test_bad_shards_are_named(shards, words):
    source = CustomSource(factory_of(shards), "o", what="training data")
    with pytest.raises(CustomReaderError, match=words):
        source.shards()


def test_create_shards_raising_is_named():
    def boom():
        raise KeyError("table")
    with pytest.raises(CustomReaderError, match="create_shards\\(\\) of custom_data_reader\\(data_origin='o'\\) "
                                                "raised KeyError: 'table'"):
        CustomSource(factory_of(boom), "o").shards()


def test_read_gives_a_list_and_a_task_with_mode():
    source = CustomSource(factory_of({"s": (0, 10)}), "o")
    assert source.read("s", 2, 5, mode="evaluation") == ["s:2", "s:3", "s:4"]
    task = source.reader.tasks[-1]
    assert (task.shard_name, task.start, task.end, task.type, task.mode) == ("s", 2, 5, "evaluation", "evaluation")


@pytest.mark.parametrize("read, words", [
    (lambda task: [b"x"] * (task.end - task.start - 1), "returned 2 records; it must return exactly end - start = 3"),
    (lambda task: iter(lambda: b"x", None), "returned more than 3 records"),  # endless
    (lambda task: None, "returned None, not an iterable of records"),
    (lambda task: 1 / 0, "raised ZeroDivisionError: division by zero"),
])
def test_wrong_record_counts_are_named(read, words):
    source = CustomSource(factory_of({"s": (0, 10)}, read), "o")
    with pytest.raises(CustomReaderError, match=words) as info:
        source.read("s", 4, 7)
    assert "for records [4, 7) of shard 's'" in str(info.value)


def test_read_records_raising_while_iterating():
    def read(task):
        yield b"first"
        raise OSError("connection reset")
    source = CustomSource(factory_of({"s": (0, 10)}, read), "o")
    with pytest.raises(CustomReaderError, match="records \\[0, 2\\) of shard 's' raised OSError: connection reset"):
        source.read("s", 0, 2)


def test_one_reader_per_origin_per_process():
    calls = []
    factory = factory_of({"s": (0, 4)}, calls=calls)
    a = custom_source(factory, "one")
    assert custom_source(factory, "one") is a
    b = custom_source(factory, "two")
    assert b is not a and [c[0] for c in calls] == ["one", "two"]
    a.shards(), a.shards()
    assert plan_shards("one", what="training data", reader=factory) == [Shard("s", 0, 4)]
    assert len(calls) == 2


def test_a_failing_factory_is_not_cached():
    calls = []

    def custom_data_reader(data_origin):
        calls.append(data_origin)
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return Reader({"s": (0, 1)})
    with pytest.raises(CustomReaderError):
        custom_source(custom_data_reader, "o")
    assert custom_source(custom_data_reader, "o").shards() == [Shard("s", 0, 1)]


def test_plan_shards_without_reader_is_make_shards(tmp_path):
    (tmp_path / "d.csv").write_text("1,2\n3,4\n")
    assert plan_shards(str(tmp_path / "d.csv"), what="training data") == [Shard(str(tmp_path / "d.csv"), 0, 2)]


MODULE = '''
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x)

def loss(labels, predictions):
    return nn.functional.cross_entropy(predictions, labels)

def optimizer(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr)

def feed(records, mode, metadata):
    x = torch.tensor([[float(r), 1.0] for r in records])
    return x, torch.zeros(len(records), dtype=torch.long)

class Reader:
    def __init__(self, origin):
        self.origin = origin

    def create_shards(self):
        return {f"{self.origin}#0": (0, 6), f"{self.origin}#1": (0, 4)}

    def read_records(self, task):
        base = 100 if task.shard_name.endswith("#1") else 0
        return [base + i for i in range(task.start, task.end)]

def custom_data_reader(data_origin, records_per_task=None, **kwargs):
    return Reader(data_origin)
'''


def test_worker_reads_through_the_modules_reader(tmp_path):
    from flextrain.job import JobSpec
    from flextrain.job.usermodule import module_attribute
    from flextrain.worker.contract import Mode
    from flextrain.worker.module import load_model_def
    from flextrain.worker.reading import job_shards, read_task_records

    (tmp_path / "reader_mod.py").write_text(textwrap.dedent(MODULE))
    spec_str = f"{tmp_path / 'reader_mod.py'}:Model"
    md = load_model_def(spec_str)
    assert md.custom_data_reader is module_attribute(spec_str, "custom_data_reader")
    spec = JobSpec.of(name="t", model_def=spec_str, training_data="train-origin", validation_data="val-origin",
                      job_dir=str(tmp_path / "job"))
    assert job_shards(spec, Mode.TRAINING, reader=md.custom_data_reader) == [
        Shard("train-origin#0", 0, 6), Shard("train-origin#1", 0, 4)]
    assert read_task_records(md, "train-origin#1", 1, 3, mode=Mode.TRAINING, data_origin="train-origin") == [101, 102]
    assert read_task_records(md, "val-origin#0", 0, 2, mode="evaluation", data_origin="val-origin") == [0, 1]
    with pytest.raises(ValueError, match="needs the training data's data origin"):
        read_task_records(md, "train-origin#1", 1, 3, mode=Mode.TRAINING)


def test_module_with_bad_reader_signature_is_refused(tmp_path):
    from flextrain.worker.module import ModelDefError, load_model_def

    (tmp_path / "bad_reader.py").write_text(textwrap.dedent(MODULE).replace(
        "def custom_data_reader(data_origin, records_per_task=None, **kwargs)", "def custom_data_reader()"))
    with pytest.raises(ModelDefError, match="`custom_data_reader` has the wrong signature"):
        load_model_def(f"{tmp_path / 'bad_reader.py'}:Model")


def test_the_master_imports_no_module_whose_source_cannot_define_a_reader(tmp_path):
    """An ordinary module is never imported by the master (it would run user code and load its framework)."""
    import sys

    from flextrain.job.usermodule import module_attribute

    plain = tmp_path / "plain_module_xyz.py"
    plain.write_text("raise RuntimeError('imported')\ndef Model():\n    pass\n")
    assert module_attribute(f"{plain}:Model", "custom_data_reader") is None  # not imported: it would raise
    assert not any(getattr(m, "__file__", None) == str(plain) for m in list(sys.modules.values()))
    for source in ("def custom_data_reader(data_origin):\n    pass\n",
                   "from reader_lib import *\n",
                   "from reader_lib import make as custom_data_reader\n",
                   "globals()['custom_data_reader'] = None\n"):
        maybe = tmp_path / f"maybe_{abs(hash(source))}.py"
        maybe.write_text("raise RuntimeError('imported')\n" + source)
        with pytest.raises(ModelDefError, match="importing the module failed"):  # it could define one: imported
            module_attribute(f"{maybe}:Model", "custom_data_reader")


def test_the_packages_a_module_surely_imports_are_read_from_its_source(tmp_path):
    """What `flextrain train` preloads for a module (cli/submission.py): its top-level imports, without importing it."""
    from flextrain.job.usermodule import top_level_imports

    module = tmp_path / "keras_like_xyz.py"
    module.write_text("raise RuntimeError('imported')\nimport tensorflow as tf, numpy.random\nfrom keras import layers\n"
                      "from . import sibling\nif False:\n    import torch\ndef f():\n    import jax\n")
    assert top_level_imports(f"{module}:Model") == {"tensorflow", "numpy", "keras"}  # not the nested ones
    assert top_level_imports(f"{tmp_path / 'absent.py'}:Model") == frozenset()
    assert top_level_imports("some_installed_package.models:Model") == frozenset()  # would need an import
