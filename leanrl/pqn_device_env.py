"""PQN on CartPole-v1 with the env on the device: the fast twin (pqn_torchcompile.py) with the env as tensors.

This is pqn_torchcompile.py with gymnasium's CartPole-v1 as batched tensor math in the file (its equations, thresholds,
500-step truncation, +-0.05 reset and same-step autoreset): thousands of envs step in a few ops on the device, and the
whole iteration (rollout, Q(lambda), the epochs of updates) is one function, compiled in pieces with --compile and
captured as one CUDA graph with --cudagraphs. Each `# trick:` the twin lacks is a step from host envs to the device.
--num-seeds N trains N independent agents (seeds --seed .. --seed + N - 1) at once, in the same graph: each has its
own network, RAdam state, envs and random draws, and seed k of a batch learns as seed k alone (PureJaxRL's way).

Run: python leanrl/pqn_device_env.py --compile --cudagraphs   (on a CPU: python leanrl/pqn_device_env.py)
     python leanrl/pqn_device_env.py --num-seeds 64              (64 agents: every seed's curve, their aggregate)
"""

import copy  # (trick: the network's skeleton for functional_call, see main's agent setup)
import math  # (trick: CartPole's constants, written in the file)
import random
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: network, optimizer, storage bound with partial)
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F  # (trick: no torch.optim below: RAdam's state by hand, see make_radam)
import tyro
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)
from torch.func import functional_call, stack_module_state  # (trick: N seeds' networks as one, see q_values)
from torch.optim.radam import radam  # (trick: RAdam's step as a function, inside the compiled update)

from leanrl import bookkeeping as bk


@dataclass
class Args(bk.StopAndResume):  # --resume, --checkpoint-every-min (no replay memory here)
    exp_name: str = Path(__file__).stem
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (with --num-seeds N: the first of seeds --seed .. --seed + N - 1)"""
    # trick: N agents in one process and one graph: one small CartPole agent leaves a GPU idle, N seeds' networks,
    # optimizers and envs stacked along a first dim fill it with one launch for all (on a CPU the work grows with N)
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
    """whether to save the Q-network (and the training state, see --resume) at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # trick: 3: the whole iteration is one call, compiled in iteration 1 and captured in iteration 2
    measure_burnin: int = 3
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    eval_epsilon: float = 0.05
    """the exploration rate of an evaluation (the end of the training schedule)"""
    eval_seed: int | None = None  # (trick: a checkpoint of --num-seeds N holds N networks)
    """with --eval-checkpoint of a --num-seeds run: the seed whose network plays (default: the run's first seed)"""
    compile: bool = False  # (trick: --compile compiles the rollout step, env and policy, see main)
    """whether to use torch.compile on the rollout step (env and policy), the Q(lambda) returns and the update"""
    cudagraphs: bool = False  # (trick: the whole iteration, one CUDA graph, see `iteration`)
    """whether to capture the whole iteration as one CUDA graph (tensordict's CudaGraphModule); needs CUDA"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"  # (trick: the env is CartPole-v1's equations as tensors, no other)
    """the id of the environment: CartPole-v1 only (its dynamics are this file's tensor math)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments, rounded down to whole iterations (num_envs x num_steps each)"""
    # trick: own defaults, tuned here for the time to 475 on a 2-core CPU: 64 envs x 32 steps, 8 minibatches, 4 epochs
    # (purejaxql's pqn_cartpole.yaml), lr 1e-3, epsilon's end at 12% (purejaxql: 20%). On a GPU: --num-envs 4096
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 64  # (trick: the tuned defaults, above)
    """the number of parallel game environments (on the device: thousands fit)"""
    num_steps: int = 32
    """the number of steps to run for each environment per update"""
    num_minibatches: int = 8  # (trick: the tuned defaults, above)
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the Q-network"""
    anneal_lr: bool = True
    """Toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.12  # (trick: the tuned defaults, above)
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    q_lambda: float = 0.65
    """the lambda for Q(lambda)"""


def make_envs(env_id, num_envs, video_dir=None):
    # (trick: gymnasium's envs only for --eval-checkpoint: training steps the tensor env below)
    # gymnasium 1.x resets a finished env on the *next* step by default; CleanRL's rollout expects the reset in the
    # same step (the returned obs begins the new episode, the episode's statistics are in infos["final_info"])
    def make_env(video_dir=None):  # with a video_dir (--capture-video) the env renders and films its episodes there
        env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
        return gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RecordVideo(env, video_dir) if video_dir else env)

    envs = [lambda: make_env(video_dir)] + [make_env] * (num_envs - 1)  # env 0 alone is filmed
    return gym.vector.SyncVectorEnv(envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """CleanRL's MLP with a LayerNorm after each hidden layer: it keeps TD learning stable without a target network."""

    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 120)),
            nn.LayerNorm(120),
            nn.ReLU(),
            layer_init(nn.Linear(120, 84)),
            nn.LayerNorm(84),
            nn.ReLU(),
            layer_init(nn.Linear(84, n_actions)),
        )

    def forward(self, x):
        return self.network(x)


