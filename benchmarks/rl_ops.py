"""RL operators in plain PyTorch, checked against float64 and timed against HPC_RL's fused CUDA kernels.

HPC_RL (OpenDILab) hand-wrote CUDA kernels for the operators RL training repeats every iteration and
reported their speed on a 32 GB V100 (the figures in ``HPC_RL_V100`` below, from
``shared/anchors/hpc_rl_v100.csv``). This file answers with plain PyTorch: each operator is written
as a Python loop, as vectorized tensor code, under ``torch.compile`` and, on CUDA, under a CUDA graph.
Every form is checked against a float64 reference before it is timed; a form that fails is reported
as ``FAIL`` and not timed.

Run::

    python benchmarks/rl_ops.py [--quick] [--out benchmarks/results] [--device cpu|cuda] [--reps N]
                                [--ops gae,vtrace] [--budget SECONDS] [--threads N] [--no-compile]

It writes ``<out>/rl_ops_<device-tag>.md`` and ``.json``, stamped with the machine (device, CPU model,
cores, torch threads, load average, torch version). A full run goes to ``benchmarks/results/`` (committed);
a ``--quick`` run to ``runs/benchmarks/`` (git-ignored) as ``rl_ops_<device-tag>_quick``, and it never replaces
a full run's report, wherever ``--out`` points. On a GPU machine whose commands may run 10 minutes
at most, run the operators in parts and merge them (compiling every size takes most of the time)::

    python benchmarks/rl_ops.py --device cuda --ops gae,td_lambda,vtrace_returns,upgo_returns --tag cuda_part1
    python benchmarks/rl_ops.py --device cuda --ops vtrace,upgo --tag cuda_part2
    python benchmarks/rl_ops.py --device cuda --ops qntd,qntd_rescale,dntd,ppo,lstm,scatter --tag cuda_part3
    python benchmarks/rl_ops.py --merge benchmarks/results/rl_ops_cuda_part{1,2,3}.json --tag cuda_h100

(``--merge`` needs no GPU: it re-renders the table from the parts' JSON.)

Conventions shared by every operator
------------------------------------
* Time-major tensors: ``(T, B, ...)``; ``T`` steps, ``B`` parallel environments (or sequences).
* Episode ends follow CleanRL: ``dones[t] == 1`` means ``obs[t]`` begins a new episode, so step ``t``
  bootstraps from ``values[t + 1]`` unless ``dones[t + 1]``; the last step bootstraps from
  ``next_value`` unless ``next_done``. Written ``m_t = 1 - dones[t + 1]`` (``dones[T] = next_done``)
  and ``V_T = next_value``, the discount of step t is ``gamma_t = gamma * m_t``.
* Targets (advantages, returns) carry no gradient: they are computed from detached values.
* Timing covers the forward and, where the operator has a gradient, the backward
  (``torch.autograd.grad`` of the loss, or of the output with a fixed random cotangent).

Forms
-----
* ``loop``: the straightforward eager code a careful RL user writes, with the Python loop that the
  operator's definition suggests: over time (GAE, TD(lambda), V-trace, UPGO, LSTM), over the n-step
  rewards (q-value TD) and the atoms (C51), over the batch (scatter). PPO has no loop: its baseline
  is CleanRL's eager code with ``torch.distributions.Categorical``.
* ``vectorized``: every vectorized candidate of the operator is checked and timed; the fastest correct
  one is reported (its name is in the variants column). The reverse linear recurrences (GAE, TD(lambda),
  V-trace, UPGO) ``x_t = b_t + a_t x_{t+1}`` have these solvers:
  ``doubling`` (recursive doubling: log2(T) steps of ``x_t += A_t x_{t+k}; A_t *= A_{t+k}``),
  ``chunked`` (exact transfer matrices inside chunks of 32 steps, doubling across chunks),
  ``assoc`` (``torch._higher_order_ops.associative_scan``, its generic mode when eager) and, for GAE,
  ``cumsum`` (discounted cumulative sum rescaled by powers of gamma*lambda in float64, segmented at
  episode ends). C51's projection has a ``scatter`` and a dense ``hat`` candidate.
* ``compiled``: a vectorized candidate under ``torch.compile`` (static shapes, one compile per size).
  On CPU the recurrences compile ``doubling`` and C51 ``scatter``; on CUDA ``doubling`` and ``assoc``
  (which inductor lowers to one Triton scan kernel), and C51 ``scatter`` and ``hat``, are all compiled
  and the fastest correct one is kept. The LSTM compiles its recurrent cell (the loop stays Python).
* ``compiled+cudagraph`` (CUDA only): the compiled step, forward and backward, captured once in a
  ``torch.cuda.CUDAGraph`` and replayed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

# where reports go unless --out says otherwise: full runs are committed, quick ones are scratch
ROOT = Path(__file__).resolve().parents[1]
FULL_OUT, QUICK_OUT = "benchmarks/results", "runs/benchmarks"

# HPC_RL's table (forward + backward, 32 GB V100): operator, size, PyTorch us, fused-kernel us.
# Source: shared/anchors/hpc_rl_v100.csv (HPC_RL README). Their PyTorch side was Python loops timed
# with time.time() over 6 runs without warm-up.
HPC_RL_V100 = [
    ("td_lambda", "T=16,B=16", 900, 95),
    ("td_lambda", "T=256,B=64", 13100, 105),
    ("td_lambda", "T=256,B=512", 18800, 130),
    ("dntd", "T=16,B=128,N=128", 2000, 424),
    ("dntd", "T=128,B=16,N=128", 5860, 420),
    ("dntd", "T=128,B=128,N=16", 5930, 422),
    ("dntd", "T=128,B=128,N=128", 5890, 420),
    ("dntd", "T=512,B=128,N=128", 19120, 423),
    ("dntd", "T=128,B=128,N=512", 5940, 463),
    ("gae", "T=16,B=16", 1110, 36),
    ("gae", "T=16,B=64", 1150, 36),
    ("gae", "T=256,B=64", 15510, 82),
    ("gae", "T=256,B=256", 15730, 83),
    ("gae", "T=1024,B=16", 62810, 235),
    ("gae", "T=1024,B=64", 65850, 240),
    ("lstm", "seq_len=16,B=4", 50969, 8311),
    ("lstm", "seq_len=64,B=4", 204976, 29383),
    ("lstm", "seq_len=64,B=16", 204073, 25769),
    ("lstm", "seq_len=256,B=4", 845367, 113733),
    ("lstm", "seq_len=256,B=16", 861429, 98873),
    ("ppo", "B=16,N=16", 2037, 388),
    ("ppo", "B=16,N=128", 2047, 389),
    ("ppo", "B=128,N=16", 2032, 389),
    ("ppo", "B=128,N=128", 2153, 394),
    ("ppo", "B=512,N=128", 2143, 393),
    ("ppo", "B=512,N=512", 2047, 3898),
    ("qntd", "T=16,B=128,N=128", 1248, 254),
    ("qntd", "T=128,B=16,N=128", 5429, 261),
    ("qntd", "T=128,B=128,N=16", 5214, 253),
    ("qntd", "T=128,B=128,N=128", 5179, 257),
    ("qntd", "T=512,B=128,N=128", 18355, 254),
    ("qntd", "T=128,B=128,N=512", 5198, 254),
    ("qntd_rescale", "T=16,B=128,N=128", 1655, 266),
    ("qntd_rescale", "T=128,B=16,N=128", 5652, 264),
    ("qntd_rescale", "T=128,B=128,N=16", 5653, 265),
    ("qntd_rescale", "T=128,B=128,N=128", 5653, 265),
    ("qntd_rescale", "T=512,B=128,N=128", 19286, 264),
    ("qntd_rescale", "T=128,B=128,N=512", 5677, 265),
    ("scatter", "B=16,M=64,N=64", 559, 311),
    ("scatter", "B=64,M=16,N=64", 561, 309),
    ("scatter", "B=64,M=64,N=16", 567, 310),
    ("scatter", "B=64,M=64,N=64", 571, 309),
    ("scatter", "B=256,M=64,N=64", 852, 480),
    ("scatter", "B=256,M=64,N=256", 2399, 1620),
    ("upgo", "T=16,B=128,N=128", 2274, 247),
    ("upgo", "T=128,B=16,N=128", 13350, 246),
    ("upgo", "T=128,B=128,N=16", 13367, 246),
    ("upgo", "T=128,B=128,N=128", 13421, 269),
    ("upgo", "T=512,B=128,N=128", 51923, 749),
    ("upgo", "T=128,B=128,N=512", 13705, 474),
    ("vtrace", "T=16,B=128,N=128", 2906, 325),
    ("vtrace", "T=128,B=16,N=128", 10979, 328),
    ("vtrace", "T=128,B=128,N=16", 10906, 368),
    ("vtrace", "T=128,B=128,N=128", 11095, 459),
    ("vtrace", "T=512,B=128,N=128", 39693, 1364),
    ("vtrace", "T=128,B=128,N=512", 12230, 776),
]
# The csv's operator names, for matching this table against it.
CSV_NAMES = {"td_lambda": "TD-lambda"}
# leanrl's extra sizes: HPC_RL has no T=1024 row for these recurrences, and the 10x claim is at T=1024
# (B as in HPC_RL's GAE rows). vtrace_returns / upgo_returns are the recurrences alone (targets from
# given ratios and values, as IMPALA's from_importance_weights), without the softmax and the loss.
EXTRA_SIZES = [
    ("td_lambda", "T=1024,B=16"),
    ("td_lambda", "T=1024,B=64"),
    ("vtrace", "T=1024,B=16,N=16"),
    ("vtrace", "T=1024,B=64,N=16"),
    ("vtrace_returns", "T=1024,B=16"),
    ("vtrace_returns", "T=1024,B=64"),
    ("upgo", "T=1024,B=16,N=16"),
    ("upgo", "T=1024,B=64,N=16"),
    ("upgo_returns", "T=1024,B=16"),
    ("upgo_returns", "T=1024,B=64"),
]
QUICK_SIZES = [
    ("gae", "T=16,B=16"),
    ("gae", "T=64,B=8"),
    ("td_lambda", "T=16,B=16"),
    ("qntd", "T=4,B=16,N=8"),
    ("qntd_rescale", "T=4,B=16,N=8"),
    ("dntd", "T=4,B=16,N=8"),
    ("vtrace", "T=16,B=8,N=6"),
    ("vtrace_returns", "T=16,B=8"),
    ("upgo", "T=16,B=8,N=6"),
    ("upgo_returns", "T=16,B=8"),
    ("ppo", "B=16,N=16"),
    ("lstm", "seq_len=4,B=2"),
    ("scatter", "B=4,M=8,N=16"),
]

# Fixed problem dimensions where HPC_RL's table names none (from HPC_RL's own tests).
LSTM_INPUT, LSTM_HIDDEN, LSTM_LAYERS = 1792, 384, 3
SCATTER_H = SCATTER_W = 16
C51_ATOMS, C51_VMIN, C51_VMAX = 51, -10.0, 10.0
RESCALE_EPS = 1e-3


# ---------------------------------------------------------------------------------------------------
# Reverse linear recurrence x_t = b_t + a_t * x_{t+1}, x_T = last; a, b: (T, ...), last: (...).
# ---------------------------------------------------------------------------------------------------


def _fold_last(a, b, last):
    """Fold the bootstrap into the last step, so that nothing lies beyond the end (a_{T-1} = 0)."""
    b = torch.cat([b[:-1], (b[-1] + a[-1] * last).unsqueeze(0)])
    a = torch.cat([a[:-1], torch.zeros_like(a[-1:])])
    return a, b


def reverse_scan_doubling(a, b, last):
    """Recursive doubling: after the step with stride k, x_t holds the sum over the next 2k steps.

    Invariant: true x_t = x_t + A_t * true x_{t+k}, with A_t = 0 where t + k is past the end. Each step
    halves the unresolved span, so log2(T) steps of O(T B) work solve it exactly (no division).
    """
    a, x = _fold_last(a, b, last)
    T = x.shape[0]
    k = 1
    while k < T:
        x = torch.cat([torch.addcmul(x[:-k], a[:-k], x[k:]), x[-k:]])
        if 2 * k < T:  # the last step needs no new products
            a = torch.cat([a[:-k] * a[k:], torch.zeros_like(a[-k:])])
        k *= 2
    return x


def reverse_scan_chunked(a, b, last, chunk=32):
    """Chunked matrix form: inside each chunk of L steps x = W b + carry, W[t, s] = a_t ... a_{s-1}.

    The L x L transfer products come from a cumulative product of a masked copy of a (exact, no
    division, so episode ends and small a cannot divide by zero or underflow a denominator); the
    chunk starts form a short recurrence of T / L steps, solved by doubling.
    """
    a, b = _fold_last(a, b, last)
    T, rest = b.shape[0], b.shape[1:]
    L = min(chunk, T)
    C = -(-T // L)
    pad = C * L - T
    if pad:  # zero steps past the end leave the real ones unchanged (a_{T-1} = 0)
        a = torch.cat([a, a.new_zeros((pad, *rest))])
        b = torch.cat([b, b.new_zeros((pad, *rest))])
    a, b = a.reshape(C, L, *rest), b.reshape(C, L, *rest)
    idx = torch.arange(L, device=b.device)
    upper = (idx[None, :] >= idx[:, None]).reshape(1, L, L, *([1] * len(rest)))  # [t, k]: k >= t
    # prods[c, t, s] = a_t * ... * a_s for s >= t (ones below the diagonal)
    prods = torch.cumprod(torch.where(upper, a.unsqueeze(1), torch.ones_like(a[:1, :1])), dim=2)
    transfer = torch.cat([torch.ones_like(prods[:, :, :1]), prods[:, :, :-1]], dim=2) * upper
    local = (transfer * b.unsqueeze(1)).sum(2)  # the chunk's own contribution, (C, L, ...)
    through = prods[:, :, -1]  # how x at the next chunk's start enters step t
    starts = reverse_scan_doubling(through[:, 0], local[:, 0], torch.zeros_like(local[0, 0]))
    following = torch.cat([starts[1:], torch.zeros_like(starts[:1])])
    x = local + through * following.unsqueeze(1)
    return x.reshape(C * L, *rest)[:T]


def _compose(later, earlier):
    """Compose the affine maps y -> b + a y of a later step, then of an earlier one."""
    return later[0] * earlier[0], earlier[1] + earlier[0] * later[1]


def reverse_scan_assoc(a, b, last):
    """torch's associative_scan of the affine maps; on CUDA, inductor lowers it to a single Triton scan."""
    from torch._higher_order_ops.associative_scan import associative_scan

    a, b = _fold_last(a, b, last)
    # pointwise mode needs CUDA and, run eagerly, would compile itself; the eager candidate stays generic
    mode = "pointwise" if b.is_cuda and torch.compiler.is_compiling() else "generic"
    return associative_scan(_compose, (a, b), dim=0, reverse=True, combine_mode=mode)[1]


