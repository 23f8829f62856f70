"""PQN on Atari (envpool), the fast twin of pqn_atari_envpool.py: same algorithm, with the speed tricks. No replay
memory and no target network: many envs, a LayerNorm Q-network, Q(lambda) returns over a short rollout, RAdam.

Run: python leanrl/pqn_atari_envpool_torchcompile.py --env-id Breakout-v5 --compile --cudagraphs
"""

import os  # (trick: --env-threads -1: the cores this process may use)
import random
from collections import deque  # (trick: --async-envs: the env groups in flight)
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: network, optimizer, storage bound with partial)
from pathlib import Path

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)

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
    """if toggled, cuda will be enabled when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    save_model: bool = False
    """whether to save the model (and what evaluation needs, and the training state: see --resume) at the end"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # PQN learns from iteration 1. 4 covers the twin's compiling and capturing: its Q(lambda) graph, called once an
    # iteration, is captured at its 3rd call (CudaGraphModule(warmup=3)), the others within iteration 1; one to spare
    measure_burnin: int = 4
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of full games to play with --eval-checkpoint"""
    eval_epsilon: float = 0.05
    """the exploration rate of the evaluation games (CleanRL's DQN evals use 0.05)"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile on the policy step, the Q(lambda) returns and the update"""
    cudagraphs: bool = False
    """whether to capture the policy step, the Q(lambda) returns and the update as CUDA graphs (CudaGraphModule)"""

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """an envpool Atari game (no --capture-video here: RecordVideo cannot wrap envpool, only ale-py's envs)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments, rounded down to whole iterations (num_envs x num_steps each)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for the Q-network"""
    gamma: float = 0.99
    """the discount factor gamma"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the Q-network"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) returns"""
    env_threads: int = 0  # trick: --env-threads and --async-envs use the whole machine (FAST_FLAGS)
    """envpool's worker threads: 0 is envpool's default (CleanRL's), -1 the cores this process may use"""
    async_envs: bool = False
    """step half the envs while the policy acts for the other half (two envpools of num_envs / 2)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def make_env(env_id, num_envs, seed, num_threads=0):  # (trick: num_threads, --env-threads)
    """envpool's Atari pipeline: 4 stacked 84x84 grey frames, frame skip 4, loss of life ends a training episode."""
    # trick: -1 threads: one per core this process may use (envpool's default counts the machine's, ignoring affinity)
    threads = len(os.sched_getaffinity(0)) if num_threads == -1 else num_threads
    return envpool.make(env_id, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=seed,
                        num_threads=threads)  # fmt: skip


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """The Nature CNN with a LayerNorm after every hidden layer (what lets PQN learn without a target network)."""

    def __init__(self, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.LayerNorm([32, 20, 20]),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.LayerNorm([64, 9, 9]),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.LayerNorm([64, 7, 7]),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(3136, 512)),
            nn.LayerNorm(512),
            nn.ReLU(),
            layer_init(nn.Linear(512, n_actions)),
        )

    def forward(self, x):
        return self.network(x / 255.0)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at step t: linear from start_e to end_e over `duration` steps, then end_e."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def epsilon_greedy(q_network, obs, epsilon):
    """One coin per env, drawn on the device as CleanRL does: a random action with probability epsilon, else the greedy
    one. Returns (actions, max_a Q(obs, a)), the second the rollout's values for the Q(lambda) returns."""
    q_values = q_network(obs)
    random_actions = torch.randint(q_values.shape[1], (obs.shape[0],), device=obs.device)
    max_values, max_actions = q_values.max(dim=1)
    explore = torch.rand(obs.shape[0], device=obs.device) < epsilon
    return torch.where(explore, random_actions, max_actions), max_values


