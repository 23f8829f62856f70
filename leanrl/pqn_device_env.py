"""PQN on CartPole-v1 with the env on the device: the fast twin (pqn_torchcompile.py) with the env as tensors.

This is pqn_torchcompile.py with gymnasium's CartPole-v1 as batched tensor math in the file (its equations, thresholds,
500-step truncation, +-0.05 reset and same-step autoreset): thousands of envs step in a few ops on the device, and the
whole iteration (rollout, Q(lambda), the epochs of updates) is one function, compiled in pieces with --compile and
captured as one CUDA graph with --cudagraphs. Each `# trick:` the twin lacks is a step from host envs to the device.

Run: python leanrl/pqn_device_env.py --compile --cudagraphs   (on a CPU: python leanrl/pqn_device_env.py)
"""

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
from torch.optim.radam import radam  # (trick: RAdam's step as a function, inside the compiled update)

from leanrl import bookkeeping as bk


@dataclass
class Args(bk.StopAndResume):  # --resume, --checkpoint-every-min (no replay memory here)
    exp_name: str = Path(__file__).stem
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
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


def cartpole_reset(shape, device, dtype=torch.float32):
    """CartPole-v1's starting states: every coordinate uniform in [-0.05, 0.05), as gymnasium draws them."""
    # trick: the env on the device: its states are a (num_envs, 4) tensor, a reset is one draw for all of them
    return torch.rand(shape, device=device, dtype=dtype) * 0.1 - 0.05


def cartpole_step(state, elapsed, action, reset_state, gravity=9.8, masscart=1.0, masspole=0.1, length=0.5,
                  force_mag=10.0, tau=0.02, x_threshold=2.4, theta_threshold=12 * 2 * math.pi / 360,
                  max_steps=500):  # fmt: skip
    """gymnasium's CartPole-v1 (explicit Euler, its constants as defaults, TimeLimit at max_steps) for a batch, with
    the same-step autoreset. state (B, 4): x, x_dot, theta, theta_dot; elapsed (B,): steps so far; action (B,): 0 left,
    1 right; reset_state (B, 4): where an ended env starts again. Returns (next state, elapsed, reward (1 every step),
    terminated, truncated, the state reached before any reset: gymnasium's final_obs)."""
    # trick: the env's step as whole-tensor math: thousands of envs in a few fused ops, no step leaves the device
    x, x_dot, theta, theta_dot = state.unbind(1)
    force = torch.where(action == 1, force_mag, -force_mag).to(state.dtype)
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    total_mass, polemass_length = masspole + masscart, masspole * length
    temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
    thetaacc = (gravity * sintheta - costheta * temp) / (length * (4.0 / 3.0 - masspole * costheta**2 / total_mass))
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    x, x_dot = x + tau * x_dot, x_dot + tau * xacc
    theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * thetaacc
    final_state = torch.stack([x, x_dot, theta, theta_dot], dim=1)
    terminated = (x < -x_threshold) | (x > x_threshold) | (theta < -theta_threshold) | (theta > theta_threshold)
    elapsed = elapsed + 1
    truncated = elapsed >= max_steps
    # trick: the autoreset as a torch.where, not a branch: an ended env's next state is its reset state
    done = terminated | truncated
    next_state = torch.where(done[:, None], reset_state, final_state)
    return next_state, torch.where(done, 0, elapsed), torch.ones_like(x), terminated, truncated, final_state


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


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step t: linear from start_e (t = 0) to end_e (t = duration), then end_e."""
    return start_e + (end_e - start_e) * min(t / duration, 1.0)


def epsilon_greedy(q_network, obs, epsilon):
    """One coin per env, as CleanRL draws them on the device: a random action with probability epsilon, else the
    greedy one. Returns (actions, max_a Q(obs, a)), the second the rollout's values for the Q(lambda) returns."""
    q_values = q_network(obs)
    random_actions = torch.randint(0, q_values.shape[1], (obs.shape[0],), device=obs.device)
    max_values, max_actions = q_values.max(dim=1)
    explore = torch.rand(obs.shape[0], device=obs.device) < epsilon
    return torch.where(explore, random_actions, max_actions), max_values


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


