"""flextrain's InfinityBatch API: a logical batch of 2048 on a memory budget, with the summary,
the probe, evaluation, callbacks and the history file.

    python examples/infinity_batch.py                       # budget: what 256 samples need
    python examples/infinity_batch.py --memory-limit 4MB    # your own budget
    python examples/infinity_batch.py --history stats.csv   # per-epoch stats as CSV (or .json)

Prints the model summary, then one JSON line with what happened (the test reads it).
"""

from __future__ import annotations

import argparse
import json

import torch

from flextrain.elastic.memory import step_peak
from flextrain.elastic.probe import training_step
from flextrain.elastic.torch import InfinityBatch, summary


def demo_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-limit", help="bytes or e.g. 4MB (default: the peak of a 256-sample step)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--history", help="write the per-epoch stats here (.csv or .json)")
    args = p.parse_args()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 1, 16, 16, generator=g)
    quadrants = torch.stack([x[:, 0, r:r + 8, c:c + 8].mean(dim=(1, 2)) for r in (0, 8) for c in (0, 8)], dim=1)
    y = quadrants.argmax(dim=1)  # which quadrant is brightest: 4 classes
    loader = [(x[i:i + 2048], y[i:i + 2048]) for i in range(0, 8192, 2048)]  # logical batches of 2048
    model = demo_cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    print(summary(model, x[:2048], optimizer=optimizer, micro_batch_sizes=(64, 256, 2048)))

    limit = args.memory_limit
    if limit is None:  # what a 256-sample step needs, measured (the probe must then find ~256)
        step = training_step(model, optimizer, torch.nn.functional.cross_entropy, lambda m: (x[:m], y[:m]))
        limit = step_peak(lambda: step(256), baseline=step.baseline_bytes).peak_bytes

    seen = []

    class Progress:
        def on_epoch_end(self, ib, epoch, stats):
            seen.append(epoch)

    ib = InfinityBatch(max_micro_batch="auto", memory_limit=limit, model=model, optimizer=optimizer,
                       criterion=torch.nn.CrossEntropyLoss(), dataloader=loader, callbacks=[Progress()],
                       verbose=True)
    ib(args.epochs)
    if args.history:
        ib.history.save(args.history)
    metrics = ib.eval(metrics={"loss": torch.nn.functional.cross_entropy, "accuracy": "accuracy"})
    print(json.dumps({"memory_limit": ib.memory_limit if args.memory_limit else limit,
                      "micro_batch_size": ib.micro_batch_size, "probe_seconds": round(ib.probe.seconds, 3),
                      "epochs": seen, "losses": [h["loss"] for h in ib.history], "steps": ib.steps_done,
                      "eval": metrics}))


if __name__ == "__main__":
    main()
