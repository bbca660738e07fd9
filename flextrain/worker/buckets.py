"""Bucketed, overlapped gradient reduction for PyTorch models (what DDP's reducer does, elastic).

The flat path reduces every gradient in one collective after backward. Here the gradients
are cut into buckets of about ``--bucket-mb`` MiB (25 like DDP; the first bucket at
most 1 MiB, so the wire starts early), in reverse parameter order (the order backward
produces them) and fixed when the backend is built, so the same on every rank of a module.
During the LAST micro-step of a step (earlier micro-steps only accumulate into ``p.grad``:
exact-G semantics and uneven splits are unchanged), a post-accumulate-grad hook copies each
parameter's finished gradient into its bucket; a bucket whose every parameter is in is
summed asynchronously (``async_op=True``) while backward goes on. Buckets are launched
strictly in bucket order (a bucket that completes early waits for the ones before it), so
every rank issues the same collectives in the same order, as gloo and NCCL require.

The *tail* bucket (the one ending where the control slots begin: the first parameters of
``buffers[0]``'s dtype, whose gradients backward produces last) is never launched from a
hook: after backward the trainer sets its flags and launches the tail together with the
slots, so a model of one bucket still costs one collective per step, as on the flat path.
A rank whose compute failed, or that had no samples, or whose parameters got no gradient,
launches the buckets it has not launched yet after backward, with zeros for what is
missing: the collectives always match.

A parameter whose hook fires twice in one backward (re-entrant activation checkpointing
of a parameter used inside and outside a checkpointed segment) after its bucket left
spoils that bucket; :attr:`BucketReducer.spoiled` says so, the trainer raises a control
flag, and every rank re-reduces the step's gradients flat, then goes on flat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

FIRST_BUCKET_BYTES = 1 << 20  # like DDP's first bucket: the reduction starts early in backward


def bucket_bytes(mb: float) -> int:
    """``--bucket-mb`` (``training.bucket_mb``; 25 by default, as DDP's ``bucket_cap_mb``) in bytes;
    0: no buckets, one flat reduction after backward."""
    return max(0, int(mb * (1 << 20)))


@dataclass
class Bucket:
    params: list[int]             # indices into the backend's parameters, reverse order
    tensor: torch.Tensor          # the slice of its dtype's buffer the collective sums (the tail: with the slots)
    missing: int = 0              # parameters not in yet this step
    launched: bool = False        # its sum was started (the collective owns the work, not the bucket)


def plan_buckets(params: Sequence[torch.Tensor], views: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor],
                 extra: int, *, cap: int, first: int = FIRST_BUCKET_BYTES) -> tuple[list[Bucket], int]:
    """``(buckets, tail)``: the buckets in launch order and the index of the tail bucket.

    ``views[i]`` is parameter ``i``'s place in its dtype's buffer; the buffers must be laid out in
    REVERSE parameter order (so a bucket of parameters consecutive in reverse order is one slice,
    and the first parameters of ``buffers[0]`` end where its ``extra`` slots begin)."""
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        limit = min(first, cap) if len(buckets) == 1 else cap
        if not buckets or params[buckets[-1][0]].dtype != params[i].dtype or (size and size + nbytes > limit):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    out, tail = [], -1
    by_dtype = {b.dtype: b for b in buffers}
    for k, members in enumerate(buckets):
        buffer = by_dtype[params[members[0]].dtype]
        lo = views[members[0]].data_ptr() - buffer.data_ptr()
        hi = views[members[-1]].data_ptr() - buffer.data_ptr() + views[members[-1]].numel() * buffer.element_size()
        lo, hi = lo // buffer.element_size(), hi // buffer.element_size()
        if buffer is buffers[0] and hi == buffer.numel() - extra:
            hi, tail = buffer.numel(), k  # ends where the slots begin: they ride with it
        out.append(Bucket(members, buffer[lo:hi]))
    if tail < 0:  # no parameter of buffers[0]'s dtype: the slots alone
        out.append(Bucket([], buffers[0][buffers[0].numel() - extra:]))
        tail = len(out) - 1
    return out, tail


Launch = Callable[[torch.Tensor], None]  # starts an async SUM of a tensor (Collective.start_sum)


class BucketReducer:
    """One backend's buckets and their state within a step (see the module docstring)."""

    def __init__(self, params, views, buffers, extra: int, *, cap: int) -> None:
        self.params, self.views = list(params), list(views)
        self.buckets, self.tail = plan_buckets(self.params, self.views, buffers, extra, cap=cap)
        self.bucket_of = {i: k for k, b in enumerate(self.buckets) for i in b.params}
        self._launch: Launch | None = None  # armed: the hooks launch through it
        self._ready = [False] * len(self.params)
        self._next = 0  # the first bucket not launched yet
        self.error: BaseException | None = None  # a launch that failed inside a hook
        self.spoiled = False  # a gradient changed after its bucket left (see the module docstring)
        self._local: list[torch.Tensor | None] = []  # the local gradients, kept for a flat redo
        for i, p in enumerate(self.params):  # idle (one call that returns) until armed
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._accumulated(i))

    def begin(self) -> None:
        """A new step: nothing launched, nothing in."""
        self._launch = None
        self._ready = [False] * len(self.params)
        self._next = 0
        self.error, self.spoiled = None, False
        self._local = []
        for b in self.buckets:
            b.missing, b.launched = len(b.params), False

    def arm(self, launch: Launch) -> None:
        """The next backward is the step's last on this rank: its gradients are final as they come."""
        self._launch = launch

    def _accumulated(self, i: int) -> None:
        if self._launch is None:
            return
        bucket = self.buckets[self.bucket_of[i]]
        if bucket.launched:  # its bucket left already: this step cannot be reduced so
            self.spoiled = True
            return
        _copy(self.params[i].grad, self.views[i])
        if not self._ready[i]:
            self._ready[i] = True
            bucket.missing -= 1
        if self.error is None:
            try:
                self._launch_ready()
            except BaseException as exc:  # raised again after backward: never a failure of the compute
                self.error = exc

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets):
            if self._next == self.tail:
                self._next += 1
                continue
            bucket = self.buckets[self._next]
            if bucket.missing:
                return
            self._launch(bucket.tensor)
            bucket.launched = True
            self._next += 1

    def launch_rest(self, launch: Launch) -> None:
        """After backward (whatever became of it): fill in what is missing (zeros) and launch every
        bucket not launched yet, in order, except the tail. Raises a launch error a hook kept."""
        self._launch = None
        if self.error is not None:
            raise self.error
        for k, bucket in enumerate(self.buckets):
            if k == self.tail or bucket.launched:
                continue
            self._fill(bucket)
            launch(bucket.tensor)
            bucket.launched = True

    def launch_tail(self, launch: Launch) -> None:
        """Launch the tail (its slots set by now); every parameter's ``grad`` becomes its place in
        the buffers (reduced once the collective's works are waited for)."""
        tail = self.buckets[self.tail]
        self._fill(tail)
        launch(tail.tensor)
        tail.launched = True
        self._local = [p.grad for p in self.params]
        for p, view in zip(self.params, self.views):
            p.grad = view

    def _fill(self, bucket: Bucket) -> None:
        for i in bucket.params:
            if not self._ready[i]:
                _copy(self.params[i].grad, self.views[i])
                self._ready[i] = True

    def restore_local(self) -> None:
        """For a flat redo: the views hold the local gradients again (zero where none)."""
        for grad, view in zip(self._local, self.views):
            _copy(grad, view)


def _copy(grad: torch.Tensor | None, view: torch.Tensor) -> None:
    """``view`` := ``grad`` (zero if None, dense if sparse)."""
    if grad is None:
        view.zero_()
    elif grad.is_sparse:
        view.zero_().add_(grad)
    elif grad.data_ptr() != view.data_ptr():
        view.copy_(grad)
