"""AdaptiveBatchSampler: the decision rule, exactly-once with decisions mid-epoch (worlds 1 and 2,
rank by rank), G growing with the noise scale on a regression whose gradient noise grows as the
loss falls (the LR following AdaScale's gain), checkpoints, and misuse."""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch

from flextrain.elastic.noise import GradientNoise
from flextrain.elastic.torch import AdaptiveBatchSampler, AdaScaleOptimizer, TraceBatchSampler


def noise_with(var: float, sqr: float) -> GradientNoise:
    """A GradientNoise whose estimates are exactly σ² = var, μ² = sqr (one step, no smoothing)."""
    noise, m, r = GradientNoise(smoothing=0.0), 4, 64
    mean = sqr + var / r
    noise.observe(micro_batches=m, samples=r, weighted_sqr=var * (m - 1) + r * mean, mean_sqr=mean)
    assert noise.variance == pytest.approx(var) and noise.sqr == pytest.approx(sqr, abs=1e-12)
    return noise


def sampler(noise=None, **kw) -> AdaptiveBatchSampler:
    args = dict(min_global_batch=16, max_global_batch=256, minibatch_size=4, num_replicas=2, rank=0, noise=noise)
    return AdaptiveBatchSampler(1000, **{**args, **kw})


# ---- the rule -------------------------------------------------------------------------------------

@pytest.mark.parametrize("var, sqr, expected", [
    (101.0, 1.0, 104),   # B = 101 -> the nearest multiple of 4 x 2
    (300.0, 2.0, 152),   # B = 150 -> 152 (150 / 8 = 18.75)
    (3.0, 1.0, 16),      # below the minimum: clamped
    (1e4, 1.0, 256),     # above the maximum: clamped
    (5.0, 0.0, 256),     # μ² = 0: all noise, the largest batch
])
def test_without_a_throughput_model_g_is_the_noise_scale_rounded_and_clamped(var, sqr, expected):
    assert sampler(noise_with(var, sqr)).choose() == expected


def test_before_any_estimate_g_stays():
    assert sampler().choose() == 16 and sampler(GradientNoise()).choose() == 16
    s = sampler(GradientNoise())
    s.step_done(s.first_step(1) - 1)  # an epoch boundary, but nothing measured
    assert s.history == [(0, 16)] and s.decisions == 1


def test_with_a_throughput_model_g_maximises_efficiency_times_throughput():
    # T(G) = G / (1 + G/c): efficiency x throughput ∝ G / ((σ² + μ²G)(c + G)), maximal at G = √(c σ²/μ²)
    s = sampler(noise_with(400.0, 1.0), throughput=lambda g: g / (1 + g / 64))
    assert s.choose() == 160  # √(64 x 400)
    # the statistical efficiency: 1 at the minimum, (B + min) / 2B at G = B (McCandlish's balance)
    assert s.efficiency(16) == pytest.approx(1.0)
    assert s.efficiency(400) == pytest.approx((400 + 16) / 800)
    # throughput that does not grow with G: the smallest batch wins
    assert sampler(noise_with(400.0, 1.0), throughput=lambda g: 1000.0).choose() == 16


# ---- exactly once, decisions mid-epoch, worlds 1 and 2 rank by rank ----------------------------------

def scripted_noise(step: int, world: int) -> GradientNoise:
    """The same statistics on every rank after each step (as the all-reduce makes them): the noise
    scale grows from the minimum G by one more minimum every 20 steps."""
    return noise_with(4.0 * world * (1 + step / 20), 1.0)


def run_epoch(s: AdaptiveBatchSampler, epoch: int) -> list[int]:
    """Iterate one rank's epoch as a training loop does, calling step_done at each step's end as the
    rule optimizers do (also for a trailing step this rank has no share of)."""
    s.set_epoch(epoch)
    seen, counts = [], Counter()
    for index, minibatch in enumerate(s):
        seen.extend(minibatch)
        step = s.step_of_minibatch(index)
        counts[step] += 1
        if counts[step] < s.minibatches_in_step(step):
            continue
        shares = s.shares()
        k = [sh.step for sh in shares].index(step)
        while True:
            s.noise = scripted_noise(shares[k].step, s.num_replicas)
            s.step_done(shares[k].step)
            k += 1
            if k >= len(shares := s.shares()) or shares[k].minibatches:
                break
    return seen


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("every", [3, None])
def test_every_sample_exactly_once_per_epoch_while_g_changes(world, every):
    size, b = 203, 2  # odd: every epoch ends with a partial step
    ranks = [AdaptiveBatchSampler(size, min_global_batch=2 * b * world, max_global_batch=24 * b * world,
                                  minibatch_size=b, num_replicas=world, rank=r, seed=3, every=every)
             for r in range(world)]
    for epoch in range(4):
        seen = Counter()
        for s in ranks:  # rank by rank, each with the same noise at the same steps
            seen.update(run_epoch(s, epoch))
        assert seen == Counter(range(size)), f"epoch {epoch}: not exactly once"
        layouts = [[(sh.step, sh.samples) for sh in s.shares()] for s in ranks]
        assert all(lay == layouts[0] for lay in layouts), "every rank lays the epoch out alike"
    history = ranks[0].history
    assert all(s.history == history for s in ranks), "every rank decided alike"
    sizes = [g for _, g in history]
    assert sizes == sorted(sizes) and len(sizes) >= 3, f"G grows with the noise scale: {history}"
    assert all(g % (b * world) == 0 and 2 * b * world <= g <= 24 * b * world for g in sizes)
    starts = {ranks[0].first_step(e) for e in range(5)}
    if every is None:
        assert {step for step, _ in history} <= starts
    else:
        assert {step for step, _ in history} - starts, "some decisions fell mid-epoch"
        assert all(step % every == 0 for step, _ in history)


