"""``aikit.elastic.Torch.init(global_batch_size, max_gpu_batch_size)``: :func:`flextrain.elastic.torch.init`."""

from flextrain.elastic.torch import init

__all__ = ["init"]