def reverse_scan_loop(a, b, last):
    """The recurrence one step at a time (reference for the solvers)."""
    xs, x = [], last
    for t in range(b.shape[0] - 1, -1, -1):
        x = b[t] + a[t] * x
        xs.append(x)
    return torch.stack(xs[::-1])


SCANS = {
    "doubling": reverse_scan_doubling,
    "chunked": reverse_scan_chunked,
    "assoc": reverse_scan_assoc,
    "loop": reverse_scan_loop,
}


def _following(x, last):
    """x[t + 1] for t < T - 1 and last at t = T - 1: the step that follows each step."""
    return torch.cat([x[1:], last.unsqueeze(0)])


# ---------------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------------


def gae_loop(rewards, values, dones, next_value, next_done, gamma=0.99, gae_lambda=0.95):
    """Generalized advantage estimation (forward only; advantages are targets). CleanRL's loop.

    delta_t = r_t + gamma m_t V_{t+1} - V_t,  A_t = delta_t + gamma lambda m_t A_{t+1},  A_T = 0,
    with m_t = 1 - dones[t + 1] and V_T = next_value (see the module's conventions).
    Inputs (T, B) and (B,); returns advantages (T, B).
    """
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages


def gae_vectorized(rewards, values, dones, next_value, next_done, gamma=0.99, gae_lambda=0.95, scan="doubling"):
    """GAE (same definition as gae_loop) with the deltas computed at once and a reverse scan."""
    alive = 1.0 - _following(dones, next_done)
    delta = rewards + gamma * alive * _following(values, next_value) - values
    return SCANS[scan](gamma * gae_lambda * alive, delta, torch.zeros_like(next_value))