def policy_step(q_network, obs, actions, values, epsilon, step):
    """The rollout's policy step at `step` (a 1-element index tensor): epsilon-greedy on obs[step], the action and the
    max-Q value written into their (T, B) storage in place; returns the actions."""
    # trick: the step is a device tensor and the storage is written inside the step: one compiled graph (and one CUDA
    # graph) serves every step, its only input the 8-byte index; epsilon, a device tensor, is written in place
    with torch.no_grad():
        action, values[step] = epsilon_greedy(q_network, obs[step].flatten(0, 1), epsilon)
        actions[step] = action
    return action


def returns_of_rollout(q_network, rewards, dones, values, returns, gamma, q_lambda, next_obs, next_done):
    """The bootstrap value of next_obs and the Q(lambda) returns of the rollout storage, written into returns."""
    # trick: the bootstrap value and the returns are one function of the storage, compiled and captured like the updates
    with torch.no_grad():
        next_value = q_network(next_obs).max(dim=1).values
        returns.copy_(q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda))


def rollout_step(q_network, obs, actions, values, rewards, dones, epsilons, env, ended_returns, ended_lengths, step):
    """One step of the rollout at `step` (a 1-element index tensor): the env's state and done flag into the storage,
    the policy step, the env step (with its autoreset), its reward, and each env's episode statistics: the running
    return and length, written into ended_returns and ended_lengths at the step an episode ends (0 elsewhere)."""
    # trick: env and policy are one function of the device storage: one compiled graph for every step of the
    # rollout, and the episode statistics are sums kept on the device, read once an iteration at the log point
    obs[step], dones[step] = env["state"], env["done"]
    action = policy_step(q_network, obs, actions, values, epsilons[step], step)
    reset_state = cartpole_reset(env["state"].shape, env["state"].device)
    state, elapsed, reward, terminated, truncated, _ = cartpole_step(env["state"], env["elapsed"], action, reset_state)
    # as CleanRL: a truncated episode (CartPole's 500-step limit) ends the bootstrap as a terminated one
    done = terminated | truncated
    rewards[step] = reward
    env["return"].add_(reward)
    env["length"].add_(1)
    ended_returns[step] = torch.where(done, env["return"], 0.0)
    ended_lengths[step] = torch.where(done, env["length"], 0)
    env["return"].copy_(torch.where(done, 0.0, env["return"]))
    env["length"].copy_(torch.where(done, 0, env["length"]))
    env["state"].copy_(state)
    env["elapsed"].copy_(elapsed)
    env["done"].copy_(done.float())


def iteration(rollout, returns_fn, update_fn, step_index, batch_size, minibatch_size, update_epochs):
    """One iteration of PQN, all of it on the device: the rollout (rollout(step) for each step of step_index), the
    Q(lambda) returns, then update_epochs epochs of minibatch updates; returns the last update's (TD loss, mean Q)."""
    # trick: the whole iteration is one function of bound tensors with no host read in it: CudaGraphModule captures
    # it as one CUDA graph, one launch an iteration. Its pieces are compiled one by one, not the unrolled whole: the
    # step and the update are each compiled once and called num_steps and epochs x minibatches times
    for step in step_index.split(1):
        rollout(step)
    returns_fn()
    for _epoch in range(update_epochs):
        # trick: the shuffle as the argsort of a draw, on the device, inside the captured iteration
        for mb_inds in torch.rand(batch_size, device=step_index.device).argsort().split(minibatch_size):
            stats = update_fn(mb_inds)
    return stats


