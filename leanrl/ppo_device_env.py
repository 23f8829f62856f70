"""PPO on CartPole-v1 with the env on the device: the fast twin (ppo_torchcompile.py) with the env as tensors.

This is ppo_torchcompile.py with gymnasium's CartPole-v1 as batched tensor math in the file (its equations, thresholds,
500-step truncation, +-0.05 reset and same-step autoreset): the envs step in a few ops on the device, and the whole
iteration (rollout, GAE, the epochs of updates) is one function, compiled in pieces with --compile and captured as one
CUDA graph with --cudagraphs. --num-seeds N trains N independent agents (seeds --seed .. --seed + N - 1) at once, in
the same graph: each has its own network, Adam state, envs and random draws, and seed k of a batch learns as seed k
alone (PureJaxRL's way). Each `# trick:` the twin lacks is a step from host envs to the device.

Run: python leanrl/ppo_device_env.py --compile --cudagraphs   (on a CPU: python leanrl/ppo_device_env.py --compile)
     python leanrl/ppo_device_env.py --compile --num-seeds 64   (64 agents: every seed's curve, their aggregate)
"""

import copy  # (trick: the agent's skeleton for functional_call, see agent_outputs)
import math  # (trick: CartPole's constants, written in the file)
import random
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: modules and storage bound with partial)
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch._dynamo.config  # trace_autograd_ops (a trick, see main)
import torch.nn as nn  # (trick: no torch.optim below: Adam as tensor ops, see make_adam)
import tyro
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)
from torch.distributions.categorical import Categorical
from torch.func import functional_call, stack_module_state  # (trick: N seeds' agents as one, see agent_outputs)

from leanrl import bookkeeping as bk