def q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda):
    """Q(lambda) returns over (T, B) time-major tensors, CleanRL's reversed loop.

    values[t] = max_a Q(obs[t], a) at acting time; next_value = max_a Q(obs[T], a). dones[t] == 1 means obs[t] begins
    a new episode: R_t = r_t + gamma * (lambda * R_{t+1} + (1 - lambda) * values[t + 1]) unless dones[t + 1], and the
    last step bootstraps from next_value unless next_done.
    """
    # trick: no Python loop over T. Q(lambda) is the reverse linear recurrence R_t = a_t + c_t * R_{t+1}, with
    # R_T = next_value as one more row; recursive doubling solves it in log2(T + 1) whole-tensor steps:
    # R_t += C_t * R_{t+s}, C_t *= C_{t+s}, s = 1, 2, 4, ...
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    returns = torch.cat([rewards + gamma * (1 - q_lambda) * nextvalues * nextnonterminal, next_value[None]])
    coefs = torch.cat([gamma * q_lambda * nextnonterminal, torch.zeros_like(next_value)[None]])
    num_rows, shift = returns.shape[0], 1
    while shift < num_rows:
        pad = returns.new_zeros((shift,) + returns.shape[1:])  # nothing follows the last row
        returns, coefs = (
            returns + coefs * torch.cat([returns[shift:], pad]),
            coefs * torch.cat([coefs[shift:], pad]),
        )
        shift *= 2
    return returns[:-1]


def policy_step(q_network, obs, actions, values, epsilons, step):
    """The rollout's epsilon-greedy step at `step` (a 1-element index tensor): reads obs[step] and epsilons[step],
    writes the action and the greedy value into their (T, B) storage in place; returns the action."""
    # trick: the step is a device tensor and the storage is written inside the step, so one compiled graph (and one
    # CUDA graph) serves every step, and its only input is the 8-byte index
    with torch.no_grad():
        action, values[step] = epsilon_greedy(q_network, obs[step].flatten(0, 1), epsilons[step])
        actions[step] = action
    return action


def q_lambda_targets(q_network, obs, env_out, values, returns, gamma, q_lambda):
    """The bootstrap value of obs[T] and the Q(lambda) returns over the rollout storage, written into returns. obs and
    env_out hold T + 1 rows: row t + 1 is what the env returned at step t (observation, reward, done flag)."""
    # trick: the bootstrap value and Q(lambda) are one function of the storage, compiled and captured like the update
    with torch.no_grad():
        next_value = q_network(obs[-1]).max(dim=1).values
        rewards, dones, next_done = env_out[1:, 0], env_out[:-1, 1], env_out[-1, 1]
        returns.copy_(q_lambda_returns(rewards, values, dones, next_value, next_done, gamma, q_lambda))


def update(q_network, optimizer, obs, actions, returns, mb_inds, max_grad_norm):
    """One gradient step on the minibatch mb_inds of the flat batch; returns the detached TD loss and mean Q-value,
    stacked (LOSSES)."""
    # trick: the minibatch is gathered here, inside the compiled (and captured) update: the flat batch is bound once
    # and the indices are the only input, so no field is gathered outside the graph and then copied into it again
    obs, actions, returns = obs[mb_inds], actions[mb_inds], returns[mb_inds]
    old_val = q_network(obs).gather(1, actions[:, None]).squeeze(1)
    loss = F.mse_loss(returns, old_val)
    # trick: grads set to None by hand (what zero_grad does): torch.compile does not trace Optimizer.zero_grad, a break
    for param in q_network.parameters():
        param.grad = None
    loss.backward()
    nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
    optimizer.step()
    return torch.stack([loss.detach(), old_val.detach().mean()])


