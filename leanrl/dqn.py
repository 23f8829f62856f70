"""DQN on classic-control envs (CleanRL's dqn.py, CartPole-v1): the eager PyTorch baseline.

Run: python leanrl/dqn.py --env-id CartPole-v1 --total-timesteps 500000
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
class Args(bk.StopAndResume):  # --resume, --checkpoint-every-min, --no-save-replay
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
    measure_burnin: int = 100
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    eval_epsilon: float = 0.05
    """the exploration rate of an evaluation (CleanRL's evaluation uses 0.05)"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium env with Discrete actions and vector observations)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments, rounded down to a multiple of num_envs"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 500
    """the number of vector-env steps between target network updates"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 10000
    """timestep to start learning"""
    train_frequency: int = 10
    """the number of vector-env steps between gradient steps"""


def make_envs(env_id, num_envs, video_dir=None):
    # gymnasium 1.x resets a finished env on the *next* step by default; here in the same step: the returned obs begins
    # the new episode, the true last obs is in infos["final_obs"], the episode's statistics in infos["final_info"]
    def make_env(video_dir=None):  # with a video_dir (--capture-video) the env renders and films its episodes there
        env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
        return gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RecordVideo(env, video_dir) if video_dir else env)

    envs = [lambda: make_env(video_dir)] + [make_env] * (num_envs - 1)  # env 0 alone is filmed
    return gym.vector.SyncVectorEnv(envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def real_next_obs(next_obs, infos):
    """The obs each env reached: where an episode ended, its true final obs, not the reset obs that begins the next."""
    real = next_obs.copy()
    if "final_obs" in infos:
        for i in np.flatnonzero(infos["_final_obs"]):
            real[i] = infos["final_obs"][i]
    return real


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions)
        )  # fmt: skip

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step t: linear from start_e (t = 0) to end_e (t = duration), then end_e."""
    return start_e + (end_e - start_e) * min(t / duration, 1.0)


def dqn_target(rewards, next_q_values, terminations, gamma):
    """CleanRL's TD target r + gamma * max_a Q_target(s', a), no bootstrap past a terminated s'; next_q_values: B, A."""
    target_max, _ = next_q_values.max(dim=1)
    return rewards + gamma * target_max * (1 - terminations)


def make_buffer(capacity, obs_dim):
    """The replay memory: preallocated numpy arrays written in place, one row per transition (as SB3's ReplayBuffer
    that CleanRL uses)."""
    return dict(
        obs=np.zeros((capacity, obs_dim), dtype=np.float32),
        actions=np.zeros(capacity, dtype=np.int64),
        rewards=np.zeros(capacity, dtype=np.float32),
        next_obs=np.zeros((capacity, obs_dim), dtype=np.float32),
        terminations=np.zeros(capacity, dtype=np.float32),
    )


def buffer_add(buffer, count, transition):
    """Write n transitions (a dict of arrays with n rows) into the ring after the `count` written so far;
    returns the new count. The oldest rows are overwritten once the buffer is full."""
    capacity, n = len(buffer["obs"]), len(transition["obs"])
    start = count % capacity
    rows = slice(start, start + n) if start + n <= capacity else np.arange(start, start + n) % capacity
    for key, value in transition.items():
        buffer[key][rows] = value
    return count + n


def buffer_sample(buffer, count, batch_size, device):
    """A batch of transitions drawn uniformly, with replacement, from the filled rows, as tensors on `device`."""
    idx = np.random.randint(min(count, len(buffer["obs"])), size=batch_size)
    return {key: torch.from_numpy(value[idx]).to(device) for key, value in buffer.items()}


def epsilon_greedy(q_network, obs, epsilon, n_actions, device):
    """One coin per env: a random action with probability epsilon, else the greedy one (numpy obs and actions)."""
    explore = [random.random() < epsilon for _ in range(len(obs))]
    if all(explore):
        return np.array([random.randrange(n_actions) for _ in explore])
    with torch.no_grad():
        greedy = q_network(torch.as_tensor(obs, dtype=torch.float32, device=device)).argmax(dim=1).tolist()
    return np.array([random.randrange(n_actions) if e else g for e, g in zip(explore, greedy)])


def update(q_network, target_network, optimizer, batch, gamma):
    """One gradient step on a batch (obs, actions, rewards, next_obs, terminations); returns (TD loss, mean Q)."""
    with torch.no_grad():
        td_target = dqn_target(batch["rewards"], target_network(batch["next_obs"]), batch["terminations"], gamma)
    old_val = q_network(batch["obs"]).gather(1, batch["actions"][:, None]).squeeze(1)
    loss = F.mse_loss(td_target, old_val)

    # optimize the model
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach(), old_val.mean().detach()


def train_step(q_network, target_network, optimizer, buffer, count, batch_size, gamma):
    """Sample a batch from the buffer and take one gradient step on it; returns (TD loss, mean Q)."""
    batch = buffer_sample(buffer, count, batch_size, next(q_network.parameters()).device)
    return update(q_network, target_network, optimizer, batch, gamma)


def update_target(target_network, q_network, tau):
    """target <- tau * online + (1 - tau) * target (tau = 1: a copy)."""
    for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
        target_network_param.data.copy_(tau * q_network_param.data + (1.0 - tau) * target_network_param.data)


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "total_timesteps", "buffer_size", "batch_size", "train_frequency")
    bk.check_flags(__file__, args, (*positive, "target_network_frequency"))
    if args.eval_checkpoint is not None:
        if not 0.0 <= args.eval_epsilon <= 1.0:
            bk.fail(__file__, f"--eval-epsilon must be in [0, 1], got {args.eval_epsilon}")
        return
    if args.learning_starts < 0:
        bk.fail(__file__, f"--learning-starts must be >= 0, got {args.learning_starts}")
    if args.batch_size > args.buffer_size:
        bk.fail(__file__, f"--batch-size {args.batch_size} is larger than the buffer, --buffer-size {args.buffer_size}")
    if args.num_envs > args.buffer_size:  # one step would overwrite its own rows
        bk.fail(__file__, f"--num-envs {args.num_envs} is larger than the buffer, --buffer-size {args.buffer_size}")
    if args.total_timesteps < args.num_envs:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is below one step of --num-envs {args.num_envs}")
    if args.learning_starts >= args.total_timesteps:
        bk.fail(__file__, f"--learning-starts {args.learning_starts} is not below --total-timesteps "
             f"{args.total_timesteps}: the run would never learn")  # fmt: skip
    if not 0.0 < args.exploration_fraction <= 1.0:
        bk.fail(__file__, f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    for flag in ("start_e", "end_e", "tau", "gamma"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            bk.fail(__file__, f"--{flag.replace('_', '-')} must be in [0, 1], got {getattr(args, flag)}")
    bk.check_gym_env(__file__, args.env_id, gym.spaces.Discrete, "CartPole-v1")
    with gym.make(args.env_id) as env:  # e.g. FrozenLake's Discrete states
        if not isinstance(env.observation_space, gym.spaces.Box):
            bk.fail(__file__, f"--env-id {args.env_id} has no vector observations, the wrong family (try CartPole-v1)")


def evaluate(args, device):
    """Play args.eval_episodes episodes epsilon-greedily (args.eval_epsilon) with a saved Q-network."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "q_network")
    args.env_id = checkpoint["args"]["env_id"]
    random.seed(args.seed)  # the exploration coins
    torch.manual_seed(args.seed)
    with bk.Run(__file__, args, device, burnin=0, mode="eval") as run:
        envs = make_envs(args.env_id, 1, run.videos)
        n_actions = int(envs.single_action_space.n)
        q_network = QNetwork(envs.single_observation_space.shape[0], n_actions).to(device)
        q_network.load_state_dict(checkpoint["q_network"])

        def act(obs):
            return epsilon_greedy(q_network, obs, args.eval_epsilon, n_actions, device)

        run.play(envs, act, lambda *step: [r for r, _ in bk.gym_episodes(step[-1])], args.eval_episodes, seed=args.seed)


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    num_iterations = args.total_timesteps // args.num_envs

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # steps/s leaves out the iterations before learning starts (those with i * num_envs <= learning_starts) and
    # --measure-burnin more
    burnin = args.learning_starts // args.num_envs + 1 + args.measure_burnin
    with bk.Run(__file__, args, device, burnin=burnin) as run:
        # env setup
        envs = make_envs(args.env_id, args.num_envs, run.videos)
        obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
        q_network = QNetwork(obs_dim, n_actions).to(device)
        optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, foreach=True)
        target_network = QNetwork(obs_dim, n_actions).to(device)
        target_network.load_state_dict(q_network.state_dict())

        buffer, count = make_buffer(args.buffer_size, obs_dim), 0

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, q_network=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step, stats = 0, ()  # stats: the last update's (TD loss, mean Q), none before learning starts
        obs, _ = envs.reset(seed=args.seed)
        # a stopped run goes on: the state Run writes at a step's end, restored by --resume (bookkeeping.py says how)
        run.state = lambda: dict(q_network=q_network, target_network=target_network, optimizer=optimizer, stats=stats,
                                 global_step=global_step, envs=(envs, obs), replay=(buffer, count))  # fmt: skip
        global_step, stats, (_, obs), (_, count) = run.resume("global_step", "stats", "envs", "replay")
        for iteration in run.progress(range(num_iterations)):
            # ALGO LOGIC: put action logic here
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            run.add_to_results(epsilon=epsilon)  # the results line reports the last one
            actions = epsilon_greedy(q_network, obs, epsilon, n_actions, device)

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            learning = global_step > args.learning_starts
            global_step += args.num_envs
            for episodic_return, episodic_length in bk.gym_episodes(infos):
                run.episode(global_step, episodic_return, episodic_length)

            # save data to the replay buffer: a truncated transition keeps its true last obs and bootstraps from it
            transition = dict(
                obs=obs,
                actions=actions,
                rewards=rewards,
                next_obs=real_next_obs(next_obs, infos),
                terminations=terminations,
            )
            count = buffer_add(buffer, count, transition)

            # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
            obs = next_obs

            # ALGO LOGIC: training.
            if learning:
                if iteration % args.train_frequency == 0:
                    stats = train_step(q_network, target_network, optimizer, buffer, count, args.batch_size, args.gamma)
                # update target network
                if iteration % args.target_network_frequency == 0:
                    update_target(target_network, q_network, args.tau)
            run.tick(global_step)

            # log point every 100 steps, as CleanRL: read the losses in one go, stop on a non-finite one, log them
            if iteration % 100 == 0 or iteration == num_iterations - 1:
                losses = run.check_finite(global_step, dict(zip(("td_loss", "q_values"), stats)))
                run.report(global_step, {f"losses/{k}": v for k, v in losses.items()})  # CleanRL's keys

        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
