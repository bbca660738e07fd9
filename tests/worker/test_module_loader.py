"""load_model_def: the model-zoo module contract and its error messages."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from flextrain.worker.module import ModelDef, ModelDefError, load_model_def

GOOD = """
import torch

def Model():
    return torch.nn.Linear(4, 2)

def loss(labels, predictions):
    return torch.nn.functional.mse_loss(predictions, labels)

def optimizer(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr)

def feed(records, mode, metadata):
    x = torch.ones(len(records), 4)
    return x, torch.zeros(len(records), 2)
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def replace_def(text: str, name: str, new: str) -> str:
    """Replace the `def name(...)` block of GOOD with `new` (empty: delete it)."""
    lines = text.splitlines()
    out, skipping = [], False
    for line in lines:
        if line.startswith(f"def {name}("):
            skipping = True
            if new:
                out.append(new)
            continue
        if skipping and (line.startswith(" ") or not line.strip()):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out) + "\n"


def load_error(path: Path, callable_name: str = "Model") -> str:
    with pytest.raises(ModelDefError) as info:
        load_model_def(f"{path}:{callable_name}")
    return str(info.value)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# ---- success ------------------------------------------------------------------
def test_load_path_py_name(tmp_path):
    path = write(tmp_path, "good_model.py", GOOD)
    md = load_model_def(f"{path}:Model")
    assert isinstance(md, ModelDef)
    assert md.path == str(path.resolve())
    model = md.build_model()
    assert model.in_features == 4
    opt = md.build_optimizer(model, lr=0.25)
    assert opt.param_groups[0]["lr"] == 0.25
    assert md.build_optimizer(model, None).param_groups[0]["lr"] == 0.1
    feats, labels = md.feed([b"a", b"b", b"c"], "training", None)
    assert feats.shape == (3, 4) and labels.shape == (3, 2)
    assert md.eval_metrics_fn is None and md.callbacks is None
    assert md.metric_fns() == {}


def test_load_relative_path_from_cwd(tmp_path, monkeypatch):
    write(tmp_path, "zoo/rel_model.py", GOOD)
    monkeypatch.chdir(tmp_path)
    md = load_model_def("zoo/rel_model.py:Model")
    assert md.module.__file__ == str((tmp_path / "zoo" / "rel_model.py").resolve())


