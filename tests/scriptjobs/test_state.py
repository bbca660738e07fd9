"""flextrain.elastic.state.State: what a script commits is what it gets back, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flextrain.elastic.state import COMMIT_FILE, STATE_FILE, State


def make(directory):
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, optimizer, State(directory=directory, model=model, optimizer=optimizer, step=0, epoch=0)


def test_restore_brings_back_the_committed_objects_and_values(tmp_path):
    model, optimizer, state = make(tmp_path)
    assert state.restore() is False  # nothing committed yet
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    state.step, state.epoch = 7, 2
    state.commit()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()  # after the commit: lost on restore
    state.step = 8

    fresh_model, fresh_opt, fresh = make(tmp_path)
    assert fresh.restore() is True
    assert (fresh.step, fresh.epoch, fresh.commits) == (7, 2, 1)
    for k, v in fresh_model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert fresh_opt.state_dict()["state"][0]["step"] == 1  # Adam's own state came back too
    assert json.loads((tmp_path / COMMIT_FILE).read_text()) == {"commit": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([STATE_FILE, COMMIT_FILE])  # no temp file left


def test_values_must_be_declared_and_objects_are_not_replaced(tmp_path):
    _, _, state = make(tmp_path)
    with pytest.raises(AttributeError, match="pass it to State"):
        state.steps = 1
    with pytest.raises(AttributeError, match="change it in place"):
        state.model = torch.nn.Linear(3, 2)


def test_restore_loads_tensors_and_plain_values_only(tmp_path):
    """weights_only: a state file holding an arbitrary object is refused, not unpickled."""
    torch.save({"commit": 1, "values": {"step": 3, "evil": Path("/etc")}, "objects": {}},
               tmp_path / STATE_FILE)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        State(directory=tmp_path, step=0).restore()
