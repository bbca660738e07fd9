"""auto_accelerate's semi-automatic mode on a small transformer language model and synthetic data.

ATorch's examples/auto_accelerate/train.py, adapted: only the import is flextrain's. The strategy is
built from flags, auto_accelerate applies it, and the ordinary loop trains with what it returns.

    python examples/accelerate_semi_auto.py --use_amp --use_checkpointing --use_module_replace
    python examples/accelerate_semi_auto.py --load_strategy_file strategy.json   # a saved strategy
    torchrun --nproc_per_node 2 examples/accelerate_semi_auto.py --distributed --use_fsdp --use_amp

Prints one JSON line (rank 0) with the strategy applied and the losses (the test reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from flextrain.compat.atorch import auto_accelerate  # was: from atorch.auto import auto_accelerate

VOCAB, SEQ = 32, 16


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.register_buffer("causal", torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.causal[: x.shape[1], : x.shape[1]])[0]
        return x + self.mlp(self.ln2(x))


class ToyGPT(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(torch.zeros(SEQ, dim))
        self.blocks = nn.Sequential(*(DecoderBlock(dim, heads) for _ in range(layers)))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.blocks(self.embed(input_ids) + self.pos[: input_ids.shape[1]]))


class CountingData(Dataset):
    """Sequences that count up modulo VOCAB from a random start: the next token is predictable."""

    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(0, VOCAB, (size, 1), generator=g)
        self.tokens = (starts + torch.arange(SEQ + 1)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i, :-1], "labels": self.tokens[i, 1:]}


def loss_func(inputs: dict[str, torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), inputs["labels"].reshape(-1))


def optim_grouped_param_func(model: nn.Module) -> list[dict]:
    return [{"params": [p for n, p in model.named_parameters() if "bias" not in n], "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if "bias" in n], "weight_decay": 0.0}]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasize", type=int, default=512)
    p.add_argument("--epoch", type=int, default=3)
    p.add_argument("--batchsize", type=int, default=32, help="the global batch")
    p.add_argument("--distributed", action="store_true")
    p.add_argument("--optim_grouped_params", action="store_true")
    p.add_argument("--use_fsdp", action="store_true", help="fsdp on CUDA, fsdp2 (fully_shard) on the CPU")
    p.add_argument("--use_amp", action="store_true")
    p.add_argument("--use_checkpointing", action="store_true")
    p.add_argument("--use_module_replace", action="store_true")
    p.add_argument("--load_strategy_file", help="a strategy saved as JSON, instead of the flags")
    p.add_argument("--save_strategy_to_file", help="write the strategy applied as JSON")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = ToyGPT()

    strategy = ["parallel_mode"] if args.distributed else []
    if args.use_module_replace:
        strategy.append("module_replace")
    if args.use_fsdp:
        wrap = {"atorch_wrap_cls": (DecoderBlock,)}
        strategy.append(("fsdp", {**wrap, "sync_module_states": True}) if torch.cuda.is_available() else ("fsdp2", wrap))
    if args.use_amp:
        bf16 = not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
        strategy.append(("amp_native", {"dtype": torch.bfloat16 if bf16 else torch.float16}))
    if args.use_checkpointing:
        strategy.append(("checkpoint", (DecoderBlock,)))

    status, res, best_strategy = auto_accelerate(
        model,
        optim_func=torch.optim.AdamW,
        dataset=CountingData(args.datasize),
        loss_func=loss_func,
        model_input_format="unpack_dict",
        optim_args={"lr": 3e-3},
        optim_param_func=optim_grouped_param_func if args.optim_grouped_params else None,
        dataloader_args={"batch_size": args.batchsize, "shuffle": True},
        load_strategy=args.load_strategy_file or strategy,
        ignore_dryrun_on_load_strategy=True,
        save_strategy_to_file=args.save_strategy_to_file,
    )
    assert status, "auto_accelerate failed"
    model, optim, dataloader, loss_func_, prepare_input = res.model, res.optim, res.dataloader, res.loss_func, \
        res.prepare_input

    losses = []
    for epoch in range(args.epoch):
        if hasattr(dataloader.sampler, "set_epoch"):
            dataloader.sampler.set_epoch(epoch)
        for batch in dataloader:
            optim.zero_grad()
            batch = prepare_input(batch, device)
            outputs = model(**batch)
            loss = loss_func_(batch, outputs)
            loss.backward()
            optim.step()
            losses.append(loss.item())

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps({"strategy": list(best_strategy.names), "skipped": [s.name for s in res.args.skipped],
                          "notes": list(res.args.notes), "loader_batch": dataloader.batch_size,
                          "steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}))
    if dist.is_initialized():
        dist.destroy_process_group()
        # Leave without interpreter teardown: with gloo, torch's threads sometimes abort it ('terminate
        # called without an active exception', exit -6) after all the work is done.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