@dataclass
class Args(bk.StopAndResume):  # --resume, --checkpoint-every-min (no replay memory here)
    exp_name: str = Path(__file__).stem
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (with --num-seeds N: the first of seeds --seed .. --seed + N - 1)"""
    # trick: N agents in one process and one graph: CartPole's small networks leave a CPU's or GPU's cores idle; N
    # seeds' networks, optimizers and envs stacked along a first dim fill them, N learning curves for about one's time
    num_seeds: int = 1
    """the number of independent agents trained at once, seeds --seed .. --seed + N - 1 (each trained as if alone)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False  # trick: only with --eval-checkpoint: the tensor env has nothing to draw
    """with --eval-checkpoint: film the evaluation's episodes (gymnasium's CartPole, in the run folder's `videos`)"""
    save_model: bool = False
    """whether to save the model at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # trick: 3: the whole iteration is one call, compiled in iteration 1 and captured in iteration 2
    measure_burnin: int = 3
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    eval_seed: int | None = None  # (trick: a checkpoint of --num-seeds N holds N agents)
    """with --eval-checkpoint of a --num-seeds run: the seed whose agent plays (default: the run's first seed)"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile"""
    cudagraphs: bool = False  # (trick: the whole iteration, one CUDA graph, see `iteration`)
    """whether to capture the whole iteration as one CUDA graph (tensordict's CudaGraphModule); needs CUDA"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"  # (trick: the env is CartPole-v1's equations as tensors, no other)
    """the id of the environment: CartPole-v1 only (its dynamics are this file's tensor math)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments, rounded down to whole iterations (num_envs x num_steps each)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None  # (trick: None only: the iteration is one graph, its epochs cannot stop early)
    """the target KL divergence threshold (not available here: the whole iteration is one graph)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def make_envs(env_id, num_envs, video_dir=None):
    # (trick: gymnasium's envs only for --eval-checkpoint: training steps the tensor env below)
    # gymnasium 1.x resets a finished env on the *next* step by default; CleanRL's bookkeeping expects the
    # reset in the same step (the returned obs begins the new episode, the episode's stats are in final_info)
    def make_env(video_dir=None):  # with a video_dir (--capture-video) the env renders and films its episodes there
        env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
        return gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RecordVideo(env, video_dir) if video_dir else env)

    envs = [lambda: make_env(video_dir)] + [make_env] * (num_envs - 1)  # env 0 alone is filmed
    return gym.vector.SyncVectorEnv(envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions):  # (trick: the tensor env's sizes, no gymnasium envs to read them from)
        super().__init__()  # (trick: obs_dim and n_actions given, above)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),  # (trick: the tensor env's sizes, above)
        )

    def forward(self, x):  # (trick: the logits and the value in one call, the one functional_call makes)
        return self.actor(x), self.critic(x).squeeze(-1)


def agent_outputs(network, params, obs):
    """Each seed's (logits, value) of its own obs: params, Agent's parameters stacked along a first seed dim (N, ...);
    obs (N, B, obs_dim); returns (N, B, n_actions) and (N, B). `network` is the skeleton whose forward runs with each
    seed's params."""
    # trick: N seeds' agents as one: vmap of functional_call over the stacked parameters, batched matmuls, one call
    return torch.func.vmap(partial(functional_call, network))(params, (obs,))


def splitmix64(z):
    """splitmix64's mixing function on int64 tensors (bit for bit its uint64 one: products wrap modulo 2^64, and a
    right shift keeps the bits a logical shift keeps, the sign bits masked off)."""
    z = (z ^ ((z >> 30) & 0x3FFFFFFFF)) * -4658895280553007687  # 0xBF58476D1CE4E5B9
    z = (z ^ ((z >> 27) & 0x1FFFFFFFFF)) * -7723592293110705685  # 0x94D049BB133111EB
    return z ^ ((z >> 31) & 0x1FFFFFFFF)


def counter_bits(seeds, counter, stream, n):
    """n draws of 64 random bits for each seed, (N, n) int64: a hash of (seed, counter, stream, draw index)."""
    # trick: a counter-based RNG (JAX's approach) as tensor math: each seed's draws depend on its seed and the counter
    # alone, whatever the batch (seed k of --num-seeds N draws what it draws alone); it compiles into the graph, and a
    # captured CUDA graph draws fresh numbers at each replay, as the counter is a tensor the graph increments
    golden = -7046029254386353131  # 0x9E3779B97F4A7C15, splitmix64's step
    key = splitmix64(splitmix64(seeds * golden + stream) + counter * golden)
    # the draw index xor-ed in, not multiplied: inductor folds an arange's products into index math of unbounded ints
    return splitmix64(key[:, None] ^ torch.arange(n, device=seeds.device))


def counter_uniform(seeds, counter, stream, n):
    """n draws uniform in [0, 1) for each seed, (N, n) float32: the top 24 bits of counter_bits."""
    return ((counter_bits(seeds, counter, stream, n) >> 40) & 0xFFFFFF).to(torch.float32) * 2**-24


def cartpole_reset(uniform):
    """CartPole-v1's starting states from uniform [0, 1) draws (..., 4): every coordinate uniform in [-0.05, 0.05), as
    gymnasium draws them."""
    # trick: the env on the device: its states are a (seeds, envs, 4) tensor, a reset is one draw for all of them
    return uniform * 0.1 - 0.05


def cartpole_step(state, elapsed, action, reset_state, gravity=9.8, masscart=1.0, masspole=0.1, length=0.5,
                  force_mag=10.0, tau=0.02, x_threshold=2.4, theta_threshold=12 * 2 * math.pi / 360,
                  max_steps=500):  # fmt: skip
    """gymnasium's CartPole-v1 (explicit Euler, its constants as defaults, TimeLimit at max_steps) for a batch, with
    the same-step autoreset. state (..., 4): x, x_dot, theta, theta_dot; elapsed (...): steps so far; action (...): 0
    left, 1 right; reset_state (..., 4): where an ended env starts again. Returns (next state, elapsed, reward (1 every
    step), terminated, truncated, the state reached before any reset: gymnasium's final_obs)."""
    # trick: the env's step as whole-tensor math: thousands of envs in a few fused ops, no step leaves the device
    x, x_dot, theta, theta_dot = state.unbind(-1)
    force = torch.where(action == 1, force_mag, -force_mag).to(state.dtype)
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    total_mass, polemass_length = masspole + masscart, masspole * length
    temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
    thetaacc = (gravity * sintheta - costheta * temp) / (length * (4.0 / 3.0 - masspole * costheta**2 / total_mass))
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    x, x_dot = x + tau * x_dot, x_dot + tau * xacc
    theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * thetaacc
    final_state = torch.stack([x, x_dot, theta, theta_dot], dim=-1)
    terminated = (x < -x_threshold) | (x > x_threshold) | (theta < -theta_threshold) | (theta > theta_threshold)
    elapsed = elapsed + 1
    truncated = elapsed >= max_steps
    # trick: the autoreset as a torch.where, not a branch: an ended env's next state is its reset state
    done = terminated | truncated
    next_state = torch.where(done[..., None], reset_state, final_state)
    return next_state, torch.where(done, 0, elapsed), torch.ones_like(x), terminated, truncated, final_state


def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation, (T, B) time-major; dones[t] == 1 means obs[t] begins an episode."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    delta = rewards + gamma * nextvalues * nextnonterminal - values
    # trick: GAE is the reverse linear recurrence A[t] = delta[t] + c[t] * A[t + 1]. Recursive doubling solves it in
    # log2(T) whole-tensor steps, not T sequential ones: A[t] += c[t] * A[t + s], c[t] *= c[t + s] for s = 1, 2, 4, ...,
    # zero past the end
    advantages, coef = delta, gamma * gae_lambda * nextnonterminal
    shift = 1
    while shift < len(rewards):
        pad = torch.zeros_like(advantages[:shift])
        advantages = advantages + coef * torch.cat([advantages[shift:], pad])
        coef = coef * torch.cat([coef[shift:], pad])
        shift *= 2
    return advantages


def ppo_loss(
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
):  # fmt: skip
    """CleanRL's clipped PPO loss on one minibatch of each seed, (..., M): every mean and the advantages' normalisation
    over a seed's own minibatch (the last dim); returns (each seed's loss, dict of detached statistics)."""
    # trick: every reduction over the last dim, one seed's: nothing crosses seeds
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean(-1)  # (trick: each seed's, see above)
        approx_kl = ((ratio - 1) - logratio).mean(-1)
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean(-1)
    if norm_adv:
        # (trick: each seed's own normalisation)
        advantages = (advantages - advantages.mean(-1, keepdim=True)) / (advantages.std(-1, keepdim=True) + 1e-8)

    # Policy loss
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean(-1)  # (trick: each seed's)

    # Value loss (trick: newvalue comes (N, M) from agent_outputs: no view)
    if clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean(-1)  # (trick: each seed's)
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean(-1)  # (trick: each seed's)

    entropy_loss = entropy.mean(-1)  # (trick: each seed's)
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    stats = dict(
        policy=pg_loss.detach(),
        value=v_loss.detach(),
        entropy=entropy_loss.detach(),
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, stats


def sample_actions(logits, uniform):
    """A categorical draw per row of logits (..., n_actions) from one uniform [0, 1) draw per row: the first action
    whose cumulative probability exceeds it (inverse CDF); returns (actions, their log-probabilities)."""
    # trick: the action drawn from the counter-based RNG's uniform, not from Categorical.sample (see counter_bits)
    log_probs = logits.log_softmax(-1)
    below = (log_probs.exp().cumsum(-1) <= uniform[..., None]).sum(-1)
    action = below.clamp(max=logits.shape[-1] - 1)
    return action, log_probs.gather(-1, action[..., None]).squeeze(-1)


def policy_step(agent_fn, obs, actions, logprobs, values, rng, step):
    """The rollout's policy step at `step` (a 1-element index tensor): samples an action for obs[:, step] (each seed's
    envs) and writes it, its log-prob and the value into their (N, T, B) storage in place; returns the action."""
    # trick: the step is a device tensor and the storage is written inside the step: one compiled graph (and one CUDA
    # graph) serves every step, its only input the 8-byte index
    with torch.no_grad():
        logits, value = agent_fn(obs[:, step].squeeze(1))  # (trick: N seeds' agents, see agent_outputs)
        action, logprob = sample_actions(logits, counter_uniform(rng["seeds"], rng["counter"], 0, actions.shape[2]))
        actions[:, step], logprobs[:, step], values[:, step] = action[:, None], logprob[:, None], value[:, None]
    return action


def rollout_step(agent_fn, obs, actions, logprobs, values, rewards, dones, env, ended_returns, ended_lengths, rng,
                 step):  # fmt: skip
    """One step of the rollout at `step` (a 1-element index tensor) for every seed's envs: the env's state and done
    flag into the storage, the policy step, the env step (with its autoreset), its reward, and each env's episode
    statistics: the running return and length, written into ended_returns and ended_lengths at the step an episode
    ends (0 elsewhere). The RNG's counter moves on by one."""
    # trick: env and policy are one function of the device storage: one compiled graph for every step of the
    # rollout, and the episode statistics are sums kept on the device, read once an iteration at the log point
    obs[:, step], dones[:, step] = env["state"][:, None], env["done"][:, None]
    action = policy_step(agent_fn, obs, actions, logprobs, values, rng, step)
    num_seeds, num_envs = env["done"].shape
    draws = counter_uniform(rng["seeds"], rng["counter"], 1, num_envs * 4).view(num_seeds, num_envs, 4)
    state, elapsed, reward, terminated, truncated, _ = cartpole_step(env["state"], env["elapsed"], action,
                                                                     cartpole_reset(draws))  # fmt: skip
    done = terminated | truncated
    rewards[:, step] = reward[:, None]
    env["return"].add_(reward)
    env["length"].add_(1)
    ended_returns[:, step] = torch.where(done, env["return"], 0.0)[:, None]
    ended_lengths[:, step] = torch.where(done, env["length"], 0)[:, None]
    env["return"].copy_(torch.where(done, 0.0, env["return"]))
    env["length"].copy_(torch.where(done, 0, env["length"]))
    env["state"].copy_(state)
    env["elapsed"].copy_(elapsed)
    env["done"].copy_(done.float())
    rng["counter"].add_(1)  # (trick: the counter-based RNG's counter, moved on inside the graph)


def advantages_and_returns(
    agent_fn, rewards, dones, values, advantages, returns, gamma, gae_lambda, next_obs, next_done
):  # fmt: skip  (trick: the env's state is the next obs)
    """The bootstrap value of next_obs and GAE over the (N, T, B) rollout storage (each seed's along its time dim),
    written into advantages and returns."""
    # trick: the bootstrap value and GAE are one function of the storage, compiled and captured like the updates
    with torch.no_grad():
        next_value = agent_fn(next_obs)[1]
        time_major = lambda x: x.transpose(0, 1)  # noqa: E731  (trick: storage seed-major, each seed's batch a view)
        advantages.copy_(time_major(gae(time_major(rewards), time_major(values), time_major(dones), next_value,
                                        next_done, gamma, gae_lambda)))  # fmt: skip
        returns.copy_(advantages + values)


def make_adam(params, lr, eps):
    """Adam's state for a list of parameters, with torch.optim.Adam's betas (0.9, 0.999)."""
    # trick: Adam as tensor ops on the device (its step count a device tensor), so that a step is part of the compiled
    # graph: torch.optim's step breaks the graph on purpose. Inductor fuses it with the rest of the update. Adam is
    # elementwise with one step count and lr: on the stacked parameters it is each seed's own Adam
    return dict(
        params=params, lr=lr, eps=eps, step=torch.zeros((), device=params[0].device),
        exp_avg=[torch.zeros_like(p) for p in params], exp_avg_sq=[torch.zeros_like(p) for p in params],
    )  # fmt: skip


@torch.no_grad()
def adam_step(adam, grads, beta1=0.9, beta2=0.999):
    """One step of torch.optim.Adam (no weight decay, no amsgrad) on adam["params"], in place."""
    adam["step"] += 1
    torch._foreach_lerp_(adam["exp_avg"], grads, 1 - beta1)
    torch._foreach_mul_(adam["exp_avg_sq"], beta2)
    torch._foreach_addcmul_(adam["exp_avg_sq"], grads, grads, 1 - beta2)
    bias_correction1, bias_correction2 = 1 - beta1 ** adam["step"], 1 - beta2 ** adam["step"]
    denom = torch._foreach_add(
        torch._foreach_div(torch._foreach_sqrt(adam["exp_avg_sq"]), bias_correction2.sqrt()), adam["eps"]
    )
    torch._foreach_addcdiv_(adam["params"], torch._foreach_mul(adam["exp_avg"], -adam["lr"] / bias_correction1), denom)


def clip_grad_norm_per_seed(grads, max_norm):
    """clip_grad_norm_ for each seed alone, in place: the gradients of parameters stacked along a first seed dim,
    scaled by each seed's own clip coefficient (from the norm of all of that seed's gradients)."""
    # trick: the clipping of N seeds at once, each by its own norm: a norm across seeds would tie them together
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))


# trick: the update returns these statistics as one stacked tensor: a CUDA graph clones each output at each replay
LOGGED = ("loss", "policy", "value", "entropy", "old_approx_kl", "approx_kl", "clipfrac")


def update(
    agent_fn, optimizer, obs, actions, logprobs, advantages, returns, values, mb_inds,  # (trick: N seeds: agent_fn)
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss, max_grad_norm,
):  # fmt: skip
    """One gradient step on the minibatch mb_inds of the flat batch (T * B rows); returns its LOGGED statistics."""
    # (trick: of each seed at once: mb_inds (N, M) into its flat batch (N, T * B, ...), the statistics (LOGGED, N))
    # trick: the minibatch is gathered here, inside the compiled (and captured) update: the flat batch is bound once and
    # its indices are the only input; each seed gathers from its own batch
    obs = torch.take_along_dim(obs, mb_inds[..., None], dim=1)
    actions, logprobs, advantages, returns, values = [
        x.gather(1, mb_inds) for x in (actions, logprobs, advantages, returns, values)
    ]
    logits, newvalue = agent_fn(obs)  # (trick: N seeds' agents, see agent_outputs)
    probs = Categorical(logits=logits, validate_args=False)
    loss, stats = ppo_loss(
        probs.log_prob(actions), logprobs, probs.entropy(), newvalue, values, advantages, returns,  # (trick: above)
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    # trick: the gradients from torch.autograd.grad, not backward() into .grad: traced into the compiled graph (see
    # main). The seeds' losses summed: seed k's parameters appear in its loss alone, so each gets its own gradient
    grads = torch.autograd.grad(loss.sum(), optimizer["params"])
    with torch.no_grad():
        clip_grad_norm_per_seed(grads, max_grad_norm)  # (trick: each seed by its own norm)
    adam_step(optimizer, grads)
    return torch.stack([loss.detach(), *stats.values()])  # (trick: one output a replay; no distribution checks)


def iteration(rollout, advantages_fn, update_fn, step_index, rng, batch_size, minibatch_size, update_epochs):
    """One iteration of PPO, all of it on the device: the rollout (rollout(step) for each step of step_index), GAE,
    then update_epochs epochs of minibatch updates; returns the last update's LOGGED statistics with clipfrac the mean
    of every minibatch's, (len(LOGGED), N)."""
    # trick: the whole iteration is one function of bound tensors with no host read in it: CudaGraphModule captures
    # it as one CUDA graph, one launch an iteration. Its pieces are compiled one by one, not the unrolled whole: the
    # step and the update are each compiled once and called num_steps and epochs x minibatches times
    for step in step_index.split(1):
        rollout(step)
    advantages_fn()
    clipfracs = []
    for _epoch in range(update_epochs):
        # trick: the shuffle as the argsort of a draw, on the device, inside the captured iteration: each seed's own
        order = counter_bits(rng["seeds"], rng["counter"], 2, batch_size).argsort(dim=1)
        rng["counter"].add_(1)
        for mb_inds in order.split(minibatch_size, dim=1):
            stats = update_fn(mb_inds)
            clipfracs.append(stats[LOGGED.index("clipfrac")])
    return torch.cat([stats[:-1], torch.stack(clipfracs).mean(0)[None]])


def check_args(args):
    """Reject bad input before any training."""
    # (trick: --num-seeds checked too)
    positive = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps", "num_seeds")
    bk.check_flags(__file__, args, positive)
    if args.eval_checkpoint is not None:
        return
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        bk.fail(__file__, f"--num-minibatches {args.num_minibatches} must divide the batch (--num-envs * --num-steps = "
             f"{batch_size})")  # fmt: skip
    if args.total_timesteps < batch_size:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs * "
             f"--num-steps = {batch_size})")  # fmt: skip
    # trick: one env, CartPole-v1, as this file's tensor math; --capture-video films an evaluation only
    if args.env_id != "CartPole-v1":
        bk.fail(__file__, f"--env-id {args.env_id}: this script's env is CartPole-v1 as tensors, no other (try "
                "ppo_torchcompile.py for other gymnasium envs)")  # fmt: skip
    if args.capture_video:
        bk.fail(__file__, "--capture-video films an evaluation (with --eval-checkpoint): the tensor env draws nothing")
    if args.target_kl is not None:  # (trick: the whole iteration is one graph: no early stop between its epochs)
        bk.fail(__file__, f"--target-kl {args.target_kl}: the whole iteration is one graph here, its epochs cannot "
                "stop early (try ppo_torchcompile.py)")  # fmt: skip


def evaluate(args, device):
    """Play args.eval_episodes episodes with the greedy (most probable) action of a saved agent."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    args.env_id = checkpoint["args"]["env_id"]
    # (trick: a --num-seeds run's checkpoint: "model" its first seed's agent, "models" every seed's, stacked)
    seeds = checkpoint.get("seeds", [checkpoint["args"]["seed"]])
    seed = seeds[0] if args.eval_seed is None else args.eval_seed
    if seed not in seeds:
        bk.fail(__file__, f"--eval-seed {seed}: the checkpoint holds the agents of seeds {seeds[0]}..{seeds[-1]}")
    model = checkpoint["model"] if seed == seeds[0] else {k: v[seeds.index(seed)] for k, v in
                                                          checkpoint["models"].items()}  # fmt: skip
    with bk.Run(__file__, args, device, mode="eval", eval_seed=seed) as run:
        envs = make_envs(args.env_id, 1, run.videos)
        agent = Agent(envs.single_observation_space.shape[0], int(envs.single_action_space.n)).to(device)  # (trick)
        agent.load_state_dict(model)

        def act(obs):
            with torch.no_grad():
                return agent.actor(torch.Tensor(obs).to(device)).argmax(dim=1).cpu().numpy()

        run.play(envs, act, lambda *step: [r for r, _ in bk.gym_episodes(step[-1])], args.eval_episodes, seed=args.seed)


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    seeds = list(range(args.seed, args.seed + args.num_seeds))  # (trick: N agents, see --num-seeds)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # trick: TF32 matmuls on GPUs that have them
    torch.set_float32_matmul_precision("high")

    # (trick: each seed's curve and the seeds' aggregate; solved: CartPole-v1's reward threshold, 475)
    with bk.Run(__file__, args, device, seeds=seeds, solved_at=gym.spec(args.env_id).reward_threshold) as run:
        # env setup
        obs_dim, n_actions, N = 4, 2, args.num_seeds  # (trick: CartPole's state and its two pushes, the tensor env's)
        # trick: each seed's agent and first env states from torch.manual_seed(seed), as in a run of that seed alone;
        # the agents stacked into one set of parameters with a first seed dim (and a skeleton to call them)
        agents, first_states = [], []
        for seed in seeds:
            torch.manual_seed(seed)
            agents.append(Agent(obs_dim, n_actions).to(device))
            first_states.append(cartpole_reset(torch.rand((args.num_envs, obs_dim), device=device)))
        params = stack_module_state(agents)[0]
        agent_fn = partial(agent_outputs, copy.deepcopy(agents[0]).to("meta"), params)
        # trick: the lr is a device tensor annealed in place: no compiled or CUDA graph is rebuilt for it. Adam as
        # tensor ops (make_adam) keeps its step count on the device too: a step never syncs and can be captured
        optimizer = make_adam(list(params.values()), lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)

        # ALGO Logic: Storage setup
        # trick: seed-major storage (N, T, B): each seed's flat batch (T * B) is a view, bound once; the env's state is
        # the next obs, no row of its own
        obs = torch.zeros((N, args.num_steps, args.num_envs, obs_dim), device=device)
        actions = torch.zeros((N, args.num_steps, args.num_envs), dtype=torch.long, device=device)
        logprobs, rewards, dones, values, advantages, returns = (
            torch.zeros((N, args.num_steps, args.num_envs), device=device) for _ in range(6)
        )
        step_index = torch.arange(args.num_steps, device=device)
        # trick: the env and the episode statistics are device tensors, and so is what ended in each step
        ended_returns = torch.zeros((N, args.num_steps, args.num_envs), device=device)
        ended_lengths = torch.zeros((N, args.num_steps, args.num_envs), dtype=torch.long, device=device)
        env = dict(
            state=torch.stack(first_states),
            elapsed=torch.zeros((N, args.num_envs), dtype=torch.long, device=device),
            done=torch.zeros((N, args.num_envs), device=device),
            length=torch.zeros((N, args.num_envs), dtype=torch.long, device=device),
            **{"return": torch.zeros((N, args.num_envs), device=device)},
        )
        # (trick: the counter-based RNG's state: the seeds and the counter, device tensors; the counter of shape (1,),
        # not 0-d: torch.compile passes a 0-d CPU tensor into its kernels as a scalar, read to the host)
        rng = dict(seeds=torch.tensor(seeds, device=device), counter=torch.zeros(1, dtype=torch.long, device=device))

        # trick: torch.compile fuses the small kernels of the rollout step, GAE and the update; CudaGraphModule
        # replays the whole iteration as one CUDA graph. Storage, env, flat batch and constants are bound once with
        # partial: the graph copies none of them and takes no input
        rollout, advantages_fn, update_fn = rollout_step, advantages_and_returns, update
        if args.compile:
            # trick: with trace_autograd_ops, torch.compile traces torch.autograd.grad into the graph: the update (its
            # gradients, clipping and Adam step included) is one graph, one call with no frames resumed in Python
            torch._dynamo.config.trace_autograd_ops = True
            advantages_fn, update_fn = torch.compile(advantages_fn), torch.compile(update_fn, fullgraph=True)
            # trick: the rollout step (env and policy) compiled whole: its draws are the counter-based RNG's tensor
            # math, the same numbers compiled or not
            rollout = torch.compile(rollout, fullgraph=True)
        rollout = partial(rollout, agent_fn, obs, actions, logprobs, values, rewards, dones, env, ended_returns,
                          ended_lengths, rng)  # fmt: skip
        advantages_fn = partial(advantages_fn, agent_fn, rewards, dones, values, advantages, returns, args.gamma,
                                args.gae_lambda, env["state"], env["done"])  # fmt: skip
        update_fn = partial(
            update_fn, agent_fn, optimizer, obs.flatten(1, 2), actions.flatten(1, 2),  # (trick: each seed's batch)
            logprobs.flatten(1, 2), advantages.flatten(1, 2), returns.flatten(1, 2), values.flatten(1, 2),
            clip_coef=args.clip_coef, ent_coef=args.ent_coef, vf_coef=args.vf_coef, norm_adv=args.norm_adv,
            clip_vloss=args.clip_vloss, max_grad_norm=args.max_grad_norm,
        )  # fmt: skip
        # (trick: the iteration's pieces bound into one function of no input)
        iteration_fn = partial(iteration, rollout, advantages_fn, update_fn, step_index, rng, args.batch_size,
                               args.minibatch_size, args.update_epochs)  # fmt: skip
        if args.cudagraphs:
            iteration_fn = CudaGraphModule(iteration_fn, warmup=2)  # (trick: the whole iteration, one CUDA graph)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            # (trick: "model" the first seed's agent, in the PPO pair's format; "models" every seed's, stacked)
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model={k: v[0] for k, v in params.items()},
                                                  models=params, seeds=seeds)  # fmt: skip
        # TRY NOT TO MODIFY: start the game
        global_step = 0  # (trick: the env was reset on the device, where it was made)
        # a stopped run goes on: the state Run writes at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(agent=params, optimizer=optimizer, global_step=global_step,
                                 envs=env,  # (trick: the env as tensors)
                                 rng=rng)  # (trick: the counter-based RNG's counter)  # fmt: skip
        global_step = run.resume("global_step")  # (trick: the env's tensors restored in place, all of it)

        for iteration_number in run.progress(range(1, args.num_iterations + 1)):  # (trick: `iteration` is the function)
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration_number - 1.0) / args.num_iterations  # (trick: `iteration` is the function)
                lrnow = frac * args.learning_rate
                optimizer["lr"].fill_(lrnow)  # (trick: in place, the graphs read this tensor)
            # (trick: the env steps of the iteration's steps, known before it runs: its episodes are read after it)
            steps_at = [global_step + (step + 1) * args.num_envs for step in range(args.num_steps)]

            # trick: the rollout, GAE and the updates in one call, no host read in it
            stats = iteration_fn()

            # trick: the episodes that ended in the iteration, read to the host once, at the log point
            ended = torch.stack([ended_returns, ended_lengths.float()]).cpu().numpy()
            for step, k, env_id in zip(*np.nonzero(ended[1].transpose(1, 0, 2))):  # by step, then seed (trick: seeds)
                run.episode(steps_at[step], float(ended[0, k, step, env_id]), int(ended[1, k, step, env_id]),
                            seed=seeds[k])  # fmt: skip
            global_step = steps_at[-1]

            y_pred, y_true = values.flatten(1), returns.flatten(1)  # (trick: each seed's, then their mean)
            var_y = y_true.var(dim=1, correction=0)
            explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var(dim=1, correction=0) / var_y)
            explained_var = explained_var.mean()

            # log point, as CleanRL's: the last minibatch's losses, the mean clipfrac of all minibatches
            # (trick: with --num-seeds, the mean over seeds: a seed's non-finite loss makes it non-finite too)
            stats = dict(zip(LOGGED, stats.mean(1)))  # (trick: one output a replay)
            logged = {"explained_variance": explained_var, "learning_rate": optimizer["lr"]}
            losses = run.check_finite(global_step, stats, unchecked=logged)
            run.tick(global_step)
            run.report(global_step, {
                "charts/learning_rate": losses["learning_rate"], "losses/value_loss": losses["value"],
                "losses/policy_loss": losses["policy"], "losses/entropy": losses["entropy"],
                "losses/old_approx_kl": losses["old_approx_kl"], "losses/approx_kl": losses["approx_kl"],
                "losses/clipfrac": losses["clipfrac"], "losses/explained_variance": losses["explained_variance"],
            })  # fmt: skip
        # (trick: no gymnasium envs to close: the env is tensors)


if __name__ == "__main__":
    main(tyro.cli(Args))
