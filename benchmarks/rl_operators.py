"""RL operators in plain PyTorch: each as the Python loop its definition suggests and as vectorized tensor code.

These are the operators HPC_RL (OpenDILab) hand-wrote fused CUDA kernels for: GAE, TD(lambda), q-value
n-step TD (also with R2D2's value rescaling), C51's distributional n-step TD, V-trace, UPGO, the PPO loss,
a layer-norm LSTM and a scatter. This file is the code to read: the loops, the vectorized forms and the
solvers of the reverse linear recurrences (the twins inline the same recursive-doubling GAE).
``benchmarks/bench_rl_operators.py`` checks every form against a float64 reference and times it at HPC_RL's sizes.

Conventions shared by every operator
------------------------------------
* Time-major tensors: ``(T, B, ...)``; ``T`` steps, ``B`` parallel environments (or sequences).
* Episode ends follow CleanRL: ``dones[t] == 1`` means ``obs[t]`` begins a new episode, so step ``t``
  bootstraps from ``values[t + 1]`` unless ``dones[t + 1]``; the last step bootstraps from
  ``next_value`` unless ``next_done``. Written ``m_t = 1 - dones[t + 1]`` (``dones[T] = next_done``)
  and ``V_T = next_value``, the discount of step t is ``gamma_t = gamma * m_t``.
* Targets (advantages, returns) carry no gradient: they are computed from detached values.

The reverse linear recurrences (GAE, TD(lambda), V-trace, UPGO) ``x_t = b_t + a_t x_{t+1}`` have these
solvers: ``doubling`` (recursive doubling: log2(T) steps of ``x_t += A_t x_{t+k}; A_t *= A_{t+k}``),
``chunked`` (exact transfer matrices inside chunks of 32 steps, doubling across chunks), ``assoc``
(``torch._higher_order_ops.associative_scan``, its generic mode when eager) and, for GAE, ``cumsum``
(discounted cumulative sum rescaled by powers of gamma*lambda in float64, segmented at episode ends).
C51's projection has a ``scatter`` and a dense ``hat`` form.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# The scatter's map and C51's support (HPC_RL's tests' dimensions), R2D2's value-rescaling epsilon.
SCATTER_H = SCATTER_W = 16
C51_VMIN, C51_VMAX = -10.0, 10.0
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


def lstm_params(input_size, hidden, layers, g, dtype=torch.float32):
    """Random LN-LSTM parameters in ops.lstm_loop's order (uniform +-1/sqrt(H), LayerNorm near identity)."""
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
