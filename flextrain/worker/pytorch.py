"""PyTorch: the model backend, the predictor, the torch feed and the module checks.

What :mod:`flextrain.worker.frameworks` hands out for a PyTorch module; the
Keras counterparts live in ``flextrain/worker/tf/``. Framework-neutral code
(the trainers, evaluation, preflight) reaches these through the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from flextrain.worker.backend import FLOAT_DTYPES, ModelBackend, all_finite, gradient_buffers, sqr_sum
from flextrain.worker.buckets import BucketReducer, Launch, plan_buckets
from flextrain.worker.contract import FeedMetadata, Mode, ModelDefError, raised, returned
from flextrain.worker.evaluation import Predictor

if TYPE_CHECKING:  # module.py reaches this module through the registry; ModelDef is only a type here
    from flextrain.worker.module import ModelDef


def check_model(model, *, where: str):
    """The model callable's result (``where`` names it): a torch.nn.Module with trainable parameters."""
    if not isinstance(model, torch.nn.Module):
        raise ModelDefError(f"{where} returned {returned(model)}, expected a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelDefError(
            f"{where} returned a model ({type(model).__name__}) with no trainable "
            "parameters: there is nothing to train (create layers or nn.Parameter attributes in __init__)")
    return model


def build_optimizer(optimizer_fn, model, kwargs: dict, *, where: str):
    """``optimizer(model.parameters(), **kwargs)``, checked to be a torch.optim.Optimizer."""
    call = f"optimizer(params{''.join(f', {k}={v!r}' for k, v in kwargs.items())})"
    try:
        optimizer = optimizer_fn(model.parameters(), **kwargs)
    except Exception as exc:
        raise ModelDefError(f"{where}: {call} raised {raised(exc)}") from exc
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ModelDefError(f"{where}: {call} returned {returned(optimizer)}, expected a "
                            "torch.optim.Optimizer (e.g. return torch.optim.SGD(params, lr=lr))")
    return optimizer


def feed_tensors(model_def: ModelDef, records: list[bytes], mode: Mode, meta: FeedMetadata):
    """Call the module's ``feed`` and check what it returned."""
    out = model_def.feed(records, mode.value, meta)
    if mode is Mode.PREDICTION:
        features, labels = out, None
    else:
        if not isinstance(out, tuple) or len(out) != 2:
            raise ModelDefError(
                f"{model_def.path}: feed(records, {mode.value!r}, metadata) must return "
                f"(features, labels), got {type(out).__name__}"
            )
        features, labels = out
    n = len(records)
    for what, value in (("features", features), ("labels", labels)):
        tensors = value.values() if isinstance(value, dict) else [] if value is None else [value]
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.shape[:1] != (n,):
                raise ModelDefError(
                    f"{model_def.path}: feed returned {what} "
                    f"{type(t).__name__}{tuple(getattr(t, 'shape', ()))}; expected tensors whose "
                    f"first dimension is the number of records ({n})"
                )
    return features, labels


def take(value, index: slice):
    if isinstance(value, dict):
        return {k: v[index] for k, v in value.items()}
    return value[index]