def test_a_decision_for_steps_already_handed_out_is_refused():
    s = sampler(noise_with(101.0, 1.0), every=2, num_replicas=1, minibatch_size=8)
    it = iter(s)
    for _ in range(3 * 2):  # steps 0, 1, 2 of 2 minibatches, read ahead of the training
        next(it)
    with pytest.raises(RuntimeError, match="handed out before its batch size was decided"):
        s.step_done(1)


# ---- training: G grows as the loss falls, the loss matches a fixed-G run ----------------------------

def regression(n: int = 4096, d: int = 16):
    """Linear regression with label noise 1: far from the optimum μ² is large; near it μ² -> 0 while
    σ² stays (the labels' noise), so the noise scale σ²/μ² grows as the loss falls."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ torch.randn(d, 1, generator=g, dtype=torch.float64) + torch.randn(n, 1, generator=g, dtype=torch.float64)
    return x, y


def train(s: TraceBatchSampler, epochs: int, *, lr: float = 0.005, ref: int = 16):
    x, y = regression()
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1, dtype=torch.float64)
    opt = AdaScaleOptimizer(torch.optim.SGD(model.parameters(), lr=lr), s, ref, smoothing=0.9)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(len(x)), x, y), batch_sampler=s)
    per_epoch = []
    for epoch in range(epochs):
        s.set_epoch(epoch)
        opt.set_epoch(epoch)
        seen = []
        for index, xb, yb in loader:
            seen += index.tolist()
            (0.5 * (model(xb) - yb).pow(2).mean()).backward()
            opt.step()
        assert sorted(seen) == list(range(len(x))), "exactly once"
        with torch.no_grad():
            per_epoch.append((s.global_batch(s.first_step(epoch)), float(0.5 * (model(x) - y).pow(2).mean())))
    return per_epoch, opt


def test_g_grows_as_the_loss_falls_and_the_loss_matches_a_fixed_g_run():
    adaptive = AdaptiveBatchSampler(4096, min_global_batch=16, max_global_batch=512, minibatch_size=8, rank=0,
                                    num_replicas=1)
    per_epoch, opt = train(adaptive, 6)
    sizes = [g for g, _ in per_epoch]
    assert sizes == sorted(sizes) and sizes[0] == 16 and sizes[-1] >= 8 * 16, per_epoch
    assert all(g % 8 == 0 and 16 <= g <= 512 for _, g in adaptive.history)
    assert adaptive.noise is opt.noise, "the AdaScale optimizer binds its noise estimate"
    assert opt.gain > 2 and opt.last_lr[0] == pytest.approx(0.005 * opt.gain), "the LR follows AdaScale's gain"
    fixed_per_epoch, fixed = train(TraceBatchSampler(4096, 16, 1, 0, minibatch_size=8), 6)
    loss, fixed_loss = per_epoch[-1][1], fixed_per_epoch[-1][1]
    assert abs(loss - fixed_loss) < 0.1 * fixed_loss, (per_epoch, fixed_per_epoch)
    assert loss < 0.6 * per_epoch[0][1], "it trained"
    assert opt.real_steps < fixed.real_steps / 3, "larger batches: fewer steps for the same samples"


# ---- checkpoints ------------------------------------------------------------------------------------

def test_a_checkpoint_mid_epoch_continues_identically():
    def fresh():
        s = AdaptiveBatchSampler(4096, min_global_batch=16, max_global_batch=512, minibatch_size=8, rank=0,
                                 num_replicas=1, every=25)
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1, dtype=torch.float64)
        return s, model, AdaScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.005), s, 16, smoothing=0.9)

    x, y = regression()

    def run(s, model, opt, epoch, stop=None):
        s.set_epoch(epoch, start=opt.minibatch)
        opt.set_epoch(epoch)
        for n, index in enumerate(s):
            (0.5 * (model(x[index]) - y[index]).pow(2).mean()).backward()
            opt.step()
            if stop is not None and n + 1 == stop:
                return

    whole = fresh()
    for epoch in range(2):
        run(*whole, epoch)
    part = fresh()
    run(*part, 0)
    run(*part, 1, stop=37)  # mid-step, mid-epoch, after decisions
    saved = copy.deepcopy({"sampler": part[0].state_dict(), "model": part[1].state_dict(),
                           "opt": part[2].state_dict()})
    resumed = fresh()
    resumed[1].load_state_dict(saved["model"])
    resumed[2].load_state_dict(saved["opt"])
    resumed[0].load_state_dict(saved["sampler"])
    run(*resumed, 1)
    assert len(whole[0].history) > 3 and resumed[0].history == whole[0].history
    assert resumed[2].real_steps == whole[2].real_steps
    for p, q in zip(resumed[1].parameters(), whole[1].parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


# ---- misuse -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(max_global_batch=100), "multiple of minibatch_size x num_replicas"),
    (dict(max_global_batch=8, min_global_batch=16), "must be >= min_global_batch"),
    (dict(min_global_batch=12), "not a multiple"),
    (dict(min_global_batch=8, num_replicas=1, minibatch_size=8), "one minibatch"),
    (dict(every=0), "every must be a positive integer"),
])
def test_bad_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        sampler(**kw)


def test_a_bad_throughput_is_refused_and_bad_saved_sizes_too():
    with pytest.raises(ValueError, match="throughput"):
        sampler(noise_with(1.0, 1.0), throughput=lambda g: math.nan).choose()
    with pytest.raises(ValueError, match="not multiples"):
        sampler().load_state_dict({"history": [[0, 16], [4, 20]], "decided": 4, "decisions": 1, "epoch": 0})
