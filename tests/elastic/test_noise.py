"""GradientNoise: unbiased σ²/μ² from micro-batch gradient norms, the gain and the noise scale."""

from __future__ import annotations

import torch

from flextrain.elastic.noise import GradientNoise


def observe_step(noise: GradientNoise, grads: torch.Tensor) -> None:
    """grads: one row per sample (the per-sample gradients); micro-batches of 8 samples each."""
    parts = grads.split(8)
    means = [p.mean(0) for p in parts]
    mean = grads.mean(0)
    noise.observe(micro_batches=len(parts), samples=len(grads),
                  weighted_sqr=sum(len(p) * float(m.pow(2).sum()) for p, m in zip(parts, means)),
                  mean_sqr=float(mean.pow(2).sum()))


def test_the_estimates_recover_the_true_variance_and_gradient():
    gen = torch.Generator().manual_seed(0)
    mu, sigma = torch.tensor([3.0, -4.0]), 2.0  # μ² = 25, σ² (trace) = 2 * 4 = 8
    noise = GradientNoise(smoothing=0.9)
    assert noise.variance is None and noise.gain(256, 64) == 1.0 and noise.noise_scale is None
    for _ in range(400):
        observe_step(noise, mu + sigma * torch.randn(64, 2, generator=gen, dtype=torch.float64))
    assert abs(noise.variance - 8.0) < 1.0 and abs(noise.sqr - 25.0) < 1.0
    assert abs(noise.noise_scale - 8 / 25) < 0.06
    assert noise.gain(64, 64) == 1.0
    assert 1.0 < noise.gain(256, 64) < 256 / 64


def test_one_micro_batch_says_nothing_and_state_round_trips():
    noise = GradientNoise()
    assert noise.observe(micro_batches=1, samples=8, weighted_sqr=1.0, mean_sqr=1.0) is False
    assert noise.variance is None
    noise.observe(micro_batches=4, samples=32, weighted_sqr=40.0, mean_sqr=1.0)
    again = GradientNoise()
    again.load_state_dict(noise.state_dict())
    assert (again.variance, again.sqr, again.gain(128, 32)) == (noise.variance, noise.sqr, noise.gain(128, 32))