class TorchBackend(ModelBackend):
    """``torch.nn.Module`` + ``torch.optim``; ``p.grad`` becomes a view into its dtype's buffer when reduced.

    Like ``optimizer.zero_grad(set_to_none=True)`` in a plain loop, a step starts without
    gradients, so its first backward writes fresh ones: zeroing the buffers and adding into
    them would cost two passes over every gradient per step. :meth:`gathered` copies them into
    the buffers only when a reduction needs them there (one pass); a lone worker never copies.
    """

    def __init__(self, *, model_def: ModelDef, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: int, compute=None) -> None:
        """``compute``: how a micro-batch runs when the job has a training strategy (``--accelerate``: a
        :class:`flextrain.worker.accelerating.JobAcceleration`): its ``forward(features)`` and ``loss(labels,
        predictions)`` replace ``model(features)`` and the module's loss; ``model`` is then the strategy's
        core module, whose parameters, ``state_dict`` and checkpoints are the plain model's."""
        self.model_def, self.model, self.optimizer = model_def, model, optimizer
        self.compute = compute
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for name, p in named:
            if p.dtype not in FLOAT_DTYPES:
                raise ModelDefError(f"{model_def.path}: parameter {name!r} is {p.dtype}; trainable parameters "
                                    "must be float32, float64, bfloat16 or float16")
        self.params = [p for _, p in named]
        self.size = sum(p.numel() for p in self.params)
        # Laid out in reverse parameter order (the order backward produces gradients): a bucket of
        # the overlapped reduction is one slice, and the first parameters end where the slots begin.
        self.buffers, views, self.slots = gradient_buffers([(p.dtype, p.numel()) for p in self.params[::-1]], extra)
        views = views[::-1]
        self._views = [view.view_as(p) for p, view in zip(self.params, views)]
        self._extra = extra
        self.reducer: BucketReducer | None = None  # set by overlap(): buckets reduced during backward
        self._gathered = False  # the step's gradients are in the buffers (not only in p.grad)
        # The model was put in training mode (recursively) and nothing of ours changed it since: a
        # Predictor restores the mode it found, load_state() clears this (as before, every training
        # micro-batch runs in training mode; a module's own forward may still switch submodules).
        self._train_mode = False
        # As built: what --lr-rule scales (none without an optimizer: evaluation, prediction).
        self._base_lrs = [group["lr"] for group in optimizer.param_groups] if optimizer is not None else []

    def measure_micro_batches(self) -> None:
        """Keep :attr:`micro_sqr` from a hook on every parameter: autograd calls it with this
        backward's gradient of the parameter *before* adding it to ``p.grad``, so it sees each
        micro-batch's contribution alone. No snapshot, no second buffer: one float64-accumulated
        norm per parameter per micro-batch, of a gradient that was just written (still in cache)."""
        if self.micro_sqr is not None:
            return
        self._norms: list[torch.Tensor] = []  # this backward's ‖contribution‖ per parameter
        self.micro_sqr = torch.zeros((), dtype=torch.float64, device=self.params[0].device if self.params else None)
        for p in self.params:
            p.register_hook(self._measure)

    def _measure(self, grad: torch.Tensor) -> None:
        values = grad.coalesce()._values() if grad.is_sparse else grad  # duplicates summed first: exact
        self._norms.append(torch.linalg.vector_norm(values, dtype=torch.float64).to(self.micro_sqr.device))

    def grad_sqr(self) -> float:
        if self._gathered:
            return super().grad_sqr()
        return sqr_sum(g.coalesce()._values() if g.is_sparse else g for p in self.params if (g := p.grad) is not None)

    def scale_lr(self, factor: float) -> list[float]:
        for group, lr in zip(self.optimizer.param_groups, self._base_lrs):
            group["lr"] = lr * factor
        return [group["lr"] for group in self.optimizer.param_groups]

    def feed(self, records, mode, meta):
        return feed_tensors(self.model_def, records, mode, meta)

    def overlap(self, cap: int) -> bool:
        if self.reducer is None:
            if len(plan_buckets(self.params, self._views, self.buffers, self._extra, cap=cap)[0]) < 2:
                # The tail alone leaves after backward anyway: the flat path is the same collective,
                # without the hooks' Python calls in every backward (~3% of a digits step at 2 and 3
                # workers: bench/README.md, ddp_steady.py).
                return False
            self.reducer = BucketReducer(self.params, self._views, self.buffers, self._extra, cap=cap)
        return True

    def arm(self, launch: Launch) -> None:
        self.reducer.arm(launch)

    def launch_buckets(self, launch: Launch) -> None:
        self.reducer.launch_rest(launch)

    def launch_tail(self, launch: Launch) -> None:
        self.reducer.launch_tail(launch)
        self._gathered = True  # once the collective's works are waited for

    @property
    def spoiled(self) -> bool:
        return self.reducer is not None and self.reducer.spoiled

    def redo_flat(self) -> list[torch.Tensor]:
        self.reducer.restore_local()
        parts = list(self.buffers)
        parts[0] = parts[0][: parts[0].numel() - self.slots.numel()]
        return parts

    def zero(self) -> None:
        for p in self.params:
            p.grad = None
        if self.reducer is not None:
            self.reducer.begin()
        self.slots.zero_()
        self._gathered = False
        if self.micro_sqr is not None:
            self.micro_sqr.zero_()
            self._norms.clear()  # a backward that raised may have left some

    def accumulate(self, features, labels, index: slice, *, scale: float) -> float:
        if not self._train_mode:  # module.train() walks every submodule: once, not per micro-batch
            self.model.train()
            self._train_mode = True
        forward, loss_fn = (self.model, self.model_def.loss) if self.compute is None else \
            (self.compute.forward, self.compute.loss)
        loss = check_loss(self.model_def, loss_fn(take(labels, index), forward(take(features, index))),
                          samples=index.stop - index.start)
        (loss if scale == 1.0 else loss * scale).backward()
        if self.micro_sqr is not None and self._norms:
            # The hooks saw c = scale·g (g: this micro-batch's mean-loss gradient): n‖g‖² = n/scale²·‖c‖².
            n = index.stop - index.start
            self.micro_sqr += torch.stack(self._norms).square().sum() * (n / (scale * scale))
            self._norms.clear()
        return float(loss.detach())

    def finite(self) -> bool:
        if self._gathered:
            return all_finite(self.buffers)
        return all_finite(g._values() if g.is_sparse else g for p in self.params if (g := p.grad) is not None)

    def gathered(self) -> None:
        for p, view in zip(self.params, self._views):
            self._bind(p, view)
        self._gathered = True

    def apply(self) -> None:
        for p, view in zip(self.params, self._views):
            if p.grad is None or p.grad.is_sparse:  # as if gathered, whatever the world size:
                self._bind(p, view)  # untouched parameters get a zero gradient, sparse ones a dense one
        self.optimizer.step()

    @staticmethod
    def _bind(p: torch.Tensor, view: torch.Tensor) -> None:
        """Make ``view`` hold ``p``'s gradient (zero if none, dense if sparse) and ``p.grad`` it."""
        grad = p.grad
        if grad is None:
            view.zero_()
        elif grad.is_sparse:  # nn.Embedding(sparse=True): optimizers and reductions get it dense
            view.zero_().add_(grad)
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
        p.grad = view

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, tree: dict) -> None:
        self.model.load_state_dict(tree["model"])
        self._train_mode = False
        built = [group["lr"] for group in self.optimizer.param_groups]  # per group, as the module set them
        self.optimizer.load_state_dict(tree["optimizer"])
        if self.keep_lr:
            for group, lr in zip(self.optimizer.param_groups, built):
                group["lr"] = lr
        self.zero()


