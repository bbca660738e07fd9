"""How data reaches the model: the default ``prepare_input``, the model-input formats, the loss check,
and the data loader over the data-parallel world.

``dataloader_args["batch_size"]`` is the *global* batch ``G`` (strong scaling, as ATorch). Over a
world of ``W`` processes it is split by flextrain's planner
(:meth:`flextrain.elastic.session.Session.plan_for`, one micro-batch per process per step):

- ``W == 1``: a plain ``DataLoader(dataset, batch_size=G, **dataloader_args)``;
- ``G`` divisible by ``W``: each process gets a ``DistributedSampler`` (or
  ``distributed_sampler_cls``) with the loader's ``shuffle``/``drop_last`` and ``G/W`` per batch;
- otherwise: :class:`GlobalBatchSampler` cuts every global batch of ``G`` samples (one order on
  every process) into the planner's uneven slices (``G=10`` over 3: 4, 3, 3), so every process
  makes the same number of steps and a step holds exactly ``G`` samples; the returned
  ``loss_func`` then weights each process's gradient by its share (:class:`UnevenLoss`), so
  that DDP's average is the exact mean over the ``G`` samples. A custom distributed
  sampler cannot do that (it gives every process the same number of samples): that case is an
  error naming ``distributed_sampler_cls``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from flextrain.accelerate.errors import AccelerateError
from flextrain.elastic.session import ElasticInitError, Session
from flextrain.elastic.world import World

MODEL_INPUT_FORMATS = (None, "unpack_sequence", "unpack_dict")
_LOADER_ARGS = frozenset(inspect.signature(DataLoader.__init__).parameters) - {"self", "dataset"}


def to_device(data: Any, device: Any) -> Any:
    """The default ``prepare_input``: ``data`` with every tensor in it (nested in dicts, lists, tuples
    and named tuples) moved to ``device``; anything else unchanged."""
    return map_tensors(data, lambda t: t.to(device, non_blocking=True))


def map_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``data`` with ``fn`` applied to every tensor in it (same nesting rules as :func:`to_device`)."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return {k: map_tensors(v, fn) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(v, fn) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(map_tensors(v, fn) for v in data)
    return data


def check_input(data: Any, model_input_format: str | None) -> Any:
    """``data`` if its structure fits ``model_input_format`` (a mapping for ``"unpack_dict"``, a
    list/tuple for ``"unpack_sequence"``); else AccelerateError naming the arguments involved."""
    if model_input_format == "unpack_dict" and not isinstance(data, Mapping):
        raise AccelerateError(f"model_input_format='unpack_dict' calls model(**data), but the dataset (after "
                              f"prepare_input) gave a {type(data).__name__}: make the dataset yield dicts or change "
                              "model_input_format")
    if model_input_format == "unpack_sequence" and not isinstance(data, list | tuple):
        raise AccelerateError(f"model_input_format='unpack_sequence' calls model(*data), but the dataset (after "
                              f"prepare_input) gave a {type(data).__name__}: make the dataset yield tuples or change "
                              "model_input_format")
    return data


def call_model(model: Callable[..., Any], data: Any, model_input_format: str | None) -> Any:
    """The model's output for a batch, passed as ATorch's ``model_input_format`` says."""
    if model_input_format == "unpack_dict":
        return model(**data)
    if model_input_format == "unpack_sequence":
        return model(*data)
    return model(data)


def loss_of(result: Any) -> torch.Tensor:
    """The loss in what ``loss_func`` returned: a scalar tensor, or a list/tuple whose first item is
    one. Anything else raises AccelerateError naming ``loss_func``."""
    loss = result[0] if isinstance(result, list | tuple) and result else result
    if not isinstance(loss, torch.Tensor):
        raise AccelerateError(f"loss_func must return a scalar loss tensor (or a tuple whose first item is one), "
                              f"got {type(loss).__name__}")
    if loss.numel() != 1:
        raise AccelerateError(f"loss_func must return a scalar loss (or a tuple whose first item is one), got a "
                              f"tensor of shape {tuple(loss.shape)}: reduce it, e.g. with .mean()")
    return loss


class _WeightGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


class UnevenLoss:
    """``loss_func`` for processes whose batches differ in size (an uneven global batch): the loss's
    gradient is weighted by ``local samples * processes / global samples`` (one all-reduce of the
    sample count per step), so that DDP's average over processes is the exact mean over the
    global batch. The loss's value is unchanged."""

    def __init__(self, loss_func: Callable[..., Any], processes: int) -> None:
        self.loss_func, self.processes = loss_func, processes

    def __call__(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        result = self.loss_func(data, *args, **kwargs)
        loss = loss_of(result)
        leaves = [t for t in torch.utils._pytree.tree_leaves(data) if isinstance(t, torch.Tensor) and t.dim() > 0]
        if not leaves:
            return result
        count = torch.tensor([float(leaves[0].shape[0])], device=loss.device if loss.is_cuda else "cpu")
        local = float(count)
        dist.all_reduce(count)
        weighted = _WeightGrad.apply(loss, local * self.processes / float(count))
        if hasattr(result, "_fields"):
            return result._replace(**{result._fields[0]: weighted})
        if isinstance(result, list | tuple):
            return type(result)([weighted, *result[1:]])
        return weighted


class GlobalBatchSampler(Sampler[list[int]]):
    """Rank ``rank``'s share of every global batch: one index order on every process (shuffled
    with ``seed + epoch``), cut into global batches of ``global_batch``, each split by the planner.
    The last, short global batch is re-planned over the world (padded from the start of the order
    when it has fewer samples than processes), or dropped with ``drop_last``. Each pass advances
    the epoch (``set_epoch`` sets it, as for ``DistributedSampler``)."""

    def __init__(self, size: int, global_batch: int, world: World, *, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False) -> None:
        self.size, self.global_batch, self.world = size, global_batch, world
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size // self.global_batch if self.drop_last else math.ceil(self.size / self.global_batch)

    def _share(self, batch: list[int]) -> list[int]:
        n, w = len(batch), self.world.processes
        if n < w:
            batch = (batch * math.ceil(w / n))[:w]
            n = w
        plan = Session.plan_for(n, math.ceil(n / w), self.world).plan
        start, end = plan.span(self.world.rank)
        return batch[start:end]

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=g).tolist()
        else:
            order = list(range(self.size))
        self.epoch += 1  # the next pass reshuffles, set_epoch or not (every process iterates alike)
        for i in range(len(self)):
            yield self._share(order[i * self.global_batch:(i + 1) * self.global_batch])


