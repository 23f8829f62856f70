"""PQN on classic-control envs (CleanRL's pqn.py, CartPole-v1): the eager PyTorch baseline.

PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning") is DQN without the replay buffer and the
target network: many vectorised envs, a LayerNorm Q-network, Q(lambda) returns over a short rollout, a few epochs of
minibatch updates, RAdam.

Run: python leanrl/pqn.py --env-id CartPole-v1 --total-timesteps 500000
"""

import random
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
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
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (env 0's, in the run folder's `videos`)"""
    save_model: bool = False
    """whether to save the Q-network (and the training state, see --resume) at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # 8: the twin captures each CUDA graph at its 5th call: the returns' (one call an iteration) in iteration 5
    measure_burnin: int = 8
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    eval_epsilon: float = 0.05
    """the exploration rate of an evaluation (the end of the training schedule)"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium env with Discrete actions and vector observations)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments, rounded down to whole iterations (num_envs x num_steps each)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run for each environment per update"""
    num_minibatches: int = 4
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
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    q_lambda: float = 0.65
    """the lambda for Q(lambda)"""


def make_envs(env_id, num_envs, video_dir=None):
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
    num_steps = rewards.shape[0]
    returns = torch.zeros_like(rewards)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            returns[t] = rewards[t] + gamma * next_value * (1.0 - next_done)
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            mixed = q_lambda * returns[t + 1] + (1 - q_lambda) * values[t + 1]
            returns[t] = rewards[t] + gamma * mixed * nextnonterminal
    return returns


def update(q_network, optimizer, batch, max_grad_norm):
    """One gradient step on a minibatch (obs, actions, returns); returns (TD loss, mean Q of the actions taken)."""
    old_val = q_network(batch["obs"]).gather(1, batch["actions"][:, None]).squeeze(1)
    loss = F.mse_loss(batch["returns"], old_val)

    # optimize the model
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
    optimizer.step()
    return loss.detach(), old_val.mean().detach()


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
    bk.check_gym_env(__file__, args.env_id, gym.spaces.Discrete, "CartPole-v1")
    if not isinstance(gym.make(args.env_id).observation_space, gym.spaces.Box):  # e.g. FrozenLake's Discrete states
        bk.fail(__file__, f"--env-id {args.env_id} has no vector observations, the wrong family (try CartPole-v1)")


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

    with bk.Run(__file__, args, device) as run:
        # env setup
        envs = make_envs(args.env_id, args.num_envs, run.videos)
        obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)

        # agent setup
        q_network = QNetwork(obs_dim, n_actions).to(device)
        optimizer = optim.RAdam(q_network.parameters(), lr=args.learning_rate)

        # storage setup
        obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
        dones = torch.zeros((args.num_steps, args.num_envs), device=device)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        next_obs, _ = envs.reset(seed=args.seed)
        next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
        next_done = torch.zeros(args.num_envs, device=device)
        # a stopped run goes on: the state Run writes at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(q_network=q_network, global_step=global_step, envs=(envs, next_obs, next_done),
                                 optimizer=optimizer)  # fmt: skip
        global_step, (_, next_obs, next_done) = run.resume("global_step", "envs")

        for iteration in run.progress(range(1, num_iterations + 1)):
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

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
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                # as CleanRL: a truncated episode (CartPole's 500-step limit) ends the bootstrap as a terminated one
                next_done = np.logical_or(terminations, truncations)
                rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
                next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
                next_done = torch.as_tensor(next_done, dtype=torch.float32, device=device)

                for episodic_return, episodic_length in bk.gym_episodes(infos):
                    run.episode(global_step, episodic_return, episodic_length)
            run.add_to_results(epsilon=epsilon)  # the results line reports the last one

            # Compute Q(lambda) targets
            with torch.no_grad():
                next_value = q_network(next_obs).max(dim=1).values
                returns = q_lambda_returns(rewards, values, dones, next_value, next_done, args.gamma, args.q_lambda)

            # flatten the batch
            b = dict(obs=obs.reshape(-1, obs_dim), actions=actions.reshape(-1), returns=returns.reshape(-1))

            # Optimizing the Q-network
            b_inds = np.arange(batch_size)
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, batch_size, minibatch_size):
                    mb_inds = b_inds[start : start + minibatch_size]
                    td_loss, q_values = update(q_network, optimizer, {k: v[mb_inds] for k, v in b.items()},
                                               args.max_grad_norm)  # fmt: skip

            # log point, as CleanRL's: the last minibatch's losses, one read an iteration; stop on a non-finite one
            logged = {"learning_rate": optimizer.param_groups[0]["lr"]}
            losses = run.check_finite(global_step, {"td_loss": td_loss, "q_values": q_values}, unchecked=logged)
            run.tick(global_step)
            run.report(global_step, {"losses/td_loss": losses["td_loss"], "losses/q_values": losses["q_values"],
                                     "charts/learning_rate": losses["learning_rate"]})  # fmt: skip

        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