def make_radam(params, lr, capturable):
    """The state of torch.optim.RAdam (its defaults) for a list of parameters, for torch.optim.radam.radam."""
    # trick: RAdam's state by hand, and its step by torch.optim's functional radam inside the compiled update:
    # Optimizer.step breaks the graph on purpose, the function it calls does not. Capturable: the step counts are
    # device tensors and rectifying is a torch.where, not a host branch (one graph, no sync)
    zeros, steps = [torch.zeros_like(p) for p in params], [torch.zeros((), device=params[0].device) for _ in params]
    return dict(params=params, lr=lr, capturable=capturable, state=(zeros, [z.clone() for z in zeros], steps))


def update(q_network, optimizer, obs, actions, returns, mb_inds, max_grad_norm):
    """One gradient step on minibatch mb_inds of the flat batch; returns the stacked (TD loss, mean Q of actions)."""
    # trick: the minibatch is gathered inside the compiled (and captured) update: the batch is bound, indices its input
    obs, actions, returns = obs[mb_inds], actions[mb_inds], returns[mb_inds]
    old_val = q_network(obs).gather(1, actions[:, None]).squeeze(1)
    loss = F.mse_loss(returns, old_val)

    # optimize the model
    # trick: the grads set to None by hand, as zero_grad does: torch.compile does not trace zero_grad (a graph break)
    for param in q_network.parameters():
        param.grad = None
    loss.backward()
    nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
    with torch.no_grad():
        params = optimizer["params"]
        radam(params, [p.grad for p in params], *optimizer["state"], lr=optimizer["lr"], beta1=0.9, beta2=0.999,
              eps=1e-8, weight_decay=0.0, capturable=optimizer["capturable"], foreach=True)  # fmt: skip
    # trick: one stacked output for the logged scalars: a CUDA graph replay clones one tensor out, not two
    return torch.stack([loss.detach(), old_val.mean().detach()])


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps", "max_grad_norm")
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
    """Play args.eval_episodes episodes epsilon-greedily (args.eval_epsilon) with a saved Q-network."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    weight = checkpoint["model"].get("network.1.weight")  # the first LayerNorm's: DQN's and the Atari nets have none
    if "q_lambda" not in checkpoint["args"] or weight is None or weight.dim() != 1:
        bk.fail(__file__, f"--eval-checkpoint {args.eval_checkpoint} is not a checkpoint of this script")
    args.env_id = checkpoint["args"]["env_id"]
    torch.manual_seed(args.seed)  # the exploration coins
    with bk.Run(__file__, args, device, burnin=0, mode="eval") as run:
        envs = make_envs(args.env_id, 1, run.videos)
        q_network = QNetwork(envs.single_observation_space.shape[0], int(envs.single_action_space.n)).to(device)
        q_network.load_state_dict(checkpoint["model"])

        def act(obs):
            with torch.no_grad():
                obs = torch.as_tensor(obs, dtype=torch.float32, device=device)
                return epsilon_greedy(q_network, obs, args.eval_epsilon)[0].cpu().numpy()

        run.play(envs, act, lambda *step: [r for r, _ in bk.gym_episodes(step[-1])], args.eval_episodes, seed=args.seed)


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_float32_matmul_precision("high")  # trick: TF32 matmuls on GPUs that have them

    with bk.Run(__file__, args, device) as run:
        # env setup
        obs_dim, n_actions = 4, 2  # (trick: CartPole's state and its two pushes, the tensor env's)

        # agent setup
        q_network = QNetwork(obs_dim, n_actions).to(device)
        # trick: the lr is a device tensor annealed in place: no compiled or CUDA graph is rebuilt for it. RAdam is
        # capturable on CUDA, compiled and captured (an eager CPU step refuses it: there it reads its step count)
        lr, capturable = torch.tensor(args.learning_rate, device=device), device.type == "cuda" or args.cudagraphs
        optimizer = make_radam(list(q_network.parameters()), lr, capturable=capturable or args.compile)

        # storage setup
        obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
        dones = torch.zeros((args.num_steps, args.num_envs), device=device)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)
        returns = torch.zeros((args.num_steps, args.num_envs), device=device)
        step_index, epsilons = torch.arange(args.num_steps, device=device), torch.ones(args.num_steps, device=device)
        # trick: the env and the episode statistics are device tensors, and so is what ended in each step
        ended_returns = torch.zeros((args.num_steps, args.num_envs), device=device)
        ended_lengths = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        env = dict(
            state=cartpole_reset((args.num_envs, obs_dim), device),
            elapsed=torch.zeros(args.num_envs, dtype=torch.long, device=device),
            done=torch.zeros(args.num_envs, device=device),
            length=torch.zeros(args.num_envs, dtype=torch.long, device=device),
            **{"return": torch.zeros(args.num_envs, device=device)},
        )

        # trick: torch.compile fuses the small kernels of the rollout step, the returns and the update; CudaGraphModule
        # replays the whole iteration as one CUDA graph. Storage, env, flat batch and constants are bound once with
        # partial: the graph copies none of them and takes no input. The warm-up call compiles before the capture
        rollout, returns_fn, update_fn = rollout_step, returns_of_rollout, update
        if args.compile:
            # trick: with trace_autograd_ops, torch.compile traces backward() into the graph: the update (gradients,
            # clipping, RAdam) is one graph, one call, no frame resumed in Python, no activation kept between graphs
            torch._dynamo.config.trace_autograd_ops = True
            returns_fn, update_fn = torch.compile(returns_fn, fullgraph=True), torch.compile(update_fn, fullgraph=True)
            # trick: the rollout step compiled on every device: thousands of envs make its ops worth fusing. On CPU
            # it draws with aten's generator (fallback_random): inductor's CPU RNG runs Python on every call
            rollout = torch.compile(rollout, fullgraph=True, options={"fallback_random": device.type == "cpu"})
        rollout = partial(rollout, q_network, obs, actions, values, rewards, dones, epsilons, env, ended_returns,
                          ended_lengths)  # fmt: skip
        returns_fn = partial(returns_fn, q_network, rewards, dones, values, returns, args.gamma, args.q_lambda,
                             env["state"], env["done"])  # fmt: skip
        update_fn = partial(update_fn, q_network, optimizer, obs.flatten(0, 1), actions.view(-1), returns.view(-1),
                            max_grad_norm=args.max_grad_norm)  # fmt: skip
        # (trick: the iteration's pieces bound into one function of no input)
        iteration_fn = partial(iteration, rollout, returns_fn, update_fn, step_index, batch_size, minibatch_size,
                               args.update_epochs)  # fmt: skip
        if args.cudagraphs:
            iteration_fn = CudaGraphModule(iteration_fn, warmup=2)  # (trick: the whole iteration, one CUDA graph)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0  # (trick: the env was reset on the device, where it was made)
        # a stopped run goes on: the state Run writes at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(q_network=q_network, global_step=global_step, envs=env,  # (trick: the env as tensors)
                                 optimizer=optimizer["state"])  # (trick: RAdam's state, make_radam)  # fmt: skip
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
            td_loss, q_values = iteration_fn()

            # trick: the episodes that ended in the iteration, read to the host once, at the log point
            ended = torch.stack([ended_returns, ended_lengths.float()]).cpu().numpy()
            for step, env_id in zip(*np.nonzero(ended[1])):
                run.episode(steps_at[step], float(ended[0, step, env_id]), int(ended[1, step, env_id]))
            global_step = steps_at[-1]

            # log point, as CleanRL's: the last minibatch's losses, one read an iteration; stop on a non-finite one
            logged = {"learning_rate": optimizer["lr"]}  # (trick: the lr a device tensor in RAdam's state by hand)
            losses = run.check_finite(global_step, {"td_loss": td_loss, "q_values": q_values}, unchecked=logged)
            run.tick(global_step)
            run.report(global_step, {"losses/td_loss": losses["td_loss"], "losses/q_values": losses["q_values"],
                                     "charts/learning_rate": losses["learning_rate"]})  # fmt: skip
        # (trick: no envs to close: the tensor env is freed with the run)


if __name__ == "__main__":
    main(tyro.cli(Args))