def q_values(network, params, obs):
    """Each seed's Q-values of its own obs: params, QNetwork's parameters stacked along a first seed dim (N, ...); obs
    (N, B, obs_dim); returns (N, B, n_actions). `network` is the skeleton whose forward runs with each seed's params."""
    # trick: N seeds' networks as one: vmap of functional_call over the stacked parameters, batched matmuls, one call
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


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step t: linear from start_e (t = 0) to end_e (t = duration), then end_e."""
    return start_e + (end_e - start_e) * min(t / duration, 1.0)


def epsilon_greedy(q_values, coins, picks, epsilon):
    """One coin per env: a random action (from picks, uniform in [0, 1)) where the coin (uniform in [0, 1)) falls
    under epsilon, else the greedy one. q_values (..., n_actions). Returns (actions, max_a Q(obs, a)), the second the
    rollout's values for the Q(lambda) returns."""
    # trick: the coins and the random actions are drawn by the caller (the counter-based RNG in training)
    random_actions = (picks * q_values.shape[-1]).long()
    max_values, max_actions = q_values.max(dim=-1)
    return torch.where(coins < epsilon, random_actions, max_actions), max_values


def q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """Q(lambda) returns over a (T, B) time-major rollout: R[t] = r[t] + gamma * (lambda * R[t + 1] + (1 - lambda) *
    max_a Q(s[t + 1], a)), the max-Q values in `values`; no bootstrap past an episode end (dones[t] == 1 means obs[t]
    begins an episode); the last step bootstraps from next_value (max_a Q of the obs after the rollout) alone."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    # trick: Q(lambda) is the reverse linear recurrence R[t] = a[t] + c[t] * R[t + 1] (a row R[T] = next_value
    # appended). Recursive doubling solves it in log2(T) whole-tensor steps, not T sequential ones: R[t] += c[t] *
    # R[t + s], c[t] *= c[t + s] for s = 1, 2, 4, ..., zero past the end
    returns = torch.cat([rewards + gamma * (1 - q_lambda) * nextnonterminal * nextvalues, next_value[None]])
    coef = torch.cat([gamma * q_lambda * nextnonterminal, torch.zeros_like(next_value)[None]])
    shift = 1
    while shift < len(returns):
        pad = torch.zeros_like(returns[:shift])
        returns = returns + coef * torch.cat([returns[shift:], pad])
        coef = coef * torch.cat([coef[shift:], pad])
        shift *= 2
    return returns[:-1]


def policy_step(q_fn, obs, actions, values, epsilon, rng, step):  # (trick: N seeds, the counter-based RNG)
    """The rollout's policy step at `step` (a 1-element index tensor): epsilon-greedy on obs[:, step] (each seed's
    envs), the action and the max-Q value written into their (N, T, B) storage in place; returns the actions."""
    # trick: the step is a device tensor and the storage is written inside the step: one compiled graph (and one CUDA
    # graph) serves every step, its only input the 8-byte index; epsilon, a device tensor, is written in place
    with torch.no_grad():
        num_envs = actions.shape[2]  # (trick: the storage seed-major, (N, T, B))
        coins, picks = (counter_uniform(rng["seeds"], rng["counter"], stream, num_envs) for stream in (0, 1))
        action, value = epsilon_greedy(q_fn(obs[:, step].squeeze(1)), coins, picks, epsilon)
        values[:, step], actions[:, step] = value[:, None], action[:, None]
    return action


def returns_of_rollout(q_fn, rewards, dones, values, returns, gamma, q_lambda, next_obs, next_done):  # (trick: N)
    """The bootstrap value of next_obs and the Q(lambda) returns of the (N, T, B) rollout storage, written into
    returns (each seed's along its time dim)."""
    # trick: the bootstrap value and the returns are one function of the storage, compiled and captured like the updates
    with torch.no_grad():
        next_value = q_fn(next_obs).max(dim=-1).values
        time_major = lambda x: x.transpose(0, 1)  # noqa: E731  (trick: storage seed-major, each seed's batch a view)
        returns.copy_(time_major(q_lambda_returns(time_major(rewards), time_major(values), time_major(dones),
                                                  next_value, next_done, gamma, q_lambda)))  # fmt: skip


def rollout_step(q_fn, obs, actions, values, rewards, dones, epsilons, env, ended_returns, ended_lengths, rng, step):
    """One step of the rollout at `step` (a 1-element index tensor) for every seed's envs: the env's state and done
    flag into the storage, the policy step, the env step (with its autoreset), its reward, and each env's episode
    statistics: the running return and length, written into ended_returns and ended_lengths at the step an episode
    ends (0 elsewhere). The RNG's counter moves on by one."""
    # trick: env and policy are one function of the device storage: one compiled graph for every step of the
    # rollout, and the episode statistics are sums kept on the device, read once an iteration at the log point
    obs[:, step], dones[:, step] = env["state"][:, None], env["done"][:, None]
    action = policy_step(q_fn, obs, actions, values, epsilons[step], rng, step)
    num_seeds, num_envs = env["done"].shape
    draws = counter_uniform(rng["seeds"], rng["counter"], 2, num_envs * 4).view(num_seeds, num_envs, 4)
    state, elapsed, reward, terminated, truncated, _ = cartpole_step(env["state"], env["elapsed"], action,
                                                                     cartpole_reset(draws))  # fmt: skip
    # as CleanRL: a truncated episode (CartPole's 500-step limit) ends the bootstrap as a terminated one
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


def iteration(rollout, returns_fn, update_fn, step_index, rng, batch_size, minibatch_size, update_epochs):
    """One iteration of PQN, all of it on the device: the rollout (rollout(step) for each step of step_index), the
    Q(lambda) returns, then update_epochs epochs of minibatch updates; returns the last update's (TD loss, mean Q),
    (2, N): one of each per seed."""
    # trick: the whole iteration is one function of bound tensors with no host read in it: CudaGraphModule captures
    # it as one CUDA graph, one launch an iteration. Its pieces are compiled one by one, not the unrolled whole: the
    # step and the update are each compiled once and called num_steps and epochs x minibatches times
    for step in step_index.split(1):
        rollout(step)
    returns_fn()
    for _epoch in range(update_epochs):
        # trick: the shuffle as the argsort of a draw, on the device, inside the captured iteration: each seed's own
        order = counter_bits(rng["seeds"], rng["counter"], 3, batch_size).argsort(dim=1)
        rng["counter"].add_(1)
        for mb_inds in order.split(minibatch_size, dim=1):
            stats = update_fn(mb_inds)
    return stats


def make_radam(params, lr, capturable):
    """The state of torch.optim.RAdam (its defaults) for a list of parameters, for torch.optim.radam.radam."""
    # trick: RAdam's state by hand, and its step by torch.optim's functional radam inside the compiled update:
    # Optimizer.step breaks the graph on purpose, the function it calls does not. Capturable: the step counts are
    # device tensors and rectifying is a torch.where, not a host branch (one graph, no sync). RAdam is elementwise
    # with one step count and lr: on the stacked parameters it is each seed's own RAdam
    zeros, steps = [torch.zeros_like(p) for p in params], [torch.zeros((), device=params[0].device) for _ in params]
    return dict(params=params, lr=lr, capturable=capturable, state=(zeros, [z.clone() for z in zeros], steps))


def clip_grad_norm_per_seed(params, max_norm):
    """nn.utils.clip_grad_norm_ for each seed alone: the gradients of parameters stacked along a first seed dim
    scaled by each seed's own clip coefficient (the norm of all of that seed's gradients)."""
    # trick: the clipping of N seeds at once, each by its own norm: a norm across seeds would tie them together
    norms = torch.stack([p.grad.flatten(1).norm(dim=1) for p in params]).norm(dim=0)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(coef.view(-1, *[1] * (p.dim() - 1)))


def update(q_fn, optimizer, obs, actions, returns, mb_inds, max_grad_norm):
    """One gradient step of each seed on its minibatch mb_inds (N, M) of its flat batch (obs (N, B, obs_dim)); returns
    the stacked (TD loss, mean Q of actions), (2, N)."""
    # trick: the minibatch is gathered inside the compiled (and captured) update: the batch is bound, indices its input
    obs = torch.take_along_dim(obs, mb_inds[..., None], dim=1)
    actions, returns = actions.gather(1, mb_inds), returns.gather(1, mb_inds)
    old_val = q_fn(obs).gather(2, actions[..., None]).squeeze(2)
    loss = F.mse_loss(returns, old_val, reduction="none").mean(dim=1)  # each seed's own

    # optimize the model
    # trick: the grads set to None by hand, as zero_grad does: torch.compile does not trace zero_grad (a graph break)
    for param in optimizer["params"]:  # (trick: the stacked parameters of N seeds)
        param.grad = None
    # trick: the seeds' losses summed: seed k's parameters appear in its loss alone, so each gets its own gradient
    loss.sum().backward()
    clip_grad_norm_per_seed(optimizer["params"], max_grad_norm)
    with torch.no_grad():
        params = optimizer["params"]
        radam(params, [p.grad for p in params], *optimizer["state"], lr=optimizer["lr"], beta1=0.9, beta2=0.999,
              eps=1e-8, weight_decay=0.0, capturable=optimizer["capturable"], foreach=True)  # fmt: skip
    # trick: one stacked output for the logged scalars: a CUDA graph replay clones one tensor out, not two
    return torch.stack([loss.detach(), old_val.mean(dim=1).detach()])


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps", "max_grad_norm",
                "num_seeds")  # (trick: --num-seeds)  # fmt: skip
    bk.check_flags(__file__, args, positive)
    if args.eval_checkpoint is not None:
        if not 0.0 <= args.eval_epsilon <= 1.0:
            bk.fail(__file__, f"--eval-epsilon must be in [0, 1], got {args.eval_epsilon}")
        return
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        bk.fail(__file__, f"--num-minibatches {args.num_minibatches} must divide the batch (--num-envs * --num-steps = "
             f"{batch_size})")  # fmt: skip
    if args.total_timesteps < batch_size:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs * "
             f"--num-steps = {batch_size})")  # fmt: skip
    if not 0.0 < args.exploration_fraction <= 1.0:
        bk.fail(__file__, f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    for flag in ("start_e", "end_e", "gamma", "q_lambda"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            bk.fail(__file__, f"--{flag.replace('_', '-')} must be in [0, 1], got {getattr(args, flag)}")
    # trick: one env, CartPole-v1, as this file's tensor math; --capture-video films an evaluation only
    if args.env_id != "CartPole-v1":
        bk.fail(__file__, f"--env-id {args.env_id}: this script's env is CartPole-v1 as tensors, no other (try "
                "pqn_torchcompile.py for other gymnasium envs)")  # fmt: skip
    if args.capture_video:
        bk.fail(__file__, "--capture-video films an evaluation (with --eval-checkpoint): the tensor env draws nothing")


def evaluate(args, device):
    # (trick: the network of --eval-seed, one of a --num-seeds run's)
    """Play args.eval_episodes episodes epsilon-greedily (args.eval_epsilon) with a saved Q-network (--eval-seed's)."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    weight = checkpoint["model"].get("network.1.weight")  # the first LayerNorm's: DQN's and the Atari nets have none
    if "q_lambda" not in checkpoint["args"] or weight is None or weight.dim() != 1:
        bk.fail(__file__, f"--eval-checkpoint {args.eval_checkpoint} is not a checkpoint of this script")
    args.env_id = checkpoint["args"]["env_id"]
    # (trick: a --num-seeds run's checkpoint: "model" its first seed's network, "models" every seed's, stacked)
    seeds = checkpoint.get("seeds", [checkpoint["args"]["seed"]])
    seed = seeds[0] if args.eval_seed is None else args.eval_seed
    if seed not in seeds:
        bk.fail(__file__, f"--eval-seed {seed}: the checkpoint holds the networks of seeds {seeds[0]}..{seeds[-1]}")
    model = checkpoint["model"] if seed == seeds[0] else {k: v[seeds.index(seed)] for k, v in
                                                          checkpoint["models"].items()}  # fmt: skip
    torch.manual_seed(args.seed)  # the exploration coins
    with bk.Run(__file__, args, device, burnin=0, mode="eval", eval_seed=seed) as run:  # (trick: which seed)
        envs = make_envs(args.env_id, 1, run.videos)
        q_network = QNetwork(envs.single_observation_space.shape[0], int(envs.single_action_space.n)).to(device)
        q_network.load_state_dict(model)  # (trick: the seed's network)

        def act(obs):
            with torch.no_grad():
                obs = torch.as_tensor(obs, dtype=torch.float32, device=device)
                coins, picks = torch.rand(2, len(obs), device=device)  # (trick: epsilon_greedy takes its draws)
                return epsilon_greedy(q_network(obs), coins, picks, args.eval_epsilon)[0].cpu().numpy()

        run.play(envs, act, lambda *step: [r for r, _ in bk.gym_episodes(step[-1])], args.eval_episodes, seed=args.seed)


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    seeds = list(range(args.seed, args.seed + args.num_seeds))  # (trick: N agents, see --num-seeds)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_float32_matmul_precision("high")  # trick: TF32 matmuls on GPUs that have them

    # (trick: each seed's curve and the seeds' aggregate; solved: CartPole-v1's reward threshold, 475)
    with bk.Run(__file__, args, device, seeds=seeds, solved_at=gym.spec(args.env_id).reward_threshold) as run:
        # env setup
        obs_dim, n_actions, N = 4, 2, args.num_seeds  # (trick: CartPole's state and its two pushes, the tensor env's)

        # agent setup
        # trick: each seed's network and first env states from torch.manual_seed(seed), as in a run of that seed
        # alone; the networks stacked into one set of parameters with a first seed dim (and a skeleton to call them)
        networks, first_states = [], []
        for seed in seeds:
            torch.manual_seed(seed)
            networks.append(QNetwork(obs_dim, n_actions).to(device))
            first_states.append(cartpole_reset(torch.rand((args.num_envs, obs_dim), device=device)))
        params = stack_module_state(networks)[0]
        q_fn = partial(q_values, copy.deepcopy(networks[0]).to("meta"), params)
        # trick: the lr is a device tensor annealed in place: no compiled or CUDA graph is rebuilt for it. RAdam is
        # capturable on CUDA, compiled and captured (an eager CPU step refuses it: there it reads its step count)
        lr, capturable = torch.tensor(args.learning_rate, device=device), device.type == "cuda" or args.cudagraphs
        optimizer = make_radam(list(params.values()), lr, capturable=capturable or args.compile)  # (trick: stacked)

        # storage setup
        # trick: seed-major storage (N, T, B): each seed's flat batch (T * B) is a view, bound once
        obs = torch.zeros((N, args.num_steps, args.num_envs, obs_dim), device=device)
        actions = torch.zeros((N, args.num_steps, args.num_envs), dtype=torch.long, device=device)
        rewards = torch.zeros((N, args.num_steps, args.num_envs), device=device)
        dones = torch.zeros((N, args.num_steps, args.num_envs), device=device)
        values = torch.zeros((N, args.num_steps, args.num_envs), device=device)
        returns = torch.zeros((N, args.num_steps, args.num_envs), device=device)
        step_index, epsilons = torch.arange(args.num_steps, device=device), torch.ones(args.num_steps, device=device)
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

        # trick: torch.compile fuses the small kernels of the rollout step, the returns and the update; CudaGraphModule
        # replays the whole iteration as one CUDA graph. Storage, env, flat batch and constants are bound once with
        # partial: the graph copies none of them and takes no input. The warm-up call compiles before the capture
        rollout, returns_fn, update_fn = rollout_step, returns_of_rollout, update
        if args.compile:
            # trick: with trace_autograd_ops, torch.compile traces backward() into the graph: the update (gradients,
            # clipping, RAdam) is one graph, one call, no frame resumed in Python, no activation kept between graphs
            torch._dynamo.config.trace_autograd_ops = True
            returns_fn, update_fn = torch.compile(returns_fn, fullgraph=True), torch.compile(update_fn, fullgraph=True)
            # trick: the rollout step compiled on every device: thousands of envs make its ops worth fusing (its
            # draws are the counter-based RNG's tensor math, the same numbers compiled or not)
            rollout = torch.compile(rollout, fullgraph=True)
        rollout = partial(rollout, q_fn, obs, actions, values, rewards, dones, epsilons, env, ended_returns,
                          ended_lengths, rng)  # fmt: skip
        returns_fn = partial(returns_fn, q_fn, rewards, dones, values, returns, args.gamma, args.q_lambda,
                             env["state"], env["done"])  # fmt: skip
        update_fn = partial(update_fn, q_fn, optimizer, obs.flatten(1, 2), actions.flatten(1, 2),
                            returns.flatten(1, 2), max_grad_norm=args.max_grad_norm)  # fmt: skip
        # (trick: the iteration's pieces bound into one function of no input)
        iteration_fn = partial(iteration, rollout, returns_fn, update_fn, step_index, rng, batch_size, minibatch_size,
                               args.update_epochs)  # fmt: skip
        if args.cudagraphs:
            iteration_fn = CudaGraphModule(iteration_fn, warmup=2)  # (trick: the whole iteration, one CUDA graph)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            # (trick: "model" the first seed's network, in the PQN pair's format; "models" every seed's, stacked)
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model={k: v[0] for k, v in params.items()},
                                                  models=params, seeds=seeds)  # fmt: skip
        # TRY NOT TO MODIFY: start the game
        global_step = 0  # (trick: the env was reset on the device, where it was made)
        # a stopped run goes on: the state Run writes at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(q_network=params, global_step=global_step, envs=env,  # (trick: the env as tensors)
                                 optimizer=optimizer["state"],  # (trick: RAdam's state, make_radam)
                                 rng=rng)  # (trick: the counter-based RNG's counter)  # fmt: skip
        global_step = run.resume("global_step")  # (trick: the env's tensors restored in place, all of it)

        for iteration_number in run.progress(range(1, num_iterations + 1)):  # (trick: `iteration` is the function)
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration_number - 1.0) / num_iterations  # (trick: `iteration` is the function)
                optimizer["lr"].fill_(frac * args.learning_rate)  # (trick: in place, the graphs read this tensor)

            # ALGO LOGIC: action logic
            # trick: the epsilons of the iteration's steps, computed here and uploaded at once; the graph reads them
            duration = args.exploration_fraction * args.total_timesteps
            steps_at = [global_step + (step + 1) * args.num_envs for step in range(args.num_steps)]
            epsilons.copy_(torch.tensor([linear_schedule(args.start_e, args.end_e, duration, t) for t in steps_at]))
            run.add_to_results(epsilon=linear_schedule(args.start_e, args.end_e, duration, steps_at[-1]))  # the last

            # trick: the rollout, the Q(lambda) targets and the updates in one call, no host read in it
            td_loss, q_values_mean = iteration_fn()

            # trick: the episodes that ended in the iteration, read to the host once, at the log point
            ended = torch.stack([ended_returns, ended_lengths.float()]).cpu().numpy()
            for step, k, env_id in zip(*np.nonzero(ended[1].transpose(1, 0, 2))):  # by step, then seed (trick: seeds)
                run.episode(steps_at[step], float(ended[0, k, step, env_id]), int(ended[1, k, step, env_id]),
                            seed=seeds[k])  # fmt: skip
            global_step = steps_at[-1]

            # log point, as CleanRL's: the last minibatch's losses, one read an iteration; stop on a non-finite one
            # (trick: with --num-seeds, the mean over seeds: a seed's non-finite loss makes it non-finite too)
            logged = {"learning_rate": optimizer["lr"]}  # (trick: the lr a device tensor in RAdam's state by hand)
            losses = run.check_finite(global_step, {"td_loss": td_loss.mean(), "q_values": q_values_mean.mean()},
                                      unchecked=logged)  # (trick: the means over seeds)  # fmt: skip
            run.tick(global_step)
            run.report(global_step, {"losses/td_loss": losses["td_loss"], "losses/q_values": losses["q_values"],
                                     "charts/learning_rate": losses["learning_rate"]})  # fmt: skip
        # (trick: no envs to close: the tensor env is freed with the run)


if __name__ == "__main__":
    main(tyro.cli(Args))
