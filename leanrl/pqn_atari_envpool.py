"""PQN on Atari (envpool), eager PyTorch: CleanRL's pqn_atari_envpool, the baseline of the speed tables. No replay
memory and no target network: many envs, a LayerNorm Q-network, Q(lambda) returns over a short rollout, RAdam.

Run: python leanrl/pqn_atari_envpool.py --env-id Breakout-v5 --total-timesteps 10000000
"""

import random
from dataclasses import dataclass
from pathlib import Path

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro

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

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def make_env(env_id, num_envs, seed):
    """envpool's Atari pipeline: 4 stacked 84x84 grey frames, frame skip 4, loss of life ends a training episode."""
    return envpool.make(env_id, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=seed)


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
    returns = torch.zeros_like(rewards)
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            returns[t] = rewards[t] + gamma * next_value * (1.0 - next_done)
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            bootstrap = q_lambda * returns[t + 1] + (1 - q_lambda) * values[t + 1]
            returns[t] = rewards[t] + gamma * bootstrap * nextnonterminal
    return returns


def update(q_network, optimizer, obs, actions, returns, max_grad_norm):
    """One gradient step on one minibatch; returns the detached TD loss and mean Q-value, stacked (LOSSES)."""
    old_val = q_network(obs).gather(1, actions[:, None]).squeeze(1)
    loss = F.mse_loss(returns, old_val)
    optimizer.zero_grad()
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

    with bk.Run(__file__, args, device) as run:
        # env setup
        envs = make_env(args.env_id, args.num_envs, args.seed)
        q_network = QNetwork(envs.action_space.n).to(device)
        optimizer = optim.RAdam(q_network.parameters(), lr=args.learning_rate)

        # ALGO Logic: Storage setup
        obs_shape = envs.observation_space.shape
        obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
        dones = torch.zeros((args.num_steps, args.num_envs), device=device)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        running_returns = np.zeros(args.num_envs)  # each env's score in its current game
        next_obs = torch.as_tensor(envs.reset()[0], device=device)
        next_done = torch.zeros(args.num_envs, device=device)
        run.state = lambda: dict(q_network=q_network, optimizer=optimizer, global_step=global_step,
                                 envs=(envs, running_returns))  # fmt: skip
        global_step = run.resume("global_step")  # a stopped run goes on (bookkeeping.py) in new games
        for iteration in run.progress(range(1, args.num_iterations + 1)):
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lrnow = frac * args.learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            for step in range(0, args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done

                # ALGO LOGIC: action logic
                duration = args.exploration_fraction * args.total_timesteps
                epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
                with torch.no_grad():
                    action, values[step] = epsilon_greedy(q_network, next_obs, epsilon)
                actions[step] = action

                # TRY NOT TO MODIFY: execute the game and log data.
                next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())
                next_done_np = np.logical_or(terminations, truncations)
                rewards[step] = torch.as_tensor(reward, device=device)
                next_obs = torch.as_tensor(next_obs_np, device=device)
                next_done = torch.as_tensor(next_done_np, dtype=torch.float32, device=device)
                # a lost life ends a training episode; a game (and its score) ends on the last life or the time limit
                game_over = info["terminated"].astype(bool) | truncations
                for episodic_return in bk.game_returns(running_returns, info["reward"], game_over):
                    run.episode(global_step, episodic_return)

            # Compute Q(lambda) targets, bootstrapped from the greedy value of the last observation
            with torch.no_grad():
                next_value = q_network(next_obs).max(dim=1).values
                returns = q_lambda_returns(rewards, values, dones, next_value, next_done, args.gamma, args.q_lambda)

            # flatten the batch
            b_obs = obs.reshape((-1,) + obs_shape)
            b_actions = actions.reshape(-1)
            b_returns = returns.reshape(-1)

            # Optimizing the Q-network
            for _epoch in range(args.update_epochs):
                # as a careful user writes CleanRL's shuffle: the minibatch indices are drawn on the device (no index
                # upload per minibatch), from torch's generator, so the twin draws the very same minibatches
                for mb_inds in torch.randperm(args.batch_size, device=device).split(args.minibatch_size):
                    out = update(q_network, optimizer, b_obs[mb_inds], b_actions[mb_inds], b_returns[mb_inds],
                                 args.max_grad_norm)  # fmt: skip

            run.tick(global_step)
            # logged as CleanRL does, once an iteration: the last minibatch's TD loss and mean Q-value (one host read)
            losses = run.check_finite(global_step, dict(zip(LOSSES, out)))
            logs = {"charts/learning_rate": lrnow if args.anneal_lr else args.learning_rate, "charts/epsilon": epsilon}
            run.report(global_step, {**logs, **{f"losses/{name}": value for name, value in losses.items()}})
        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
