"""What a worker checks on every step: the loss the contract wants, and gradients that are finite."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flextrain.worker.backend import all_finite
from flextrain.worker.pytorch import TorchBackend, check_loss
from flextrain.worker.module import ModelDefError

MODULE = SimpleNamespace(path="/zoo/m.py")


@pytest.mark.parametrize("tensors,finite", [
    ([torch.ones(4), torch.ones(2, dtype=torch.float64)], True),
    ([torch.full((8,), 60000.0, dtype=torch.float16)], True),  # the sum overflows float16, the values do not
    ([torch.full((4,), 1e300, dtype=torch.float64)], True),  # ... nor float32
    ([torch.ones(3), torch.tensor([0.0, float("nan")])], False),
    ([torch.tensor([float("-inf")], dtype=torch.bfloat16)], False),
    ([], True),
])
def test_all_finite(tensors, finite):
    assert all_finite(tensors) is finite


@pytest.mark.parametrize("loss,expected", [
    (torch.ones(4, requires_grad=True), "returned a tensor of shape (4,) for 4 samples"),
    (torch.tensor(1.0), "does not require grad"),
    (1.0, "returned float, expected a scalar torch.Tensor"),
])
def test_a_loss_breaking_the_contract_is_named(loss, expected):
    with pytest.raises(ModelDefError) as caught:
        check_loss(MODULE, loss, samples=4)
    assert str(caught.value).startswith("/zoo/m.py: loss(labels, predictions) ") and expected in str(caught.value)


def test_the_backend_sees_a_nan_gradient_before_and_after_gathering():
    model = torch.nn.Linear(3, 1)
    backend = TorchBackend(model_def=MODULE, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           extra=4)
    backend.zero()
    model(torch.tensor([[1.0, float("nan"), 0.0]])).sum().backward()
    assert not backend.finite()  # a lone worker: the gradients are in p.grad
    backend.gathered()
    assert not backend.finite()  # about to be reduced: in the per-dtype buffers
    backend.zero()
    model(torch.ones(1, 3)).sum().backward()
    assert backend.finite()
