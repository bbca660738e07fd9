"""AIkit's PyTorch use case, run by flextrain: only the import line differs from an AIkit script.

    python examples/aikit_torch.py

(AIkit: ``import aikit.elastic.Torch`` and ``import aikit.ga.Torch``.) As in AIkit, the GA
optimizer sums the micro-steps' gradients (pass ``reduction="mean"`` for the global-batch mean).
"""

import json

import torch

from flextrain.compat import aikit
from _synthetic import dataset, loss_fn, model

aikit.elastic.Torch.init(256, 64)

model = model()
model = torch.nn.DataParallel(model)
loader = torch.utils.data.DataLoader(dataset(2048), batch_size=aikit.elastic.batch_size, shuffle=True,
                                     generator=torch.Generator().manual_seed(1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.025)
optimizer = aikit.ga.Torch.optim.Optimizer(optimizer, aikit.elastic.steps)

losses = []
for epoch in range(3):
    total, seen = 0.0, 0
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total, seen = total + loss.item() * len(x), seen + len(x)
    losses.append(total / seen)

if aikit.elastic.master:
    print(json.dumps({"steps": aikit.elastic.steps, "batch_size": aikit.elastic.batch_size,
                      "global_batch_size": aikit.elastic.global_batch_size, "gpus": aikit.elastic.gpus,
                      "master": aikit.elastic.master, "losses": losses}))