def test_load_package_module_name(tmp_path, monkeypatch):
    pkg = unique("ftzoo")
    write(tmp_path, f"{pkg}/__init__.py", "")
    write(tmp_path, f"{pkg}/mymodel.py", GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    md = load_model_def(f"{pkg}.mymodel:Model")
    assert md.module.__name__ == f"{pkg}.mymodel"
    assert md.build_model().out_features == 2


def test_load_elasticdl_dotted_spelling(tmp_path, monkeypatch):
    pkg = unique("edlzoo")
    write(tmp_path, f"{pkg}/mnist_model.py", GOOD)  # no __init__.py needed: resolved as a path
    monkeypatch.chdir(tmp_path)
    md = load_model_def(f"{pkg}.mnist_model.Model")
    assert Path(md.module.__file__) == (tmp_path / pkg / "mnist_model.py").resolve()
    assert md.model_fn is md.module.Model


def test_dataset_fn_is_accepted_as_feed_alias(tmp_path):
    text = replace_def(GOOD, "feed", "def dataset_fn(records, mode, metadata):\n    return records, records")
    path = write(tmp_path, "alias_model.py", text)
    md = load_model_def(f"{path}:Model")
    assert md.feed is md.module.dataset_fn


def test_optional_pieces_are_picked_up(tmp_path):
    text = GOOD + textwrap.dedent("""
    def eval_metrics_fn():
        return {"acc": lambda labels, predictions: (labels == predictions).float()}

    def callbacks():
        return []
    """)
    path = write(tmp_path, "opt_model.py", text)
    md = load_model_def(f"{path}:Model")
    assert set(md.metric_fns()) == {"acc"}
    assert md.callbacks is md.module.callbacks


def test_optimizer_with_kwargs_is_accepted(tmp_path):
    text = replace_def(GOOD, "optimizer",
                       "def optimizer(params, **kw):\n    return torch.optim.SGD(params, lr=kw.get('lr', 0.1))")
    path = write(tmp_path, "kw_model.py", text)
    md = load_model_def(f"{path}:Model")
    assert md.build_optimizer(md.build_model(), 0.5).param_groups[0]["lr"] == 0.5


# ---- errors naming the file and the missing piece ----------------------------------
def test_missing_loss(tmp_path):
    path = write(tmp_path, "noloss.py", replace_def(GOOD, "loss", ""))
    msg = load_error(path)
    assert str(path.resolve()) in msg
    assert "defines no `loss`" in msg and "loss(labels, predictions)" in msg


@pytest.mark.parametrize("sig", ["loss(predictions)", "loss(a, b, c)", "loss()"])
def test_loss_with_wrong_arity(tmp_path, sig):
    path = write(tmp_path, "badloss.py", replace_def(GOOD, "loss", f"def {sig}:\n    return 0"))
    msg = load_error(path)
    assert str(path.resolve()) in msg
    assert "`loss` has the wrong signature" in msg and "expected loss(labels, predictions)" in msg


def test_loss_with_default_third_argument_is_fine(tmp_path):
    path = write(tmp_path, "okloss.py", replace_def(GOOD, "loss", "def loss(a, b, weight=1.0):\n    return 0"))
    assert load_model_def(f"{path}:Model").loss is not None


def test_loss_not_callable(tmp_path):
    path = write(tmp_path, "strloss.py", replace_def(GOOD, "loss", "loss = 'mse'"))
    msg = load_error(path)
    assert str(path.resolve()) in msg and "`loss` must be a function" in msg and "str" in msg


def test_missing_feed(tmp_path):
    path = write(tmp_path, "nofeed.py", replace_def(GOOD, "feed", ""))
    msg = load_error(path)
    assert str(path.resolve()) in msg
    assert "defines no `feed`" in msg and "feed(records, mode, metadata)" in msg


def test_feed_wrong_arity(tmp_path):
    path = write(tmp_path, "badfeed.py", replace_def(GOOD, "feed", "def feed(records):\n    return records"))
    msg = load_error(path)
    assert "`feed` has the wrong signature" in msg


def test_missing_optimizer(tmp_path):
    path = write(tmp_path, "noopt.py", replace_def(GOOD, "optimizer", ""))
    msg = load_error(path)
    assert str(path.resolve()) in msg and "defines no `optimizer`" in msg


def test_optimizer_without_lr(tmp_path):
    path = write(tmp_path, "nolr.py", replace_def(GOOD, "optimizer",
                                                  "def optimizer(params):\n    return torch.optim.SGD(params, 0.1)"))
    msg = load_error(path)
    assert str(path.resolve()) in msg
    assert "`optimizer` must accept an `lr` keyword" in msg


def test_model_def_names_missing_attribute(tmp_path):
    path = write(tmp_path, "nomodel.py", GOOD)
    msg = load_error(path, "Missing")
    assert str(path.resolve()) in msg
    assert "defines no `Missing`" in msg and "--model-def" in msg


def test_model_def_names_no_callable(tmp_path):
    path = write(tmp_path, "foo.py", GOOD)
    with pytest.raises(ModelDefError) as info:
        load_model_def(str(path))
    assert "names no callable" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(ModelDefError, match="names no callable"):
        load_model_def("foo")
    with pytest.raises(ModelDefError, match="names no callable"):
        load_model_def(f"{path}:")


def test_model_attribute_not_callable(tmp_path):
    path = write(tmp_path, "intmodel.py", replace_def(GOOD, "Model", "Model = 3"))
    msg = load_error(path)
    assert "`Model` is a int, not a callable" in msg
    assert str(path) in msg


def test_module_import_error(tmp_path):
    path = write(tmp_path, "broken.py", GOOD + "\nraise RuntimeError('no GPU here')\n")
    msg = load_error(path)
    assert str(path.resolve()) in msg
    assert "importing the module failed" in msg and "no GPU here" in msg
    # a failed import leaves nothing half-initialised behind: fixing the file makes it load
    path.write_text(textwrap.dedent(GOOD))
    assert load_model_def(f"{path}:Model").build_model().in_features == 4


def test_module_syntax_error(tmp_path):
    path = write(tmp_path, "syntax.py", "def Model(:\n")
    msg = load_error(path)
    assert str(path.resolve()) in msg and "SyntaxError" in msg


def test_file_not_found(tmp_path):
    path = tmp_path / "missing_model.py"
    msg = load_error(path)
    assert "not found" in msg and str(path) in msg


def test_package_module_not_importable():
    name = unique("no_such_pkg")
    with pytest.raises(ModelDefError) as info:
        load_model_def(f"{name}.model:Model")
    assert "cannot import module" in str(info.value) and name in str(info.value)


def test_elasticdl_mode_import_resolves(tmp_path):
    text = "from elasticdl.python.common.constants import Mode\n" + GOOD
    path = write(tmp_path, "edl_style.py", text)
    md = load_model_def(f"{path}:Model")
    assert md.module.Mode.TRAINING == "training"


# ---- record_batch ---------------------------------------------------------------
def test_record_batch_true_is_picked_up_and_off_by_default(tmp_path):
    assert load_model_def(f"{write(tmp_path, 'rb_model.py', GOOD + 'record_batch = True')}:Model").record_batch
    assert not load_model_def(f"{write(tmp_path, 'plain_model.py', GOOD)}:Model").record_batch


def test_record_batch_that_is_not_a_bool_is_refused(tmp_path):
    err = load_error(write(tmp_path, "rb_bad_model.py", GOOD + "record_batch = 'yes'"))
    assert "`record_batch` must be True or False" in err and "'yes'" in err


def test_record_batch_in_a_tensorflow_module_is_refused(tmp_path):
    tf_like = """
    def Model():
        return None

    def loss(labels, predictions):
        return 0

    def optimizer(lr=0.1):
        return None

    def feed(dataset, mode, metadata):
        return dataset

    record_batch = True
    """
    err = load_error(write(tmp_path, "rb_tf_model.py", tf_like))
    assert "`record_batch = True` is for PyTorch modules" in err