def gae_cumsum(rewards, values, dones, next_value, next_done, gamma=0.99, gae_lambda=0.95):
    """GAE as a discounted cumulative sum, rescaled by powers of g = gamma*lambda, in float64.

    A_t = sum_{s=t..e_t} g^(s-t) delta_s, e_t the last step of t's episode inside the rollout, so
    A_t = (R_t - R_{e_t+1}) / g^t with R_t = sum_{s>=t} g^s delta_s. Float64 keeps g^t representable
    (g^T must stay above ~1e-280, checked) and the difference exact enough; no division by zero.
    """
    T = rewards.shape[0]
    g = gamma * gae_lambda
    if T > 1 and g ** (T - 1) < 1e-280:
        raise ValueError(f"gae_cumsum: (gamma*lambda)^T underflows float64 at T={T}")
    f64 = torch.float64
    alive = 1.0 - _following(dones, next_done).to(f64)
    delta = rewards.to(f64) + gamma * alive * _following(values, next_value).to(f64) - values.to(f64)
    steps = torch.arange(T, device=rewards.device)
    powers = torch.full((T,), g, dtype=f64, device=rewards.device).pow(steps).unsqueeze(1)
    scaled = delta * powers
    tail = torch.flip(torch.cumsum(torch.flip(scaled, [0]), 0), [0])  # R_t
    tail = torch.cat([tail, torch.zeros_like(tail[:1])])  # R_T = 0
    # e_t: first s >= t whose following observation starts a new episode (alive_s == 0), else T-1
    stop = torch.where(alive == 0, steps.unsqueeze(1), T - 1)
    end = torch.flip(torch.cummin(torch.flip(stop, [0]), 0).values, [0])
    advantages = (tail[:T] - torch.gather(tail, 0, end + 1)) / powers
    return advantages.to(rewards.dtype)


# ---------------------------------------------------------------------------------------------------
# TD(lambda)
# ---------------------------------------------------------------------------------------------------


def td_lambda_loop(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95):
    """TD(lambda) value loss with lambda-returns as targets (gradient flows into values).

    G_t = r_t + gamma m_t ((1 - lambda) V_{t+1} + lambda G_{t+1}),  G_T = V_T = next_value,
    loss = 0.5 mean_t,b (G_t - V_t)^2 with G from detached values. Returns (loss, G (T, B)).
    """
    v = values.detach()
    T = rewards.shape[0]
    returns = [None] * T
    following_return, following_value = next_value, next_value
    for t in reversed(range(T)):
        alive = 1.0 - (next_done if t == T - 1 else dones[t + 1])
        blend = (1 - lam) * following_value + lam * following_return
        following_return = rewards[t] + gamma * alive * blend
        following_value = v[t]
        returns[t] = following_return
    returns = torch.stack(returns)
    return 0.5 * ((returns - values) ** 2).mean(), returns


def td_lambda_vectorized(rewards, values, dones, next_value, next_done, gamma=0.99, lam=0.95, scan="doubling"):
    """TD(lambda) (same definition as td_lambda_loop) as one reverse scan:

    G_t = [r_t + gamma m_t (1 - lambda) V_{t+1}] + [gamma lambda m_t] G_{t+1}.
    """
    v = values.detach()
    discount = gamma * (1.0 - _following(dones, next_done))
    b = rewards + discount * (1 - lam) * _following(v, next_value)
    returns = SCANS[scan](discount * lam, b, next_value)
    return 0.5 * ((returns - values) ** 2).mean(), returns


# ---------------------------------------------------------------------------------------------------
# q-value n-step TD (double-Q target), with and without value rescaling
# ---------------------------------------------------------------------------------------------------


