"""Data and checkpoints with known answers for the evaluation tests (see zoo/stepcount.py)."""

from __future__ import annotations

from pathlib import Path

STEPCOUNT = f"{Path(__file__).resolve().parent / 'zoo' / 'stepcount.py'}:Model"


def label(x: int) -> int:
    """Agrees with ``x % 3`` unless ``x`` is a multiple of 5: accuracy 0.8 over x = 0..99."""
    return x % 3 if x % 5 else (x + 1) % 3


def write_csv(path: Path, xs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{x},{label(x)}\n" for x in xs))
    return path


def stepcount_checkpoint(path: Path, *, version: int) -> Path:
    """A flextrain checkpoint of the stepcount model at ``version`` (b == -version)."""
    import torch

    from flextrain.elastic.statecodec import encode

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode({"model": {"b": torch.tensor(-float(version))}, "optimizer": {},
                             "version": version}))
    return path
