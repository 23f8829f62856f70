"""Float64 references written independently of the scripts: plain Python loops over time.

Every pure math function of a script (or of benchmarks/) is tested against these.
"""

import math

import torch


def gae_reference(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE with CleanRL's convention, one scalar at a time, in float64.

    dones[t] == 1 means obs[t] begins a new episode, so step t bootstraps from values[t + 1]
    unless dones[t + 1]; the last step bootstraps from next_value unless next_done.
    Inputs are (T, B) tensors (next_*: (B,)); returns (T, B) float64 advantages.
    """
    r, v, d = (x.double().tolist() for x in (rewards, values, dones))
    nv, nd = next_value.double().tolist(), next_done.double().tolist()
    T, B = len(r), len(r[0])
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if t == T - 1:
                following_value, following_done = nv[b], nd[b]
            else:
                following_value, following_done = v[t + 1][b], d[t + 1][b]
            alive = 1.0 - following_done
            delta = r[t][b] + gamma * following_value * alive - v[t][b]
            running = delta + gamma * gae_lambda * alive * running
            adv[t][b] = running
    return torch.tensor(adv, dtype=torch.float64)


def ppo_loss_reference(
    newlogprob,
    oldlogprob,
    entropy,
    newvalue,
    oldvalue,
    advantages,
    returns,
    clip_coef,
    ent_coef,
    vf_coef,
    norm_adv,
    clip_vloss,
):
    """Clipped PPO loss (CleanRL's form) sample by sample in float64; all inputs are 1-D.

    Returns a dict: loss, policy, value, entropy, approx_kl, clipfrac (python floats).
    """
    n = len(newlogprob)
    lp, olp, ent = newlogprob.double().tolist(), oldlogprob.double().tolist(), entropy.double().tolist()
    nv, ov = newvalue.double().tolist(), oldvalue.double().tolist()
    adv, ret = advantages.double().tolist(), returns.double().tolist()
    if norm_adv:
        mean = sum(adv) / n
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))  # unbiased, like torch.std
        adv = [(a - mean) / (std + 1e-8) for a in adv]
    policy = value = entropy_sum = kl = clipped = 0.0
    for i in range(n):
        logratio = lp[i] - olp[i]
        ratio = math.exp(logratio)
        kl += (ratio - 1.0) - logratio
        clipped += float(abs(ratio - 1.0) > clip_coef)
        policy += max(-adv[i] * ratio, -adv[i] * min(max(ratio, 1.0 - clip_coef), 1.0 + clip_coef))
        if clip_vloss:
            v_clipped = ov[i] + min(max(nv[i] - ov[i], -clip_coef), clip_coef)
            value += 0.5 * max((nv[i] - ret[i]) ** 2, (v_clipped - ret[i]) ** 2)
        else:
            value += 0.5 * (nv[i] - ret[i]) ** 2
        entropy_sum += ent[i]
    policy, value, entropy_mean = policy / n, value / n, entropy_sum / n
    return {
        "loss": policy - ent_coef * entropy_mean + vf_coef * value,
        "policy": policy,
        "value": value,
        "entropy": entropy_mean,
        "approx_kl": kl / n,
        "clipfrac": clipped / n,
    }


def random_rollout(T, B, seed, done_prob=0.1, dtype=torch.float32):
    """Random (rewards, values, dones, next_value, next_done) with episode ends, never all zeros."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, B, generator=g, dtype=dtype)
    values = torch.randn(T, B, generator=g, dtype=dtype)
    dones = (torch.rand(T, B, generator=g) < done_prob).to(dtype)
    next_value = torch.randn(B, generator=g, dtype=dtype)
    next_done = (torch.rand(B, generator=g) < done_prob).to(dtype)
    return rewards, values, dones, next_value, next_done


def random_ppo_minibatch(n, seed):
    """Random PPO-loss inputs: log-ratios in [-0.6, 0.6], so with clip ranges 0.1 or 0.2 many ratios (and
    value changes) are clipped and some are not; entropies positive. Returns (newlogprob, oldlogprob,
    entropy, newvalue, oldvalue, advantages, returns), 1-D float32 of length n."""
    g = torch.Generator().manual_seed(seed)
    oldlogprob = torch.randn(n, generator=g) - 2.0
    newlogprob = oldlogprob + (torch.rand(n, generator=g) - 0.5) * 1.2
    entropy = torch.rand(n, generator=g) + 0.5
    oldvalue = torch.randn(n, generator=g)
    newvalue = oldvalue + torch.randn(n, generator=g) * 0.4
    advantages = torch.randn(n, generator=g) * 2.0 + 0.3
    returns = oldvalue + torch.randn(n, generator=g)
    return newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns


def q_lambda_returns_reference(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """PQN's Q(lambda) returns as the paper defines them, one scalar at a time, in float64: the lambda-weighted mix of
    the n-step returns (Peng's Q(lambda), Gallici et al. 2024, eq. 7), not the backward recursion the scripts use.

    Rollout convention as gae_reference: values[t] is max_a Q(obs[t], a), dones[t] == 1 means obs[t] begins an
    episode; the obs after the rollout has next_value, next_done. The n-step return from t is
    G_n = sum_{k<n} gamma^k r[t+k] + gamma^n max_a Q(obs[t+n]); it stops (no bootstrap, no later reward) at the first
    step that ends an episode. With H = T - t steps left in the rollout,
    R[t] = (1 - lambda) sum_{n=1}^{H-1} lambda^(n-1) G_n + lambda^(H-1) G_H. Returns (T, B) float64.
    """
    r, v, d = (x.double().tolist() for x in (rewards, values, dones))
    nv, nd = next_value.double().tolist(), next_done.double().tolist()
    T, B = len(r), len(r[0])
    out = [[0.0] * B for _ in range(T)]
    for b in range(B):
        # what follows step s: the max-Q value of the next obs and whether step s ended its episode
        following_value = [v[s + 1][b] for s in range(T - 1)] + [nv[b]]
        ends = [d[s + 1][b] for s in range(T - 1)] + [nd[b]]
        for t in range(T):
            horizon, n_step = T - t, []
            discounted, ended = 0.0, False
            for n in range(1, horizon + 1):
                s = t + n - 1  # the last step of this n-step return
                if not ended:
                    discounted += gamma ** (n - 1) * r[s][b]
                    ended = ends[s] == 1.0
                n_step.append(discounted if ended else discounted + gamma**n * following_value[s])
            weights = [(1 - q_lambda) * q_lambda ** (n - 1) for n in range(1, horizon)] + [q_lambda ** (horizon - 1)]
            out[t][b] = sum(w * g for w, g in zip(weights, n_step))
    return torch.tensor(out, dtype=torch.float64)
