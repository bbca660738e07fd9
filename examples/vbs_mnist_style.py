"""elastic-learning-rate-evaluation's MNIST training, on sklearn's 8x8 digits, run by flextrain.

    python examples/vbs_mnist_style.py
    torchrun --standalone --nproc-per-node 2 examples/vbs_mnist_style.py

The seed's usage (its README and variable_train_mnist.py: CustomSampler, LinearRuleOptimizer,
set_epoch on both each epoch, no zero_grad needed) with only its import line changed (the seed:
``import variable_batch_size as vbs``). XLA's device, loader and ``xm`` calls are replaced by
plain CPU PyTorch and torch.distributed (gloo) under torchrun; the data is sklearn's digits (no
download). Rank 0 prints one JSON line at the end.
"""

import json
import logging
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits

import flextrain.compat.vbs as vbs

FLAGS = dict(batch_size=16, momentum=0.9, lr=0.1, num_epochs=10, log_steps=20, ref_batchsize=128)


class MNIST(nn.Module):  # the seed's model, sized for 8x8 images (no BatchNorm: ranks share no stats)

    def __init__(self):
        super(MNIST, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(80, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def digits():
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(y, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    x, y = x[order], y[order]
    return (torch.utils.data.TensorDataset(x[:1500], y[:1500]),
            torch.utils.data.TensorDataset(x[1500:], y[1500:]))


def write_trace(path):
    # The global batch grows 32 -> 64 -> 128 -> 256 (a multiple of batch_size x replicas for 1 or 2)
    sizes = [32] * 30 + [64] * 20 + [128] * 10 + [256]
    with open(path, "w") as f:
        f.write("step,batchsize\n" + "".join(f"{i}, {s}\n" for i, s in enumerate(sizes)))


def train_mnist(flags):
    torch.manual_seed(1)
    world_size, ordinal = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    train_dataset, test_dataset = digits()
    trace = os.path.join(tempfile.mkdtemp(), "trace.csv")
    write_trace(trace)

    train_sampler = vbs.CustomSampler(
      dataset_size=len(train_dataset),
      trace=trace,
      num_replicas=world_size,
      rank=ordinal,
      minibatch_size=flags["batch_size"])
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=64, shuffle=False)

    model = MNIST()
    internal_optimizer = optim.SGD(model.parameters(), lr=flags["lr"], momentum=flags["momentum"])
    optimizer = vbs.LinearRuleOptimizer(
      internal_optimizer,
      train_sampler,
      ref_batchsize=flags["ref_batchsize"],
      log_steps=flags["log_steps"])
    loss_fn = nn.NLLLoss()

    def train_loop_fn(loader):
        model.train()
        for data, target in loader:
            optimizer.zero_grad()  # has no effect: the optimizer zeroes itself
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()

    def test_loop_fn(loader):
        model.eval()
        correct, total, loss = 0, 0, 0.0
        with torch.no_grad():
            for data, target in loader:
                output = model(data)
                loss += float(F.nll_loss(output, target, reduction="sum"))
                correct += int(output.argmax(1).eq(target).sum())
                total += len(data)
        return 100.0 * correct / total, loss / total

    accuracies, losses = [], []
    for epoch in range(flags["num_epochs"]):
        train_sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        train_loop_fn(train_loader)
        accuracy, loss = test_loop_fn(test_loader)
        accuracies.append(accuracy)
        losses.append(loss)
        if ordinal == 0:
            logging.info("Epoch %d test end, Accuracy=%.2f", epoch + 1, accuracy)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"world_size": world_size, "rank": ordinal, "accuracy": accuracies, "test_loss": losses,
            "steps": optimizer.last_step + 1, "real_steps": optimizer.real_steps, "last_batch": optimizer.last_batch,
            "lr": optimizer.last_lr, "checksum": checksum}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    result = train_mnist(FLAGS)
    print(json.dumps(result), flush=True)  # one write per rank: lines never interleave
    if dist.is_initialized():
        dist.destroy_process_group()
    # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate called
    # without an active exception', exit -6) after all the work is done, even for plain DDP scripts.
        os._exit(0)