def _plan(global_batch: int, world: World) -> Session:
    try:
        return Session.plan_for(global_batch, math.ceil(global_batch / world.processes), world)
    except ElasticInitError as e:
        raise AccelerateError(f'dataloader_args["batch_size"] is the global batch: {e}') from None


def build_dataloader(dataset: Any, dataloader_args: Mapping[str, Any] | None, world: World, *,
                     distributed_sampler_cls: Any = None, seed: int = 0) -> tuple[DataLoader, Session]:
    """This process's loader for ``dataset`` and the plan it follows (module docstring)."""
    args = dict(dataloader_args or {})
    unknown = sorted(set(args) - _LOADER_ARGS)
    if unknown:
        raise AccelerateError(f"dataloader_args has {unknown[0]!r}, which DataLoader does not take")
    G = args.pop("batch_size", 1)
    if isinstance(G, bool) or not isinstance(G, int) or G < 1:
        raise AccelerateError(f'dataloader_args["batch_size"] (the global batch) must be a positive integer, got {G!r}')
    world = World(processes=world.processes, rank=world.rank, devices_per_process=1, source=world.source)
    session = _plan(G, world)
    if world.processes == 1:
        return DataLoader(dataset, batch_size=G, **args), session
    for key in ("sampler", "batch_sampler"):
        if args.get(key) is not None:
            raise AccelerateError(f'dataloader_args["{key}"] cannot be used with {world.processes} processes: '
                                  "flextrain shards the data itself; give distributed_sampler_cls for your own "
                                  "distributed sampler")
    shuffle, drop_last = bool(args.pop("shuffle", False)), bool(args.pop("drop_last", False))
    if isinstance(dataset, IterableDataset):  # shards itself (by rank): only the batch size is ours
        return DataLoader(dataset, batch_size=session.batch_size, drop_last=drop_last, **args), session
    if session.even:
        cls = distributed_sampler_cls or DistributedSampler
        sampler = cls(dataset, num_replicas=world.processes, rank=world.rank, shuffle=shuffle, seed=seed,
                      drop_last=drop_last)
        return DataLoader(dataset, batch_size=session.batch_size, sampler=sampler, drop_last=drop_last, **args), session
    if distributed_sampler_cls is not None:
        raise AccelerateError(f'dataloader_args["batch_size"]={G} does not split evenly over {world.processes} '
                              "processes, and distributed_sampler_cls gives every process the same number of "
                              "samples: use a multiple of the process count, or leave distributed_sampler_cls "
                              "unset (flextrain then splits every global batch unevenly, exactly)")
    sampler = GlobalBatchSampler(len(dataset), G, world, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_sampler=sampler, **args), session


def first_sample(dataset: Any) -> Any:
    """One sample of ``dataset`` (``dataset[0]``, else the first it yields); None when it has none."""
    if isinstance(dataset, Sequence) or (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
                                          and not isinstance(dataset, IterableDataset)):
        return dataset[0] if len(dataset) else None
    return next(iter(dataset), None)


__all__ = ["GlobalBatchSampler", "UnevenLoss", "MODEL_INPUT_FORMATS", "build_dataloader", "call_model", "check_input",
           "first_sample", "loss_of", "map_tensors", "to_device"]
