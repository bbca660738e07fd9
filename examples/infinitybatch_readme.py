"""infinitybatch's README, its three use cases as written, with only the import line changed.

    python examples/infinitybatch_readme.py                          # EPOCHS=200 as in the README
    FLEXTRAIN_MEMORY_LIMIT=64MB python examples/infinitybatch_readme.py   # micro-batches probed
    EPOCHS=2 FLEXTRAIN_MAX_MICRO_BATCH=128 python examples/infinitybatch_readme.py  # the test

The README assumes "you already have a model and a dataloader": ``MyModel`` and
``mydataloader`` below are a small classifier and batches of 512 synthetic samples. Each use
case's lines are the README's (``ib.optimier`` included); the batch stays whole in host memory
and runs on the device in micro-batches: ``InfinityBatch()`` takes its ``max_micro_batch`` and
``memory_limit`` from FLEXTRAIN_MAX_MICRO_BATCH / FLEXTRAIN_MEMORY_LIMIT when not given, so the
script needs no change. Prints one JSON line per use case.
"""

from __future__ import annotations

import json
import os

import torch

from flextrain.compat import infinitybatch  # was: import infinitybatch

EPOCHS = int(os.environ.get("EPOCHS", "200"))


class MyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


g = torch.Generator().manual_seed(0)
_x = torch.randn(2048, 20, generator=g)
_y = (_x[:, :4].argmax(dim=1))  # a learnable rule
mydataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(_x, _y), batch_size=512, shuffle=True,
                                           generator=g)


def simple_use_case() -> infinitybatch.InfinityBatch:
    torch.manual_seed(0)
    # Making device agnostic codes in deep learning is essential.
    device = torch.device('cuda') if torch.cuda.is_available() else torch.device('cpu')

    ib = infinitybatch.InfinityBatch()
    ib.model = MyModel().to(device)
    ib.criterion = torch.nn.CrossEntropyLoss()
    ib.optimier = torch.optim.Adam(ib.model.parameters())
    ib.dataloader = mydataloader

    ib(EPOCHS)  # Making a 200 epoch long training is rarely that easy though.
    return ib


def epoch_use_case() -> infinitybatch.InfinityBatch:
    torch.manual_seed(0)
    device = torch.device('cuda') if torch.cuda.is_available() else torch.device('cpu')

    ib = infinitybatch.InfinityBatch()
    ib.model = MyModel().to(device)
    ib.criterion = torch.nn.CrossEntropyLoss()
    ib.optimier = torch.optim.Adam(ib.model.parameters())
    ib.dataloader = mydataloader

    for epoch in range(EPOCHS):
        # Additional code can be added here...
        ib.epoch()
        # And also here...
    return ib


def custom_use_case() -> infinitybatch.InfinityBatch:
    torch.manual_seed(0)
    device = torch.device('cuda') if torch.cuda.is_available() else torch.device('cpu')

    ib = infinitybatch.InfinityBatch()
    ib.model = MyModel().to(device)
    ib.criterion = torch.nn.CrossEntropyLoss()
    ib.optimier = torch.optim.Adam(ib.model.parameters())
    ib.dataloader = mydataloader

    for epoch in range(EPOCHS):
        # Additional code can be added here...
        for inputs, targets in ib.dataloader:
            # And here...
            outputs = ib.batch_()
            # And here...
            loss = ib.criterion(outputs, targets)
            # And here...
            loss.backward()
            # And here...
            ib.step()
            # And here...
            ib.zero_grad()
            # And here...
        # And also here.
    return ib


if __name__ == "__main__":
    for case in (simple_use_case, epoch_use_case, custom_use_case):
        ib = case()
        accuracy = ib.eval(mydataloader, metrics={"accuracy": "accuracy"})["accuracy"]
        print(json.dumps({"use_case": case.__name__, "steps": ib.steps_done, "epochs": len(ib.history),
                          "first_loss": ib.history[0]["loss"] if ib.history else None,
                          "last_loss": ib.history[-1]["loss"] if ib.history else None,
                          "micro_batch_size": ib.micro_batch_size, "accuracy": accuracy}))