LOSSES = ("td_loss", "q_values")  # what update() returns, CleanRL's names


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps")
    bk.check_flags(__file__, args, positive)
    if not 0.0 <= args.eval_epsilon <= 1.0:
        bk.fail(__file__, f"--eval-epsilon must be in [0, 1], got {args.eval_epsilon}")
    if args.eval_checkpoint is not None:
        return
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs x "
                f"--num-steps = {batch_size})")  # fmt: skip
    if batch_size % args.num_minibatches:
        bk.fail(__file__, f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} steps")
    if not 0.0 < args.exploration_fraction <= 1.0:
        bk.fail(__file__, f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if not 0.0 <= args.q_lambda <= 1.0:
        bk.fail(__file__, f"--q-lambda must be in [0, 1], got {args.q_lambda}")
    if args.env_threads < -1:  # (trick: --env-threads, --async-envs)
        bk.fail(__file__, f"--env-threads must be -1 (this process's cores), 0 or more, got {args.env_threads}")
    if args.async_envs and args.num_envs % 2:
        bk.fail(__file__, f"--async-envs splits the envs in two: --num-envs {args.num_envs} is odd")
    bk.check_atari_env(__file__, args.env_id)


def evaluate(args, device):
    """Play --eval-episodes full games with a checkpoint, epsilon-greedy at --eval-epsilon as CleanRL's evals do."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    args.env_id, num_envs = checkpoint["args"]["env_id"], checkpoint["args"]["num_envs"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_env(args.env_id, num_envs, args.seed)
        q_network = QNetwork(envs.action_space.n).to(device)
        q_network.load_state_dict(checkpoint["model"])
        running_returns = np.zeros(num_envs)

        def act(obs):
            with torch.no_grad():
                actions = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
            explore = np.random.random(num_envs) < args.eval_epsilon
            return np.where(explore, np.random.randint(envs.action_space.n, size=num_envs), actions)

        def games(rewards, terminations, truncations, infos):
            return bk.game_returns(running_returns, infos["reward"], infos["terminated"].astype(bool) | truncations)

        run.play(envs, act, games, args.eval_episodes)


def main(args):
    check_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)

    torch.set_float32_matmul_precision("high")  # trick: TF32 matmuls on the GPU
    with bk.Run(__file__, args, device) as run:
        # env setup
        # trick: --async-envs: two groups of envs, each its own envpool (env i keeps its seed, seed + i, and its
        # column): envpool's threads step one group while the policy acts for the other, so neither waits
        num_groups = 2 if args.async_envs else 1
        group_size = args.num_envs // num_groups
        cols = [slice(g * group_size, (g + 1) * group_size) for g in range(num_groups)]
        env_groups = [make_env(args.env_id, group_size, args.seed + c.start, args.env_threads) for c in cols]
        envs = env_groups[0]
        q_network = QNetwork(envs.action_space.n).to(device)
        # trick: the lr is a tensor annealed in place (no recompile, no re-capture). Capturable on CUDA whatever the
        # flags: RAdam keeps its step count on the device, so a step never syncs and a CUDA graph may replay it
        optimizer = optim.RAdam(
            q_network.parameters(),
            lr=torch.tensor(args.learning_rate, device=device),
            capturable=device.type == "cuda",
        )

        # ALGO Logic: Storage setup
        # trick: T + 1 rows, each written in place where the data lands: a row per env of one byte buffer holds the
        # env's observation, then its reward and done flag as float32 (4 x 84 x 84 bytes keep them aligned), so a step
        # lands in one copy, and obs and env_out (T + 1, 2, envs) are views of it. Row T is the bootstrap input and
        # becomes row 0 of the next iteration
        obs_shape = envs.observation_space.shape
        obs_bytes = int(np.prod(obs_shape))
        received = torch.zeros((args.num_steps + 1, args.num_envs, obs_bytes + 8), dtype=torch.uint8, device=device)
        obs = received[..., :obs_bytes].view(received.shape[:2] + obs_shape)
        env_out = received[..., obs_bytes:].view(torch.float32).permute(0, 2, 1)  # reward, done (trick: T + 1 rows)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        # (trick: T + 1 rows: rewards and dones are rows of env_out)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)
        returns = torch.zeros((args.num_steps, args.num_envs), device=device)
        # trick: a non_blocking copy from envpool's pageable arrays need not be asynchronous (the driver stages it). On
        # CUDA a step goes up from a pinned host buffer of the storage's rows, in one asynchronous copy, done before
        # its rows are written again (a group's next action.cpu() waits for the stream)
        staging = torch.zeros(received.shape[1:], dtype=torch.uint8, pin_memory=device.type == "cuda")
        host = staging.numpy()  # numpy's views of it, made once (a host tensor's: no sync)
        host_obs, host_out = host[:, :obs_bytes].reshape((-1,) + obs_shape), host[:, obs_bytes:].view(np.float32)
        # trick: the iteration's epsilons go to the device in one copy, the policy step reads its own by index
        epsilons = torch.zeros(args.num_steps, device=device)
        step_index = torch.arange(args.num_steps, device=device)

        policy, targets_fn, update_fn = policy_step, q_lambda_targets, update
        if args.compile:  # trick: torch.compile fuses the small ops of the policy step, Q(lambda) and the update
            # trick: on CPU the policy step draws its coins with aten's RNG (fallback_random): inductor's own RNG goes
            # through a Python path on every call there. On GPU inductor's RNG is fused into the kernel and is kept
            policy = torch.compile(policy, fullgraph=True, options={"fallback_random": device.type == "cpu"})
            targets_fn, update_fn = torch.compile(targets_fn, fullgraph=True), torch.compile(update)
        # trick: the storage and the flat batch (views of it) are bound once: no graph copies them
        # (trick: --async-envs: a policy step per group, bound to the group's columns of the storage)
        policies = [partial(policy, q_network, obs[:, c], actions[:, c], values[:, c], epsilons) for c in cols]
        targets_fn = partial(targets_fn, q_network, obs, env_out, values, returns, args.gamma, args.q_lambda)
        flat_batch = (obs[:-1].flatten(0, 1), actions.view(-1), returns.view(-1))
        update_step = partial(update_fn, q_network, optimizer, *flat_batch, max_grad_norm=args.max_grad_norm)
        if args.cudagraphs:
            # trick: replay each as one CUDA graph: tensor arguments (here only the indices) are copied into static
            # buffers, outputs cloned out; the warm-up calls (compiling) run before the capture
            policies = [CudaGraphModule(policy, warmup=3) for policy in policies]
            targets_fn = CudaGraphModule(targets_fn, warmup=3)
            update_step = CudaGraphModule(update_step, warmup=3)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        running_returns = np.zeros(args.num_envs)  # each env's score in its current game
        # (trick: T + 1 rows: the first obs is row T; --async-envs: the groups' obs side by side)
        obs[-1] = torch.as_tensor(np.concatenate([envs.reset()[0] for envs in env_groups]), device=device)
        run.state = lambda: dict(q_network=q_network, optimizer=optimizer, global_step=global_step,
                                 envs=(env_groups, running_returns))  # (trick: --async-envs: every group)  # fmt: skip
        global_step = run.resume("global_step")  # a stopped run goes on (bookkeeping.py) in new games

        def receive(step, group):
            """The envs' answer to a group's actions at `step`: obs, reward and done into their rows, games counted."""
            next_obs_np, reward, terminations, truncations, info = env_groups[group].recv()
            # trick: one non_blocking host-to-device copy a (group's) step, from pinned memory into the storage. numpy
            # fills the buffer in one thread: torch's parallel copy leaves OpenMP threads spinning on envpool's cores
            columns = cols[group]  # (trick: --async-envs: a group's rows a copy)
            np.copyto(host_obs[columns], next_obs_np)
            host_out[columns, 0], host_out[columns, 1] = reward, terminations | truncations
            received[step + 1, columns].copy_(staging[columns], non_blocking=True)
            # a lost life ends a training episode; a game (and its score) ends on the last life or the time limit
            game_over = info["terminated"].astype(bool) | truncations
            for episodic_return in bk.game_returns(running_returns[columns], info["reward"], game_over):
                # the global step of `step` (with --async-envs a group is received during the next step)
                run.episode((iteration - 1) * args.batch_size + (step + 1) * args.num_envs, episodic_return)

        in_flight = deque()  # (trick: --async-envs: the groups sent and not yet received, oldest first)
        for iteration in run.progress(range(1, args.num_iterations + 1)):
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lrnow = frac * args.learning_rate
                optimizer.param_groups[0]["lr"].fill_(lrnow)  # trick: in place, the graphs read this tensor

            duration = args.exploration_fraction * args.total_timesteps
            schedule = [linear_schedule(args.start_e, args.end_e, duration, global_step + args.num_envs * (step + 1))
                        for step in range(args.num_steps)]  # fmt: skip
            epsilons.copy_(torch.tensor(schedule), non_blocking=True)  # (trick: the iteration's epsilons in one copy)
            epsilon = schedule[-1]
            received[0] = received[-1]  # (trick: T + 1 rows: row T becomes row 0)
            for step in range(0, args.num_steps):
                global_step += args.num_envs
                # (trick: T + 1 rows: the env's obs and done land in their rows after the step, no copies here)
                for group in range(num_groups):  # (trick: --async-envs: a group at a time)
                    # ALGO LOGIC: action logic
                    action = policies[group](step_index[step : step + 1])  # (trick: the compiled, captured step)

                    # TRY NOT TO MODIFY: execute the game and log data.
                    # trick: envs.step as send, then recv: the group steps in the background until it is received,
                    # after the next group's actions went out (one group: received at once, as envs.step does)
                    env_groups[group].send(action.cpu().numpy())
                    in_flight.append((step, group))
                    if len(in_flight) == num_groups:
                        receive(*in_flight.popleft())
            while in_flight:  # (trick: --async-envs: the last group sent)
                receive(*in_flight.popleft())

            # Compute Q(lambda) targets, bootstrapped from the greedy value of the last observation
            targets_fn()  # (trick: bootstrap value and Q(lambda) in one compiled, captured call)

            # Optimizing the Q-network
            for _epoch in range(args.update_epochs):
                # as a careful user writes CleanRL's shuffle: the minibatch indices are drawn on the device (no index
                # upload per minibatch), from torch's generator, so the twin draws the very same minibatches
                for mb_inds in torch.randperm(args.batch_size, device=device).split(args.minibatch_size):
                    out = update_step(mb_inds)  # (trick: the captured update, minibatch gathered in it)

            run.tick(global_step)
            # logged as CleanRL does, once an iteration: the last minibatch's TD loss and mean Q-value (one host read)
            losses = run.check_finite(global_step, dict(zip(LOSSES, out)))
            logs = {"charts/learning_rate": lrnow if args.anneal_lr else args.learning_rate, "charts/epsilon": epsilon}
            run.report(global_step, {**logs, **{f"losses/{name}": value for name, value in losses.items()}})
        for envs in env_groups:  # (trick: --async-envs: every group)
            envs.close()


# trick: a fast configuration for one GPU and many cores, flags only (the defaults above stay CleanRL's): purejaxql's
# config/alg/pqn_atari.yaml (128 envs x 32 steps, 2 epochs of 32 minibatches, epsilon to 0.001 over the first 10%, a
# constant lr), with the envs on every core and stepping while the policy acts; benchmarks/time_to_score.py runs it
FAST_FLAGS = (
    "--num-envs 128 --num-steps 32 --update-epochs 2 --num-minibatches 32 --end-e 0.001 --no-anneal-lr"
    " --async-envs --env-threads -1"
)


if __name__ == "__main__":
    main(tyro.cli(Args, description=f"{__doc__}\nFast configuration: {FAST_FLAGS}"))  # (trick: FAST_FLAGS)