def check_loss(model_def: ModelDef, loss, *, samples: int):
    """The module's loss as the contract wants it: a scalar tensor that requires grad (ModelDefError else)."""
    call = "loss(labels, predictions)"
    if not isinstance(loss, torch.Tensor):
        raise ModelDefError(f"{model_def.path}: {call} returned {type(loss).__name__}, expected a scalar "
                            "torch.Tensor (the mean loss over the samples)")
    if loss.numel() != 1:
        raise ModelDefError(f"{model_def.path}: {call} returned a tensor of shape {tuple(loss.shape)} for {samples} "
                            "samples; it must return the mean over the samples, a scalar (e.g. end with .mean())")
    if not loss.requires_grad:
        raise ModelDefError(f"{model_def.path}: {call} returned a tensor that does not require grad, so no gradient "
                            "reaches the model's parameters (a constant, or computed under torch.no_grad(), "
                            "with .detach(), .item() or numpy?)")
    return loss




class TorchPredictor(Predictor):
    """:class:`Predictor` for a ``torch.nn.Module`` (also a PS-backed one: its rows are pulled)."""

    def __init__(self, model_def: ModelDef, model, forward=None) -> None:
        """``forward``: how the model runs on features (default: ``model(features)``; ``--accelerate``: the
        strategy's casts and autocast around the core module)."""
        self.model_def = model_def
        self.model = model
        self.forward = forward or model

    def batches(self, records, *, mode, metadata, batch_size):
        import torch

        features, labels = feed_tensors(self.model_def, records, mode, metadata)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for lo in range(0, len(records), batch_size):
                    sl = slice(lo, min(lo + batch_size, len(records)))
                    yield self.forward(take(features, sl)), (None if labels is None else take(labels, sl))
        finally:
            self.model.train(was_training)

    def load_checkpoint(self, path: str) -> None:
        from flextrain.elastic.statecodec import StateCodecError, decode

        try:
            with open(path, "rb") as f:
                tree = decode(f.read())
            self.model.load_state_dict(tree["model"])
        except (OSError, StateCodecError, KeyError, TypeError, RuntimeError) as exc:
            raise ModelDefError(f"checkpoint {path} does not fit the model of {self.model_def.spec}: "
                                f"{type(exc).__name__}: {exc}") from exc
        self.checkpoint_version = int(tree.get("version", 0))