def value_rescale(x, eps=RESCALE_EPS):
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (R2D2's value rescaling)."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def inverse_value_rescale(y, eps=RESCALE_EPS):
    """The exact inverse of h: solve eps s^2 + s - (1 + eps + |y|) = 0 for s = sqrt(|x| + 1).

    s = 2 (|y| + 1 + eps) / (1 + sqrt(1 + 4 eps (|y| + 1 + eps))) is the root written without the
    cancellation of (sqrt(...) - 1) / (2 eps); then x = sign(y) (s^2 - 1).
    """
    k = y.abs() + 1 + eps
    s = 2 * k / (1 + torch.sqrt(1 + 4 * eps * k))
    return torch.sign(y) * (s * s - 1)


def _nstep_loss(q, action, target, weight):
    q_sa = q.gather(1, action.unsqueeze(1)).squeeze(1)
    td = q_sa - target.detach()
    return (weight * td * td).mean(), td


def qntd_loop(q, next_n_q, action, next_n_action, reward, done, weight, gamma=0.99):
    """n-step TD for Q-learning with a double-Q target.

    q, next_n_q: (B, N) online Q at s_t and target-network Q at s_{t+n}; next_n_action: (B,) the
    online network's argmax at s_{t+n}; reward: (n, B), zero after an episode's end; done: (B,) the
    episode ended within the n steps; weight: (B,) importance weights. Gradient flows into q.
    target = sum_k gamma^k r_k + gamma^n (1 - done) next_n_q[next_n_action];
    loss = mean(weight (q[action] - target)^2). Returns (loss, td error (B,)).
    """
    n = reward.shape[0]
    ret = torch.zeros_like(reward[0])
    for k in range(n):
        ret = ret + gamma**k * reward[k]
    bootstrap = next_n_q.gather(1, next_n_action.unsqueeze(1)).squeeze(1)
    return _nstep_loss(q, action, ret + gamma**n * (1 - done) * bootstrap, weight)


def _discounted_sum(reward, gamma):
    n = reward.shape[0]
    discounts = torch.full((n,), gamma, dtype=reward.dtype, device=reward.device).pow(
        torch.arange(n, device=reward.device)
    )
    return discounts @ reward


def qntd_vectorized(q, next_n_q, action, next_n_action, reward, done, weight, gamma=0.99):
    """qntd_loop's definition with the n-step sum as one matrix-vector product."""
    n = reward.shape[0]
    bootstrap = next_n_q.gather(1, next_n_action.unsqueeze(1)).squeeze(1)
    return _nstep_loss(q, action, _discounted_sum(reward, gamma) + gamma**n * (1 - done) * bootstrap, weight)


def qntd_rescale_loop(q, next_n_q, action, next_n_action, reward, done, weight, gamma=0.99):
    """qntd_loop with R2D2's value rescaling: Q lives in h-space, the n-step return in reward space.

    target = h(sum_k gamma^k r_k + gamma^n (1 - done) h^-1(next_n_q[next_n_action])).
    """
    n = reward.shape[0]
    ret = torch.zeros_like(reward[0])
    for k in range(n):
        ret = ret + gamma**k * reward[k]
    bootstrap = inverse_value_rescale(next_n_q.gather(1, next_n_action.unsqueeze(1)).squeeze(1))
    return _nstep_loss(q, action, value_rescale(ret + gamma**n * (1 - done) * bootstrap), weight)


def qntd_rescale_vectorized(q, next_n_q, action, next_n_action, reward, done, weight, gamma=0.99):
    """qntd_rescale_loop's definition with the n-step sum as one matrix-vector product."""
    n = reward.shape[0]
    bootstrap = inverse_value_rescale(next_n_q.gather(1, next_n_action.unsqueeze(1)).squeeze(1))
    target = value_rescale(_discounted_sum(reward, gamma) + gamma**n * (1 - done) * bootstrap)
    return _nstep_loss(q, action, target, weight)


# ---------------------------------------------------------------------------------------------------
# Distributional n-step TD (C51)
# ---------------------------------------------------------------------------------------------------


def _c51_positions(reward_sum, discount, atoms, v_min, v_max):
    """Where each shifted atom r + discount z_j lands, in atom units in [0, atoms - 1]."""
    z = torch.linspace(v_min, v_max, atoms, dtype=reward_sum.dtype, device=reward_sum.device)
    tz = (reward_sum.unsqueeze(1) + discount.unsqueeze(1) * z).clamp(v_min, v_max)
    return ((tz - v_min) / ((v_max - v_min) / (atoms - 1))).clamp(0, atoms - 1)


def c51_project(probs, reward_sum, discount, v_min=C51_VMIN, v_max=C51_VMAX):
    """Project the distribution `probs` (B, A) shifted to r + discount z onto the fixed atoms z.

    Each atom's mass is split between its two neighbouring atoms l and l + 1 in proportion to
    closeness. l = floor(position) capped at A - 2, so a target exactly on atom k puts all of its mass
    on k (weight 1 on l = k, or on l + 1 = A - 1 at the top): no mass is lost when l would equal u.
    """
    atoms = probs.shape[1]
    pos = _c51_positions(reward_sum, discount, atoms, v_min, v_max)
    lower = pos.floor().clamp(max=atoms - 2)
    w_upper = pos - lower
    idx = lower.long()
    target = torch.zeros_like(probs).scatter_add(1, idx, probs * (1 - w_upper))
    return target.scatter_add(1, idx + 1, probs * w_upper)


def c51_project_hat(probs, reward_sum, discount, v_min=C51_VMIN, v_max=C51_VMAX):
    """c51_project as a dense product: target_i = sum_j p_j max(0, 1 - |pos_j - i|) (no scatter)."""
    atoms = probs.shape[1]
    pos = _c51_positions(reward_sum, discount, atoms, v_min, v_max)
    grid = torch.arange(atoms, dtype=probs.dtype, device=probs.device)
    hat = (1 - (pos.unsqueeze(2) - grid).abs()).clamp(min=0)  # (B, j, i)
    return torch.bmm(probs.unsqueeze(1), hat).squeeze(1)


def c51_project_loop(probs, reward_sum, discount, v_min=C51_VMIN, v_max=C51_VMAX):
    """c51_project one source atom at a time."""
    B, atoms = probs.shape
    dz = (v_max - v_min) / (atoms - 1)
    rows = torch.arange(B, device=probs.device)
    target = torch.zeros_like(probs)
    for j in range(atoms):
        tz = (reward_sum + discount * (v_min + j * dz)).clamp(v_min, v_max)
        pos = ((tz - v_min) / dz).clamp(0, atoms - 1)
        lower = pos.floor().clamp(max=atoms - 2)
        w_upper = pos - lower
        target.index_put_((rows, lower.long()), probs[:, j] * (1 - w_upper), accumulate=True)
        target.index_put_((rows, lower.long() + 1), probs[:, j] * w_upper, accumulate=True)
    return target


def _dntd_loss(dist, action, target, weight):
    B, _, atoms = dist.shape
    p_sa = dist.gather(1, action.view(B, 1, 1).expand(B, 1, atoms)).squeeze(1)
    per_sample = -(target.detach() * torch.log(p_sa)).sum(1)
    return (weight * per_sample).mean(), per_sample


def _dntd_next(next_n_dist, next_n_action):
    B, _, atoms = next_n_dist.shape
    return next_n_dist.gather(1, next_n_action.view(B, 1, 1).expand(B, 1, atoms)).squeeze(1)


def dntd_loop(dist, next_n_dist, action, next_n_action, reward, done, weight, gamma=0.99):
    """Distributional (C51) n-step TD: cross-entropy to the projected double-Q target distribution.

    dist, next_n_dist: (B, N, 51) probabilities over atoms z in [-10, 10] (online at s_t, target net at
    s_{t+n}); reward: (n, B); done, weight: (B,). target = project(next_n_dist[next_n_action] shifted
    to sum_k gamma^k r_k + gamma^n (1 - done) z); loss = mean(weight * -sum_i target_i log dist[action]_i).
    Gradient flows into dist. Returns (loss, per-sample cross-entropy (B,)).
    """
    n = reward.shape[0]
    ret = torch.zeros_like(reward[0])
    for k in range(n):
        ret = ret + gamma**k * reward[k]
    target = c51_project_loop(_dntd_next(next_n_dist, next_n_action), ret, gamma**n * (1 - done))
    return _dntd_loss(dist, action, target, weight)


def dntd_vectorized(dist, next_n_dist, action, next_n_action, reward, done, weight, gamma=0.99, project="scatter"):
    """dntd_loop's definition; the projection is a scatter-add ('scatter') or a dense product ('hat')."""
    n = reward.shape[0]
    projector = c51_project if project == "scatter" else c51_project_hat
    target = projector(_dntd_next(next_n_dist, next_n_action), _discounted_sum(reward, gamma), gamma**n * (1 - done))
    return _dntd_loss(dist, action, target, weight)


# ---------------------------------------------------------------------------------------------------
# V-trace
# ---------------------------------------------------------------------------------------------------


def vtrace_returns_loop(
    log_rhos, rewards, values, dones, next_value, next_done, gamma=0.99, lam=1.0, rho_bar=1.0, c_bar=1.0
):
    """V-trace targets from log importance ratios log(pi/mu) (T, B), as IMPALA's from_importance_weights.

    rho_t = min(rho_bar, pi/mu), c_t = lambda min(c_bar, pi/mu), gamma_t = gamma m_t (episode ends),
    vs_t = V_t + delta_t + gamma_t c_t (vs_{t+1} - V_{t+1}),  delta_t = rho_t (r_t + gamma_t V_{t+1} - V_t),
    vs_T = V_T = next_value; policy advantage rho_t (r_t + gamma_t vs_{t+1} - V_t).
    Forward only (targets). Returns (vs, policy advantages), both (T, B).
    """
    ratio = torch.exp(log_rhos)
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    discount = gamma * (1.0 - _following(dones, next_done))
    T = rewards.shape[0]
    vs = [None] * T
    correction = torch.zeros_like(next_value)  # vs_{t+1} - V_{t+1}
    for t in reversed(range(T)):
        following_value = next_value if t == T - 1 else values[t + 1]
        delta = rho[t] * (rewards[t] + discount[t] * following_value - values[t])
        correction = delta + discount[t] * c[t] * correction
        vs[t] = values[t] + correction
    vs = torch.stack(vs)
    return vs, rho * (rewards + discount * _following(vs, next_value) - values)


def vtrace_returns_vectorized(
    log_rhos, rewards, values, dones, next_value, next_done,
    gamma=0.99, lam=1.0, rho_bar=1.0, c_bar=1.0, scan="doubling",
):  # fmt: skip
    """vtrace_returns_loop's definition with vs - V as one reverse scan."""
    ratio = torch.exp(log_rhos)
    rho, c = ratio.clamp(max=rho_bar), lam * ratio.clamp(max=c_bar)
    discount = gamma * (1.0 - _following(dones, next_done))
    delta = rho * (rewards + discount * _following(values, next_value) - values)
    vs = values + SCANS[scan](discount * c, delta, torch.zeros_like(next_value))
    return vs, rho * (rewards + discount * _following(vs, next_value) - values)


def _vtrace_loss(target_logits, behaviour_logits, actions, values, returns_fn, vf_coef, ent_coef):
    logp_all = F.log_softmax(target_logits, dim=-1)
    logp = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    behaviour_logp = F.log_softmax(behaviour_logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    vs, pg_adv = returns_fn(logp.detach() - behaviour_logp, values.detach())
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    pg_loss = -(logp * pg_adv).mean()
    value_loss = 0.5 * ((vs - values) ** 2).mean()
    return pg_loss + vf_coef * value_loss - ent_coef * entropy, vs, pg_adv


def vtrace_loop(
    target_logits, behaviour_logits, actions, rewards, values, dones, next_value, next_done,
    gamma=0.99, lam=1.0, rho_bar=1.0, c_bar=1.0, vf_coef=0.5, ent_coef=0.01,
):  # fmt: skip
    """IMPALA's V-trace actor-critic loss (rho-bar = c-bar = 1 by default).

    Logits (T, B, N) of the learner (gradient) and of the behaviour policy, actions (T, B); targets vs and
    policy advantages as in vtrace_returns_loop with pi/mu from the two policies at the actions.
    loss = -mean(log pi(a_t) adv_t) + vf_coef 0.5 mean((vs_t - V_t)^2) - ent_coef mean(entropy_t);
    gradient flows into target_logits and values. Returns (loss, vs, policy advantages).
    """
    returns_fn = lambda log_rhos, v: vtrace_returns_loop(
        log_rhos, rewards, v, dones, next_value, next_done, gamma, lam, rho_bar, c_bar
    )
    return _vtrace_loss(target_logits, behaviour_logits, actions, values, returns_fn, vf_coef, ent_coef)


def vtrace_vectorized(
    target_logits, behaviour_logits, actions, rewards, values, dones, next_value, next_done,
    gamma=0.99, lam=1.0, rho_bar=1.0, c_bar=1.0, vf_coef=0.5, ent_coef=0.01, scan="doubling",
):  # fmt: skip
    """V-trace (same definition as vtrace_loop) with vs - V as one reverse scan."""
    returns_fn = lambda log_rhos, v: vtrace_returns_vectorized(
        log_rhos, rewards, v, dones, next_value, next_done, gamma, lam, rho_bar, c_bar, scan=scan
    )
    return _vtrace_loss(target_logits, behaviour_logits, actions, values, returns_fn, vf_coef, ent_coef)


# ---------------------------------------------------------------------------------------------------
# UPGO
# ---------------------------------------------------------------------------------------------------


def _upgo_follow(rewards, values, discount, next_value):
    """lambda_t = 1 where the next step's action looks at least average: r_{t+1} + gamma_{t+1} V_{t+2} >= V_{t+1}."""
    following_v = _following(values, next_value)
    better = (rewards[1:] + discount[1:] * following_v[1:] >= values[1:]).to(rewards.dtype)
    return torch.cat([better, torch.ones_like(better[:1])]), following_v


def upgo_returns_loop(rewards, values, dones, next_value, next_done, gamma=0.99):
    """AlphaStar's upgoing returns (forward only; targets).

    G_t = r_t + gamma_t ((1 - lambda_t) V_{t+1} + lambda_t G_{t+1}), G_T = V_T = next_value, with
    lambda_t = [r_{t+1} + gamma_{t+1} V_{t+2} >= V_{t+1}] (1 at the last step): the return keeps
    following the trajectory while the next action is at least as good as the value. Returns G (T, B).
    """
    discount = gamma * (1.0 - _following(dones, next_done))
    follow, following_v = _upgo_follow(rewards, values, discount, next_value)
    T = rewards.shape[0]
    returns = [None] * T
    following_return = next_value
    for t in reversed(range(T)):
        blend = (1 - follow[t]) * following_v[t] + follow[t] * following_return
        following_return = rewards[t] + discount[t] * blend
        returns[t] = following_return
    return torch.stack(returns)


def upgo_returns_vectorized(rewards, values, dones, next_value, next_done, gamma=0.99, scan="doubling"):
    """upgo_returns_loop's definition as one reverse scan."""
    discount = gamma * (1.0 - _following(dones, next_done))
    follow, following_v = _upgo_follow(rewards, values, discount, next_value)
    return SCANS[scan](discount * follow, rewards + discount * (1 - follow) * following_v, next_value)


def _upgo_loss(target_logits, rhos, actions, values, returns):
    logp = F.log_softmax(target_logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return -(rhos * (returns - values.detach()) * logp).mean(), returns


def upgo_loop(target_logits, rhos, actions, rewards, values, dones, next_value, next_done, gamma=0.99):
    """AlphaStar's upgoing policy update (UPGO) policy loss.

    Logits (T, B, N) (gradient), rhos (T, B) clipped importance ratios, actions (T, B), returns G as in
    upgo_returns_loop. loss = -mean(rho_t (G_t - V_t) log pi(a_t)). Returns (loss, G (T, B)).
    """
    returns = upgo_returns_loop(rewards, values.detach(), dones, next_value, next_done, gamma)
    return _upgo_loss(target_logits, rhos, actions, values, returns)


def upgo_vectorized(
    target_logits, rhos, actions, rewards, values, dones, next_value, next_done, gamma=0.99, scan="doubling"
):
    """UPGO (same definition as upgo_loop) with the returns as one reverse scan."""
    returns = upgo_returns_vectorized(rewards, values.detach(), dones, next_value, next_done, gamma, scan=scan)
    return _upgo_loss(target_logits, rhos, actions, values, returns)


# ---------------------------------------------------------------------------------------------------
# PPO
# ---------------------------------------------------------------------------------------------------


def ppo_loop(
    logits, old_logits, actions, newvalue, oldvalue, advantages, returns,
    clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True,
):  # fmt: skip
    """Clipped PPO loss with value clipping and entropy bonus, CleanRL's eager code (Categorical).

    logits, old_logits: (B, N); actions, values, advantages, returns: (B,). Gradient flows into
    logits and newvalue. Returns (loss, policy loss, value loss, entropy, approx_kl, clipfrac).
    """
    dist = torch.distributions.Categorical(logits=logits)
    newlogprob, entropy = dist.log_prob(actions), dist.entropy()
    oldlogprob = torch.distributions.Categorical(logits=old_logits).log_prob(actions)
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    mb_advantages = advantages
    if norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    if clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    return loss, pg_loss, v_loss, entropy_loss, approx_kl, clipfrac


def ppo_vectorized(
    logits, old_logits, actions, newvalue, oldvalue, advantages, returns,
    clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True,
):  # fmt: skip
    """ppo_loop's loss from one log_softmax per policy, without the distribution objects."""
    logp_all = F.log_softmax(logits, dim=-1)
    index = actions.unsqueeze(1)
    logratio = logp_all.gather(1, index).squeeze(1) - F.log_softmax(old_logits, dim=-1).gather(1, index).squeeze(1)
    ratio = logratio.exp()
    entropy = -(logp_all.exp() * logp_all).sum(1).mean()
    adv = advantages
    if norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_err = (newvalue - returns) ** 2
    if clip_vloss:
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        v_err = torch.max(v_err, (v_clipped - returns) ** 2)
    v_loss = 0.5 * v_err.mean()
    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss
    ratio_d, logratio_d = ratio.detach(), logratio.detach()
    approx_kl = ((ratio_d - 1) - logratio_d).mean()
    clipfrac = ((ratio_d - 1.0).abs() > clip_coef).to(ratio.dtype).mean()
    return loss, pg_loss, v_loss, entropy, approx_kl, clipfrac


# ---------------------------------------------------------------------------------------------------
# Layer-norm LSTM
# ---------------------------------------------------------------------------------------------------

LSTM_PARAMS_PER_LAYER = 7  # wx, wh, bias, ln_x weight, ln_x bias, ln_h weight, ln_h bias


def lstm_cell(gx, h, c, wh, ln_h_weight, ln_h_bias):
    """One recurrent step given the normalized input pre-activation gx (bias included)."""
    gate = gx + F.layer_norm(h @ wh, (wh.shape[1],), ln_h_weight, ln_h_bias)
    i, f, o, u = gate.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def lstm_loop(x, h0, c0, *params):
    """Layer-norm LSTM as in HPC_RL / DI-engine, layer by layer, step by step.

    x: (T, B, input); h0, c0: (layers, B, H); params: per layer wx (in, 4H), wh (H, 4H), bias (4H) and
    LayerNorm weight/bias (4H) for the input and for the recurrent pre-activation:
    gates = LN_x(x_t wx) + LN_h(h_{t-1} wh) + bias, split i, f, o, u;
    c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(u), h_t = sigmoid(o) tanh(c_t).
    Returns (output (T, B, H), h_n, c_n). Gradients flow into x and every parameter.
    """
    layers = len(params) // LSTM_PARAMS_PER_LAYER
    hs, cs = [], []
    for layer in range(layers):
        wx, wh, bias, gxw, gxb, ghw, ghb = params[layer * LSTM_PARAMS_PER_LAYER : (layer + 1) * LSTM_PARAMS_PER_LAYER]
        h, c = h0[layer], c0[layer]
        outputs = []
        for x_t in x.unbind(0):  # not x[t]: each indexing would cost a full-size zero gradient in the backward
            gate = F.layer_norm(x_t @ wx, (wx.shape[1],), gxw, gxb) + F.layer_norm(h @ wh, (wh.shape[1],), ghw, ghb)
            gate = gate + bias
            i, f, o, u = gate.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        x = torch.stack(outputs)
        hs.append(h)
        cs.append(c)
    return x, torch.stack(hs), torch.stack(cs)


def lstm_vectorized(x, h0, c0, *params, cell=lstm_cell):
    """lstm_loop with the input projection and its LayerNorm hoisted out of the time loop.

    Layer by layer, x_t wx and LN_x for all T steps are one (T B, in) x (in, 4H) matmul; only the
    recurrent half stays in the loop (`cell`, which the compiled form replaces by its compiled twin).
    """
    layers = len(params) // LSTM_PARAMS_PER_LAYER
    T, B = x.shape[:2]
    hs, cs = [], []
    for layer in range(layers):
        wx, wh, bias, gxw, gxb, ghw, ghb = params[layer * LSTM_PARAMS_PER_LAYER : (layer + 1) * LSTM_PARAMS_PER_LAYER]
        gx = F.layer_norm(x.reshape(T * B, -1) @ wx, (wx.shape[1],), gxw, gxb) + bias
        gx = gx.view(T, B, -1)
        h, c = h0[layer], c0[layer]
        outputs = []
        for gx_t in gx.unbind(0):
            h, c = cell(gx_t, h, c, wh, ghw, ghb)
            outputs.append(h)
        x = torch.stack(outputs)
        hs.append(h)
        cs.append(c)
    return x, torch.stack(hs), torch.stack(cs)


# ---------------------------------------------------------------------------------------------------
# Scatter connection (AlphaStar's entity -> spatial map)
# ---------------------------------------------------------------------------------------------------


def scatter_loop(features, locations, height=SCATTER_H, width=SCATTER_W):
    """Scatter entity features into a spatial map, adding where entities share a cell.

    features: (B, M, N) for M entities with N channels; locations: (B, M, 2) integer (y, x) cells of
    a height x width map. out[b, :, y, x] = sum of features[b, m] over entities m at (y, x).
    Returns (B, N, height, width); gradient flows into features. One sample of the batch at a time.
    """
    B, M, N = features.shape
    flat = locations[..., 0] * width + locations[..., 1]
    # unbind rather than features[b]: each indexing would cost a full-size zero gradient in the backward
    maps = [
        features.new_zeros(height * width, N).index_add(0, i, f) for f, i in zip(features.unbind(0), flat.unbind(0))
    ]
    return torch.stack(maps).transpose(1, 2).unflatten(2, (height, width))  # a channels-last view


def scatter_vectorized(features, locations, height=SCATTER_H, width=SCATTER_W):
    """scatter_loop's definition as one scatter-add over the flattened map, channels first (no transpose)."""
    B, M, N = features.shape
    flat = (locations[..., 0] * width + locations[..., 1]).unsqueeze(1).expand(B, N, M)
    out = features.new_zeros(B, N, height * width).scatter_add_(2, flat, features.transpose(1, 2))  # in place: no copy
    return out.view(B, N, height, width)


# ---------------------------------------------------------------------------------------------------
# Operator registry: inputs, forms, candidates
# ---------------------------------------------------------------------------------------------------


@dataclass
class Operator:
    """How to build, run and differentiate one operator."""

    name: str
    loop: object
    candidates: dict  # vectorized variants, name -> function
    compile_candidates: tuple  # candidate names compiled on CPU
    cuda_compile_candidates: tuple  # candidate names compiled on CUDA
    make_inputs: object  # (dims, generator) -> (args tuple on CPU, grad argnums, cotangent or None)
    notes: str = ""
    # max-norm relative tolerance against float64; the LSTM's float32 rounding grows through 256 steps
    # of 1792-wide products (about 1e-4 of the largest value at 64 steps), so it gets 2e-3
    tol: float = 1e-4
    # the size at which forms are checked, when checking at the timed size would cost minutes (LSTM)
    check_size: object = None


def parse_size(size):
    """'T=16,B=128,N=128' -> {'T': 16, 'B': 128, 'N': 128}."""
    return {k: int(v) for k, v in (item.split("=") for item in size.split(","))}


def _rollout(T, B, g):
    rewards = torch.randn(T, B, generator=g)
    values = torch.randn(T, B, generator=g)
    dones = (torch.rand(T, B, generator=g) < 0.1).float()
    dones[T // 2, ::2] = 1.0  # make sure every size has episode ends
    next_value = torch.randn(B, generator=g)
    next_done = (torch.rand(B, generator=g) < 0.1).float()
    next_done[::3] = 1.0
    return rewards, values, dones, next_value, next_done


def _gae_inputs(d, g):
    return _rollout(d["T"], d["B"], g), (), None


def _td_lambda_inputs(d, g):
    return _rollout(d["T"], d["B"], g), (1,), None


def _nstep_inputs(d, g, atoms=None):
    n, B, N = d["T"], d["B"], d["N"]
    if atoms is None:
        q, next_q = torch.randn(B, N, generator=g), torch.randn(B, N, generator=g)
    else:
        q = torch.softmax(torch.randn(B, N, atoms, generator=g), -1)
        next_q = torch.softmax(torch.randn(B, N, atoms, generator=g), -1)
    action = torch.randint(N, (B,), generator=g)
    next_action = torch.randint(N, (B,), generator=g)
    reward = torch.randn(n, B, generator=g)
    done = (torch.rand(B, generator=g) < 0.2).float()
    done[::4] = 1.0
    weight = torch.rand(B, generator=g) + 0.5
    return (q, next_q, action, next_action, reward, done, weight), (0,), None


def _vtrace_inputs(d, g):
    T, B, N = d["T"], d["B"], d["N"]
    logits = torch.randn(T, B, N, generator=g)
    behaviour = logits + 0.5 * torch.randn(T, B, N, generator=g)  # ratios on both sides of 1
    actions = torch.randint(N, (T, B), generator=g)
    return (logits, behaviour, actions, *_rollout(T, B, g)), (0, 4), None


def _vtrace_returns_inputs(d, g):
    T, B = d["T"], d["B"]
    log_rhos = 0.5 * torch.randn(T, B, generator=g)  # ratios on both sides of 1
    return (log_rhos, *_rollout(T, B, g)), (), None


def _upgo_rollout(T, B, g):
    """A rollout whose 'r_{t+1} + gamma_{t+1} V_{t+2} >= V_{t+1}' tests are clear of ties, so float32 and
    the float64 reference take the same branch (the returns are discontinuous there)."""
    rewards, values, dones, next_value, next_done = _rollout(T, B, g)
    discount = 0.99 * (1 - torch.cat([dones[1:], next_done[None]]))
    following_v = torch.cat([values[1:], next_value[None]])
    margin = rewards[1:] + discount[1:] * following_v[1:] - values[1:]
    rewards[1:] += torch.where(margin >= 0, 2e-3, -2e-3) * (margin.abs() < 1e-3)
    return rewards, values, dones, next_value, next_done


def _upgo_returns_inputs(d, g):
    return _upgo_rollout(d["T"], d["B"], g), (), None


def _upgo_inputs(d, g):
    T, B, N = d["T"], d["B"], d["N"]
    logits = torch.randn(T, B, N, generator=g)
    rhos = torch.exp(0.3 * torch.randn(T, B, generator=g)).clamp(max=1.0)
    actions = torch.randint(N, (T, B), generator=g)
    rewards, values, dones, next_value, next_done = _upgo_rollout(T, B, g)
    return (logits, rhos, actions, rewards, values, dones, next_value, next_done), (0,), None


def _ppo_inputs(d, g):
    B, N = d["B"], d["N"]
    logits = torch.randn(B, N, generator=g)
    old_logits = logits + 0.3 * torch.randn(B, N, generator=g)  # some ratios clipped, some not
    actions = torch.randint(N, (B,), generator=g)
    newvalue = torch.randn(B, generator=g)
    oldvalue = newvalue + 0.3 * torch.randn(B, generator=g)
    advantages, returns = torch.randn(B, generator=g), torch.randn(B, generator=g)
    return (logits, old_logits, actions, newvalue, oldvalue, advantages, returns), (0, 3), None


def lstm_params(input_size, hidden, layers, g, dtype=torch.float32):
    """Random LN-LSTM parameters in lstm_loop's order (uniform +-1/sqrt(H), LayerNorm near identity)."""
    bound = 1 / math.sqrt(hidden)
    params = []
    for layer in range(layers):
        fan_in = input_size if layer == 0 else hidden
        params += [
            (torch.rand(fan_in, 4 * hidden, generator=g, dtype=dtype) * 2 - 1) * bound,
            (torch.rand(hidden, 4 * hidden, generator=g, dtype=dtype) * 2 - 1) * bound,
            (torch.rand(4 * hidden, generator=g, dtype=dtype) * 2 - 1) * bound,
            1 + 0.1 * torch.randn(4 * hidden, generator=g, dtype=dtype),
            0.1 * torch.randn(4 * hidden, generator=g, dtype=dtype),
            1 + 0.1 * torch.randn(4 * hidden, generator=g, dtype=dtype),
            0.1 * torch.randn(4 * hidden, generator=g, dtype=dtype),
        ]
    return params


def _lstm_inputs(d, g, input_size=LSTM_INPUT, hidden=LSTM_HIDDEN, layers=LSTM_LAYERS):
    T, B = d["seq_len"], d["B"]
    x = torch.randn(T, B, input_size, generator=g)
    h0 = 0.1 * torch.randn(layers, B, hidden, generator=g)
    c0 = 0.1 * torch.randn(layers, B, hidden, generator=g)
    params = lstm_params(input_size, hidden, layers, g)
    cotangent = torch.randn(T, B, hidden, generator=g)
    return (x, h0, c0, *params), tuple([0] + list(range(3, 3 + len(params)))), cotangent


def _lstm_check_size(size):
    """Check the LSTM over its first 16 steps: the float64 loop at 256 steps alone takes a minute on CPU."""
    d = parse_size(size)
    return f"seq_len={min(d['seq_len'], 16)},B={d['B']}"


def _scatter_inputs(d, g):
    B, M, N = d["B"], d["M"], d["N"]
    features = torch.randn(B, M, N, generator=g)
    locations = torch.stack(
        [torch.randint(SCATTER_H, (B, M), generator=g), torch.randint(SCATTER_W, (B, M), generator=g)], dim=-1
    )
    cotangent = torch.randn(B, N, SCATTER_H, SCATTER_W, generator=g)
    return (features, locations), (0,), cotangent


def _scan_candidates(fn, extra=None):
    candidates = {name: functools.partial(fn, scan=name) for name in ("doubling", "chunked", "assoc")}
    candidates.update(extra or {})
    return candidates


def operators():
    """The benchmarked operators, by name (built on call so that importing does no work)."""
    ops = [
        Operator(
            "gae", gae_loop, _scan_candidates(gae_vectorized, {"cumsum": gae_cumsum}),
            ("doubling",), ("doubling", "assoc"), _gae_inputs, "forward only",
        ),
        Operator(
            "td_lambda", td_lambda_loop, _scan_candidates(td_lambda_vectorized),
            ("doubling",), ("doubling", "assoc"), _td_lambda_inputs,
        ),
        Operator("qntd", qntd_loop, {"matvec": qntd_vectorized}, ("matvec",), ("matvec",), _nstep_inputs),
        Operator(
            "qntd_rescale", qntd_rescale_loop, {"matvec": qntd_rescale_vectorized},
            ("matvec",), ("matvec",), _nstep_inputs,
        ),
        Operator(
            "dntd", dntd_loop,
            {p: functools.partial(dntd_vectorized, project=p) for p in ("scatter", "hat")},
            ("scatter",), ("scatter", "hat"), functools.partial(_nstep_inputs, atoms=C51_ATOMS),
        ),
        Operator(
            "vtrace", vtrace_loop, _scan_candidates(vtrace_vectorized),
            ("doubling",), ("doubling", "assoc"), _vtrace_inputs,
        ),
        Operator(
            "vtrace_returns", vtrace_returns_loop, _scan_candidates(vtrace_returns_vectorized),
            ("doubling",), ("doubling", "assoc"), _vtrace_returns_inputs, "recurrence only, forward",
        ),
        Operator(
            "upgo", upgo_loop, _scan_candidates(upgo_vectorized), ("doubling",), ("doubling", "assoc"), _upgo_inputs
        ),
        Operator(
            "upgo_returns", upgo_returns_loop, _scan_candidates(upgo_returns_vectorized),
            ("doubling",), ("doubling", "assoc"), _upgo_returns_inputs, "recurrence only, forward",
        ),
        Operator("ppo", ppo_loop, {"log_softmax": ppo_vectorized}, ("log_softmax",), ("log_softmax",), _ppo_inputs),
        Operator(
            "lstm", lstm_loop, {"hoisted": lstm_vectorized}, ("hoisted",), ("hoisted",), _lstm_inputs,
            f"input {LSTM_INPUT}, hidden {LSTM_HIDDEN}, {LSTM_LAYERS} layers", tol=2e-3, check_size=_lstm_check_size,
        ),
        Operator(
            "scatter", scatter_loop, {"scatter_add": scatter_vectorized}, ("scatter_add",), ("scatter_add",),
            _scatter_inputs, f"{SCATTER_H}x{SCATTER_W} map, add",
        ),
    ]  # fmt: skip
    return {op.name: op for op in ops}


def make_inputs(op, size, device="cpu", seed=0):
    """(args on device, grad argnums, cotangent) for operator `op` at size string `size`."""
    g = torch.Generator().manual_seed(seed)
    args, grad_argnums, cotangent = op.make_inputs(parse_size(size), g)
    args = tuple(a.to(device) for a in args)
    return args, grad_argnums, None if cotangent is None else cotangent.to(device)


def make_step(fn, args, grad_argnums, cotangent=None):
    """A no-argument closure: one forward and, where the operator has a gradient, one backward.

    Returns the forward's tensors followed by the gradients (in grad_argnums order).
    """
    if grad_argnums:
        args = tuple(a.detach().requires_grad_(i in grad_argnums) for i, a in enumerate(args))
        leaves = [args[i] for i in grad_argnums]

    def step():
        outputs = fn(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if not grad_argnums:
            return outputs
        grads = torch.autograd.grad(outputs[0], leaves, grad_outputs=cotangent)
        return tuple(o.detach() for o in outputs) + tuple(grads)

    return step


def to_float64(args, cotangent):
    cast = lambda t: t.double() if t is not None and t.is_floating_point() else t
    return tuple(cast(a) for a in args), cast(cotangent)


def compare(outputs, reference, tol=1e-4):
    """Max-norm relative error check of every output against the float64 reference.

    Returns (ok, worst relative error). A tensor passes when max|out - ref| <= tol * max(|ref|),
    so float32 rounding over long sums passes and a wrong value anywhere does not.
    """
    if len(outputs) != len(reference):
        return False, math.inf
    worst = 0.0
    for out, ref in zip(outputs, reference):
        if out.shape != ref.shape:
            return False, math.inf
        scale = ref.abs().max().item() if ref.numel() else 0.0
        err = (out.double() - ref).abs().max().item() if ref.numel() else 0.0
        if not math.isfinite(err):
            return False, math.inf
        worst = max(worst, err / max(scale, 1e-30))
    return worst <= tol, worst


# ---------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device, budget_s=1.0, max_reps=100, min_reps=3):
    """Median microseconds of fn() after warm-up; CUDA events on GPU, perf_counter on CPU.

    The repetition count fits the budget: slow forms (Python loops at big sizes) get few repetitions,
    fast ones up to max_reps.
    """
    start = time.perf_counter()
    fn()  # first call (already checked, so caches and compiled code are ready)
    _sync(device)
    one = time.perf_counter() - start
    for _ in range(2 if one < 0.05 else 0):
        fn()
    _sync(device)
    reps = int(max(min_reps, min(max_reps, budget_s / max(one, 1e-6))))
    if one > budget_s:  # a slow form: its warm call counts as a sample (a second warm-up would buy nothing)
        rest, _ = _timed_reps(fn, device, min_reps - 1)
        return statistics.median([one * 1e6, *rest]), min_reps
    times, reps = _timed_reps(fn, device, reps)
    return statistics.median(times), reps


def _timed_reps(fn, device, reps):
    times = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for begin, end in events:
            begin.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [begin.elapsed_time(end) * 1e3 for begin, end in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return times, reps


def cuda_graph_step(step):
    """Capture step (forward + backward) in a CUDA graph; returns (replay, the graph's static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as capture requires
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = step()
    return graph.replay, static_outputs


def configure_compile():
    """One compiled entry per (function, shape): never fall back to eager silently when the cache fills."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def compile_form(op, name, dynamic=False):
    """The compiled form of candidate `name` of operator `op`."""
    if op.name == "lstm":  # compile the recurrent cell; the loop over time stays in Python
        return functools.partial(lstm_vectorized, cell=torch.compile(lstm_cell, dynamic=dynamic))
    return torch.compile(op.candidates[name], dynamic=dynamic)


# ---------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------


def machine_info(device):
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_at_start": _load_average(),
    }
    return info


def _load_average():
    """1-minute load average (other processes share the CPU: worth knowing when reading CPU times)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def device_tag(device):
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "").strip()
    return "cuda_" + "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


def benchmark_sizes(quick, names):
    if quick:
        rows = [(op, size, None, None) for op, size in QUICK_SIZES]
    else:
        rows = [(op, size, pt, fused) for op, size, pt, fused in HPC_RL_V100]
        rows += [(op, size, None, None) for op, size in EXTRA_SIZES]
        order = list(operators())
        rows.sort(key=lambda r: (order.index(r[0]), math.prod(parse_size(r[1]).values())))
    return [r for r in rows if names is None or r[0] in names]


@dataclass
class Checker:
    """Checks a form against the float64 reference, then times it only if it passes."""

    reference: tuple
    device: torch.device
    budget_s: float
    max_reps: int
    tol: float

    def __call__(self, variant, check_run, timed_run=None, outputs=None):
        """Run check_run and compare its outputs (or `outputs`, a CUDA graph's static ones after the
        run); then time timed_run (default: check_run, when the check is at the timed size)."""
        try:
            result = check_run()
            ok, err = compare(result if outputs is None else outputs, self.reference, self.tol)
        except Exception as exc:  # a form that raises is a failing form, reported, not a crash
            return {"variant": variant, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        if not ok:
            return {"variant": variant, "ok": False, "error": f"max relative error {err:.2e} > {self.tol:g}"}
        us, reps = time_call(timed_run or check_run, self.device, self.budget_s, self.max_reps)
        return {"variant": variant, "ok": True, "us": us, "reps": reps, "max_rel_err": err}


def _best(results):
    ok = [r for r in results if r.get("ok")]
    return min(ok, key=lambda r: r["us"]) if ok else (results[0] if results else None)


def run_row(op, size, device, args, compiled_cache):
    """Check and time every form of operator op at one size; returns {form: result}."""
    check_size = op.check_size(size) if op.check_size else size
    built = {s: make_inputs(op, s, device, seed=args.seed) for s in dict.fromkeys([check_size, size])}
    ref_args, ref_cot = to_float64(built[check_size][0], built[check_size][2])
    check = Checker(
        make_step(op.loop, ref_args, built[check_size][1], ref_cot)(), device, args.budget, args.reps, op.tol
    )

    def steps_of(fn):
        """(step at the check size, step at the timed size, or None where the sizes are the same)."""
        check_step = make_step(fn, *built[check_size])
        return check_step, (make_step(fn, *built[size]) if size != check_size else None)

    forms = {"loop": check("loop", *steps_of(op.loop))}
    candidates = [check(name, *steps_of(fn)) for name, fn in op.candidates.items()]
    forms["vectorized"] = dict(_best(candidates), candidates=candidates)
    if args.no_compile:
        return forms
    names = op.cuda_compile_candidates if device.type == "cuda" else op.compile_candidates
    compiled, steps = [], {}
    for name in names:
        if (op.name, name) not in compiled_cache:
            compiled_cache[op.name, name] = compile_form(op, name)
        steps[name] = steps_of(compiled_cache[op.name, name])
        t0 = time.perf_counter()
        result = check(name, *steps[name])
        result["compile_check_time_s"] = time.perf_counter() - t0
        compiled.append(result)
    best = _best(compiled)
    forms["compiled"] = dict(best, candidates=compiled)
    if device.type == "cuda" and best["ok"]:
        forms["cudagraph"] = _cudagraph_result(check, steps[best["variant"]], best["variant"])
    return forms


def _cudagraph_result(check, steps, variant):
    """The compiled step captured in a CUDA graph: a replay checked at the check size, replays timed."""
    check_step, timed_step = steps
    try:
        check_replay, static_outputs = cuda_graph_step(check_step)
        timed_replay = cuda_graph_step(timed_step)[0] if timed_step is not None else None
    except Exception as exc:
        return {"variant": variant, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return check(variant, check_replay, timed_replay, outputs=static_outputs)


def summarize(op_name, size, pt, fused, forms):
    timed = {k: v for k, v in forms.items() if v and v.get("ok")}
    best_form = min(timed, key=lambda k: timed[k]["us"]) if timed else None
    best_us = timed[best_form]["us"] if best_form else None
    loop_us = timed["loop"]["us"] if "loop" in timed else None
    return {
        "operator": op_name,
        "size": size,
        "hpc_rl_v100_pytorch_us": pt,
        "hpc_rl_v100_fused_us": fused,
        "extra_size": pt is None,
        "forms": forms,
        "best_form": best_form,
        "best_us": best_us,
        "best_speedup_vs_loop": loop_us / best_us if best_us and loop_us else None,
        "hpc_rl_fused_over_best": fused / best_us if best_us and fused else None,
    }


FORM_COLUMNS = [
    ("loop", "loop"),
    ("vectorized", "vectorized"),
    ("compiled", "compiled"),
    ("cudagraph", "compiled+cudagraph"),
]


def _us(x):
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _cell(form):
    if form is None:
        return "n/a"
    return _us(form["us"]) if form.get("ok") else "FAIL"


def machine_line(info):
    device = info["device"] if info["device"] != "cpu" else "CPU only"
    load = info.get("load_average_at_start")
    return (
        f"Measured on {device}; CPU {info['cpu']} ({info['cpu_count']} cores, {info['torch_threads']} torch threads"
        + (f", load average {load} at start" if load is not None else "")
        + f"); torch {info['torch']}"
        + (f", CUDA {info['cuda']}" if info.get("cuda") else "")
        + f"; {info['date']}."
    )


def to_markdown(report):
    info, rows = report["machine"], report["rows"]
    lines = [
        machine_line(info),
        "",
        "Times in microseconds per call (forward + backward where the operator has a gradient), median after "
        "warm-up; HPC_RL's figures are theirs, on a 32 GB V100. Every form was checked against a float64 "
        "reference first; FAIL = wrong result, not timed; n/a = not run on this device. "
        "Extra sizes (no HPC_RL figure) are leanrl's, to measure the recurrences at T=1024; vtrace_returns and "
        "upgo_returns are V-trace's and UPGO's recurrences alone (targets from given ratios and values, forward "
        "only), without the softmax over actions and the loss that dominate the full operators at B x N = 64 x 16.",
        "",
        "| operator | size | HPC_RL V100 PyTorch us | HPC_RL V100 fused us | "
        + " | ".join(f"{title} us" for _, title in FORM_COLUMNS)
        + " | best / loop | HPC_RL fused / best | variants |",
        "|" + "---|" * (4 + len(FORM_COLUMNS) + 3),
    ]
    known = operators()
    for r in rows:
        forms = r["forms"]
        variants = ", ".join(f"{k}: {forms[k]['variant']}" for k in ("vectorized", "compiled") if forms.get(k))
        notes = known[r["operator"]].notes if r["operator"] in known else ""
        variants += f"; {notes}" if notes else ""
        lines.append(
            f"| {r['operator']} | {r['size']}{' (extra)' if r['extra_size'] else ''} | "
            f"{_us(r['hpc_rl_v100_pytorch_us'])} | {_us(r['hpc_rl_v100_fused_us'])} | "
            + " | ".join(_cell(forms.get(key)) for key, _ in FORM_COLUMNS)
            + f" | {_ratio(r['best_speedup_vs_loop'])} | {_ratio(r['hpc_rl_fused_over_best'])} | {variants} |"
        )
    lines += ["", "Vectorized and compiled candidates (us; FAIL = wrong result):", ""]
    lines += ["| operator | size | form | candidates |", "|---|---|---|---|"]
    for r in rows:
        for key in ("vectorized", "compiled"):
            form = r["forms"].get(key)
            if form and len(form.get("candidates", [])) > 1:
                cands = ", ".join(f"{c['variant']} {_cell(c)}" for c in form["candidates"])
                lines.append(f"| {r['operator']} | {r['size']} | {key} | {cands} |")
    lines += ["", f"Command: `{report['command']}`; total {report['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def _ratio(x):
    if x is None:
        return "—"
    return f"{x:.2g}x" if x < 1 else (f"{x:.1f}x" if x < 100 else f"{x:,.0f}x")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few small sizes per operator")
    p.add_argument(
        "--out", default=None, help=f"folder for rl_ops_<tag>.md/.json (default {FULL_OUT}; --quick: {QUICK_OUT})"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--reps", type=int, default=100, help="most timed repetitions per form")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of timed repetitions aimed at per form")
    p.add_argument("--ops", default=None, help="comma-separated operators (default: all)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled forms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--tag", default=None, help="file suffix (default: the device, e.g. cpu; cpu_quick with --quick)")
    p.add_argument("--merge", nargs="+", default=None, help="combine these JSON reports (parts of one run) instead")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / (QUICK_OUT if args.quick else FULL_OUT))
    return args


class WouldClobber(Exception):
    """A quick report would replace a full run's report."""


def write_report(report, out, tag, prefix="rl_ops", render=None):
    """<out>/<prefix>_<tag>.json and .md; a quick report never replaces a full one (benchmarks/replay.py too)."""
    out = Path(out)
    existing = out / f"{prefix}_{tag}.json"
    if report.get("quick") and existing.exists() and not json.loads(existing.read_text()).get("quick", False):
        raise WouldClobber(f"{existing} holds a full run; a --quick run does not replace it (choose --out or --tag)")
    out.mkdir(parents=True, exist_ok=True)
    existing.write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{prefix}_{tag}.md").write_text((render or to_markdown)(report))
    print(f"wrote {out / f'{prefix}_{tag}.md'} and .json", file=sys.stderr)


def merge_reports(paths):
    """One report from several parts of a run (e.g. --ops splits on a GPU with a per-command time limit)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    devices = {part["machine"]["device"] for part in parts}
    if len(devices) != 1:
        raise ValueError(f"--merge: parts come from different devices {sorted(devices)}")
    order = {(op, size): i for i, (op, size, *_) in enumerate(benchmark_sizes(False, None))}
    rows = sorted(
        (row for part in parts for row in part["rows"]), key=lambda r: order.get((r["operator"], r["size"]), 1e9)
    )
    return {
        "machine": parts[0]["machine"],
        "quick": any(part.get("quick", False) for part in parts),
        "command": " + ".join(part["command"] for part in parts),
        "wall_s": sum(part["wall_s"] for part in parts),
        "rows": rows,
    }


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        report = merge_reports(args.merge)
        tag = args.tag or Path(args.merge[0]).stem.removeprefix("rl_ops_").split("_part")[0]
        return write_or_refuse(report, args.out, tag)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available on this machine", file=sys.stderr)
        return 2
    known = operators()
    names = None if args.ops is None else args.ops.split(",")
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        print(f"--ops: unknown operator(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    configure_compile()
    start = time.perf_counter()
    info = machine_info(device)
    print(machine_line(info), file=sys.stderr)
    rows, compiled_cache = [], {}
    for op_name, size, pt, fused in benchmark_sizes(args.quick, names):
        t0 = time.perf_counter()
        forms = run_row(known[op_name], size, device, args, compiled_cache)
        row = summarize(op_name, size, pt, fused, forms)
        rows.append(row)
        cells = "  ".join(f"{key}={_cell(forms.get(key))}" for key, _ in FORM_COLUMNS)
        print(f"{op_name:13s} {size:20s} {cells}  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    report = {
        "machine": info,
        "quick": args.quick,
        "command": "python benchmarks/rl_ops.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "wall_s": time.perf_counter() - start,
        "rows": rows,
    }
    report["machine"]["load_average_at_end"] = _load_average()
    print(f"total {report['wall_s']:.0f} s", file=sys.stderr)
    return write_or_refuse(report, args.out, args.tag or device_tag(device) + ("_quick" if args.quick else ""))


def write_or_refuse(report, out, tag, prefix="rl_ops", render=None):
    try:
        write_report(report, out, tag, prefix, render)
    except WouldClobber as err:
        print(f"{prefix}.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
