"""DQN on Atari (envpool), the fast twin of dqn_atari_envpool.py: same algorithm, with the speed tricks.

The replay memory stores every 84x84 frame once (about 7 KB per transition, not 28 KB) and rebuilds the
4-frame stacks of obs and next obs by index.

Run: python leanrl/dqn_atari_envpool_torchcompile.py --env-id Breakout-v5 --compile --cudagraphs
"""

import json
import math
import os
import platform
import random
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tqdm
import tyro
from tensordict.nn import CudaGraphModule

SCRIPT = Path(__file__).name
STACK = 4  # frames per observation


@dataclass
class Args:
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
    """whether to save the model (and what evaluation needs) into the run folder at the end"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 3
    """iterations left out of the steps/s figure"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of full games to play with --eval-checkpoint"""
    eval_epsilon: float = 0.05
    """the exploration rate of the evaluation games (CleanRL's DQN evals use 0.05)"""
    compile: bool = False
    """whether to use torch.compile on the policy step and the update"""
    cudagraphs: bool = False
    """whether to capture the policy step, the replay write and the update as CUDA graphs (CudaGraphModule)"""

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions)"""
    buffer_device: str | None = None
    """where the replay memory lives: cpu or cuda (default: the training device where it fits)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    target_network_frequency: int = 1000
    """the timesteps it takes to update the target network (a multiple of --train-frequency)"""
    batch_size: int = 32
    """the batch size of sample from the reply memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 80000
    """timestep to start learning"""
    train_frequency: int = 4
    """the frequency of training"""


def fail(msg):
    """Bad input: one line on stderr, exit code 2, no traceback and no results line."""
    print(f"{SCRIPT}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def check_env_id(env_id):
    """Refuse anything but an envpool Atari game: image observations (4, 84, 84) uint8 and discrete actions."""
    if env_id not in envpool.list_all_envs():
        fail(f"--env-id {env_id!r} is not an envpool task (Atari games look like 'Breakout-v5')")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium's notes on other families' spaces
            spec = envpool.make_spec(env_id)
            obs_space, act_space = spec.observation_space, spec.action_space
        is_atari = obs_space.shape == (STACK, 84, 84) and obs_space.dtype == np.uint8
        is_atari = is_atari and isinstance(act_space, gym.spaces.Discrete)
    except Exception:
        is_atari = False
    if not is_atari:
        fail(f"--env-id {env_id!r} is not an Atari game; this script needs stacked 84x84 frames and discrete actions")


def first_train_step(learning_starts, train_frequency):
    """CleanRL trains at the steps s > learning_starts with s % train_frequency == 0; this is the first."""
    return (learning_starts // train_frequency + 1) * train_frequency


def available_memory(device):
    """Free bytes on the device: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def buffer_device(args, device):
    """--buffer-device, or by default the training device where the replay memory fits (2 GiB left over)."""
    need = frame_store_bytes(args.num_envs, args.buffer_size)
    if args.buffer_device is None:
        if device.type == "cuda" and need + 2 * 2**30 < available_memory(device):
            return device
        chosen = torch.device("cpu")
    else:
        chosen = torch.device(args.buffer_device)
    # trick: --cudagraphs samples the replay memory inside the captured update, and a CUDA graph reads GPU memory only
    if getattr(args, "cudagraphs", False) and chosen.type != "cuda":
        fail(f"--cudagraphs needs the replay memory on the GPU: --buffer-size {args.buffer_size} does not fit there")
    if need > available_memory(chosen):
        fail(
            f"--buffer-size {args.buffer_size} needs {need / 2**30:.1f} GiB of replay memory, "
            f"more than the {available_memory(chosen) / 2**30:.1f} GiB free on {chosen.type}"
        )
    return chosen


def check_args(args):
    """Every bad input is refused here, before any training."""
    if args.buffer_device not in (None, "cpu", "cuda"):
        fail(f"--buffer-device must be cpu or cuda, got {args.buffer_device!r}")
    if args.buffer_device == "cuda" and not (torch.cuda.is_available() and args.cuda):
        fail("--buffer-device cuda needs CUDA, and none is available")
    # trick: CUDA graphs need CUDA; refuse rather than fall back, which would put false numbers in the speed tables
    if args.cudagraphs and not (torch.cuda.is_available() and args.cuda):
        fail("--cudagraphs needs CUDA, and none is available")
    if args.cudagraphs and args.buffer_device == "cpu":
        fail("--cudagraphs samples inside the graph: it needs the replay memory on the GPU, not --buffer-device cpu")
    if args.eval_checkpoint is not None:
        if not Path(args.eval_checkpoint).is_file():
            fail(f"--eval-checkpoint {args.eval_checkpoint!r}: no such file")
        if args.eval_episodes <= 0:
            fail(f"--eval-episodes must be positive, got {args.eval_episodes}")
        return
    for flag in ("num_envs", "total_timesteps", "buffer_size", "batch_size", "train_frequency"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.target_network_frequency <= 0 or args.target_network_frequency % args.train_frequency:
        fail(
            f"--target-network-frequency must be a positive multiple of --train-frequency "
            f"({args.train_frequency}), got {args.target_network_frequency}"
        )
    for flag in ("learning_starts", "measure_burnin"):
        if getattr(args, flag) < 0:
            fail(f"--{flag.replace('_', '-')} must not be negative, got {getattr(args, flag)}")
    if not 0.0 < args.exploration_fraction <= 1.0:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs {args.num_envs})")
    if args.buffer_size < args.num_envs:
        fail(f"--buffer-size {args.buffer_size} is smaller than --num-envs {args.num_envs}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than the buffer (--buffer-size {args.buffer_size})")
    steps = args.total_timesteps // args.num_envs * args.num_envs
    if first_train_step(args.learning_starts, args.train_frequency) >= steps:
        fail(
            f"--learning-starts {args.learning_starts} leaves no training step in the budget of {steps} steps "
            f"(--total-timesteps)"
        )
    check_env_id(args.env_id)


def make_env(env_id, num_envs, seed):
    """envpool's Atari pipeline: 4 stacked 84x84 grey frames, frame skip 4, loss of life ends a training episode."""
    return envpool.make(env_id, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=seed)


def game_returns(episode_returns, raw_rewards, game_over):
    """Sum the raw (unclipped) rewards per env; return the totals of the games that just ended, reset those.

    episodic_life makes every lost life an episode for learning; a score is the return of a whole game.
    """
    episode_returns += raw_rewards
    finished = episode_returns[game_over].tolist()
    episode_returns[game_over] = 0.0
    return finished


def machine():
    """The hardware fields of the results line."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "torch": torch.__version__}


def append_line(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text + "\n")


def finite_or_none(value):
    """Strict JSON: a non-finite number becomes null (nested dicts and lists too)."""
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary(status, steps, sps, mean_return, episodes, results_file, run_dir):
    """The one line a run prints when it ends."""
    sps_text = f"{sps:.0f}" if sps else "n/a"
    ret_text = f"{mean_return:.1f}" if mean_return is not None else "n/a"
    return (
        f"{SCRIPT}: {status}: {steps} steps, {sps_text} steps/s, mean return {ret_text} over {episodes} episodes; "
        f"results: {results_file}, run folder: {run_dir}"
    )


class QNetwork(nn.Module):
    """The Nature CNN: three convolutions and a 512-unit layer, one Q-value per action."""

    def __init__(self, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(STACK, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, x):
        return self.network(x / 255.0)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at step t: linear from start_e to end_e over `duration` steps, then end_e."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def dqn_target(next_q_values, rewards, terminated, gamma):
    """CleanRL's DQN target r + gamma * max_a Q_target(s', a) * (1 - terminated); a truncated step bootstraps."""
    target_max, _ = next_q_values.max(dim=1)
    return rewards + gamma * target_max * (1 - terminated.float())


# ---------------------------------------------------------------- the frame store
# Per env a ring of `slots` single frames. The env's a-th observation (a = 0 is the first reset) is a stack whose
# newest frame sits in slot a % slots; first[a % slots] says that observation began a game (envpool's reset stack
# repeats that frame 4 times; a lost life does not restart the stack). The transition from observation a to a + 1
# keeps its action, clipped reward and terminated flag in slot a. envpool's step after any done one (a lost life, a
# game over, a truncation) is a reset step that ignores its action: transition a is valid unless transition a - 1
# was terminated (a lost life counts) or observation a + 1 began a game (the reset after a game over or truncation).
# With n frames written per env, the transitions a in [max(0, n - slots + 3), n - 2] have all their frames, and the
# step data of transition a - 1, in the ring: capacity = slots - 4 per env.


def new_frame_store(num_envs, capacity, device="cpu", frame_shape=(84, 84)):
    """Preallocate the replay memory of `capacity` transitions (capacity // num_envs per env) on `device`."""
    shape = (num_envs, capacity // num_envs + STACK)
    return dict(
        frames=torch.zeros(shape + tuple(frame_shape), dtype=torch.uint8, device=device),
        first=torch.zeros(shape, dtype=torch.bool, device=device),
        actions=torch.zeros(shape, dtype=torch.long, device=device),
        rewards=torch.zeros(shape, dtype=torch.float32, device=device),
        terminated=torch.zeros(shape, dtype=torch.bool, device=device),
        count=torch.zeros((), dtype=torch.long, device=device),  # trick: the write index lives on the device
    )


def frame_store_bytes(num_envs, capacity, frame_shape=(84, 84)):
    """What new_frame_store allocates, in bytes."""
    per_slot = math.prod(frame_shape) + 1 + 8 + 4 + 1  # frame, first, action, reward, terminated
    return num_envs * (capacity // num_envs + STACK) * per_slot + 8


def store_add(store, frames, first, actions, rewards, terminated):
    """Append one step of every env: the newest frame of each next obs, (num_envs, 84, 84) uint8; whether it
    began a game, (num_envs,) bool; the action (long), clipped reward (float32) and terminated flag (bool) of the
    step that led there, (num_envs,) each. All on the store's device.

    The very first call stores the reset frames (first all True); its step data (zeros) land in a slot that is
    written again before any transition reads it.
    """
    slots = store["frames"].shape[1]
    # trick: index_copy_ at a device index, no host sync (and no Python int: one graph for every step)
    previous, slot = ((store["count"] - 1) % slots).view(1), (store["count"] % slots).view(1)
    store["actions"].index_copy_(1, previous, actions[:, None])
    store["rewards"].index_copy_(1, previous, rewards[:, None])
    store["terminated"].index_copy_(1, previous, terminated[:, None])
    store["frames"].index_copy_(1, slot, frames[:, None])
    store["first"].index_copy_(1, slot, first[:, None])
    store["count"] += 1


def stack_frames(store, env, pos):
    """The observation stacks (B, 4, 84, 84) whose newest frames are the env's pos-th frames (env, pos: (B,)).

    Going back from pos, a frame that began a game is repeated in place of the older ones, as envpool does.
    """
    slots = store["frames"].shape[1]
    index = [pos]
    for _ in range(STACK - 1):
        newer = index[0]
        index.insert(0, torch.where(store["first"][env, newer % slots], newer, newer - 1))
    return store["frames"][env[:, None], torch.stack(index, dim=1) % slots]


def sample_indices(store, batch_size, tries=8):
    """Uniform (env, pos) of valid transitions, never one whose frames were overwritten or are not written yet.

    Each draw takes the first of `tries` candidates that is not the reset step after a lost life or a game over
    (those are one in a life's length). If all `tries` miss (probability below 1e-10 in Atari), the draw moves to a
    neighbour: the first transition after it, or the done one before it (two reset steps never follow each other).
    """
    num_envs, slots = store["first"].shape
    n = store["count"]
    low = (n - slots + STACK - 1).clamp(min=0)
    device = store["first"].device
    env = torch.randint(num_envs, (tries, batch_size), device=device)
    # trick: the range's bounds stay on the device (a modulo of wide random integers: no host sync, no bias that
    # matters at 2**62 / 1e6)
    pos = low + torch.randint(2**62, (tries, batch_size), device=device) % (n - 1 - low)
    valid = ~(store["first"][env, (pos + 1) % slots] | store["terminated"][env, (pos - 1) % slots])
    pick = valid.int().argmax(dim=0, keepdim=True)  # the first valid candidate
    env, pos, missed = env.gather(0, pick)[0], pos.gather(0, pick)[0], ~valid.any(dim=0)
    neighbour = torch.where(pos < n - 2, pos + 1, (pos - 1).clamp(min=low))
    return env, torch.where(missed, neighbour, pos)


def sample(store, batch_size):
    """A batch of transitions with their rebuilt obs and next-obs stacks."""
    slots = store["frames"].shape[1]
    env, pos = sample_indices(store, batch_size)
    return dict(
        obs=stack_frames(store, env, pos),
        actions=store["actions"][env, pos % slots],
        rewards=store["rewards"][env, pos % slots],
        next_obs=stack_frames(store, env, pos + 1),
        terminated=store["terminated"][env, pos % slots],
    )


def learn(q_network, target_network, optimizer, batch, gamma):
    """One gradient step on the TD error of a batch; returns the detached loss and mean Q-value."""
    with torch.no_grad():
        td_target = dqn_target(target_network(batch["next_obs"]), batch["rewards"], batch["terminated"], gamma)
    old_val = q_network(batch["obs"]).gather(1, batch["actions"][:, None]).squeeze(1)
    loss = F.mse_loss(td_target, old_val)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return dict(td_loss=loss.detach(), q_values=old_val.detach().mean())


def update(q_network, target_network, optimizer, store, batch_size, gamma, copy_target):
    """Sample, learn, and copy the Q-network to the target network where copy_target (a bool tensor) is set."""
    # trick: the whole update is one function of device tensors, so that it compiles and is captured whole; the
    # periodic target copy is a masked copy in the graph (copy_target lives on the training device)
    batch = {key: value.to(copy_target.device, non_blocking=True) for key, value in sample(store, batch_size).items()}
    out = learn(q_network, target_network, optimizer, batch, gamma)
    with torch.no_grad():
        for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
            target_network_param.copy_(torch.where(copy_target, q_network_param, target_network_param))
    return out


def act(q_network, obs, epsilon):
    """Epsilon-greedy actions of every env, all on the device (epsilon: a 0-d tensor)."""
    # trick: no host branch on the random draw: both choices are computed and one is kept per env
    with torch.no_grad():
        q_values = q_network(obs)
    explore = torch.rand(len(obs), device=obs.device) < epsilon
    random_actions = torch.randint(q_values.shape[1], (len(obs),), device=obs.device)
    return torch.where(explore, random_actions, q_values.argmax(dim=1))


class Diverged(Exception):
    pass


def first_non_finite(losses):
    return next(((name, value) for name, value in losses.items() if not math.isfinite(value)), None)


def evaluate(args, device):
    """Play --eval-episodes full games with a checkpoint, epsilon-greedy at --eval-epsilon as CleanRL's evals do."""
    checkpoint = torch.load(args.eval_checkpoint, map_location=device)
    train_args = checkpoint["args"]
    envs = make_env(train_args["env_id"], train_args["num_envs"], args.seed)
    q_network = QNetwork(envs.action_space.n).to(device)
    q_network.load_state_dict(checkpoint["model"])
    q_network.eval()
    returns, steps = [], 0
    start = time.time()
    obs = envs.reset()[0]
    episode_returns = np.zeros(train_args["num_envs"])
    while len(returns) < args.eval_episodes:
        with torch.no_grad():
            actions = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
        explore = np.random.random(len(actions)) < args.eval_epsilon
        actions = np.where(explore, np.random.randint(envs.action_space.n, size=len(actions)), actions)
        obs, _, _, truncations, info = envs.step(actions)
        steps += train_args["num_envs"]
        returns += game_returns(episode_returns, info["reward"], info["terminated"].astype(bool) | truncations)
    envs.close()
    returns = returns[: args.eval_episodes]
    wall_s = time.time() - start
    print(f"{SCRIPT}: {len(returns)} games, mean return {np.mean(returns):.2f}")
    return train_args["env_id"], steps, steps / max(wall_s, 1e-9), returns


def main(args):
    check_args(args)
    start_time = time.time()
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(start_time)}"
    run_dir = Path(args.results_file).parent / run_name

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    line = dict(
        script=SCRIPT,
        env_id=args.env_id,
        seed=args.seed,
        compile=getattr(args, "compile", False),
        cudagraphs=getattr(args, "cudagraphs", False),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **machine(),
        run_name=run_name,
        total_timesteps=args.total_timesteps,
        mode="train",
    )

    def finish(status, steps, sps, returns, losses, message=None, folder=run_dir):
        mean_return = float(np.mean(returns[-100:])) if returns else None
        line.update(steps=steps, sps=sps, wall_s=time.time() - start_time, mean_return=mean_return)
        line.update(episodes=len(returns), status=status, losses=losses, message=message)
        line.update(time=datetime.now(UTC).isoformat())
        append_line(args.results_file, json.dumps(finite_or_none(line), allow_nan=False))
        print(summary(status, steps, sps, mean_return, len(returns), args.results_file, folder), flush=True)

    if args.eval_checkpoint is not None:
        line["mode"] = "eval"
        folder = Path(args.eval_checkpoint).parent
        try:
            line["env_id"], steps, sps, returns = evaluate(args, device)
        except KeyboardInterrupt:
            finish("interrupted", 0, 0.0, [], {}, "interrupted", folder)
            sys.exit(130)
        except Exception as err:
            finish("error", 0, 0.0, [], {}, f"{type(err).__name__}: {err}", folder)
            raise
        finish("ok", steps, sps, returns, {}, folder=folder)
        return

    store_device = buffer_device(args, device)
    line["buffer_device"] = store_device.type
    num_iterations = args.total_timesteps // args.num_envs
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=run_name,
            sync_tensorboard=False,
        )

    global_step, episodic_returns, losses, out = 0, [], {}, None
    mark = (0, time.time())  # (steps, time) at the end of burn-in: steps/s counts from there
    sps = lambda: (global_step - mark[0]) / max(time.time() - mark[1], 1e-9) if global_step > mark[0] else 0.0

    def check(out):
        """The losses come to the host every 100 iterations; a non-finite one stops the run."""
        losses.update(zip(out, torch.stack(list(out.values())).tolist()))
        bad = first_non_finite(losses)
        if bad:
            raise Diverged(f"loss diverged at step {global_step}: {bad[0]}={bad[1]}")

    try:
        # env setup
        envs = make_env(args.env_id, args.num_envs, args.seed)
        n_actions = envs.action_space.n
        q_network = QNetwork(n_actions).to(device)
        # trick: fused Adam updates every parameter in one kernel (and spares torch.compile a kernel per parameter);
        # capturable keeps the step counts on the GPU, so a step never syncs and can be captured
        # (torch.compile leaves the fused kernel to eager, so it needs the flag too)
        capturable = device.type == "cuda"
        optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True, capturable=capturable)
        target_network = QNetwork(n_actions).to(device)
        target_network.load_state_dict(q_network.state_dict())

        store = new_frame_store(args.num_envs, args.buffer_size, store_device)
        line["buffer_bytes"] = sum(t.nbytes for t in store.values())
        # trick: the policy step, the replay write and the update as functions of device tensors, so that each
        # compiles and is captured whole; epsilon and the target-copy flag are tensors: no recompile as they change
        policy, add = partial(act, q_network), partial(store_add, store)
        update_step = partial(update, q_network, target_network, optimizer, store, args.batch_size, args.gamma)
        epsilon_t = torch.tensor(args.start_e, device=device)
        copy_yes, copy_no = torch.tensor(True, device=device), torch.tensor(False, device=device)
        if args.compile:  # trick: torch.compile fuses the small ops of the policy step and of the update
            policy = torch.compile(policy, fullgraph=True)
            update_step = torch.compile(update_step)
        if args.cudagraphs:
            # trick: replay each as one CUDA graph: inputs are copied into static buffers, outputs cloned out; the
            # replay memory is written in place (its tensors are the graphs' own); the warm-up calls compile
            policy = CudaGraphModule(policy, warmup=3)
            add = CudaGraphModule(add, warmup=3)
            update_step = CudaGraphModule(update_step, warmup=3)

        run_dir.mkdir(parents=True, exist_ok=True)
        curve = run_dir / "returns.csv"
        curve.write_text("step,wall_s,return\n")
        running_returns = np.zeros(args.num_envs)
        recent = deque(maxlen=100)
        zeros = np.zeros(args.num_envs)

        # TRY NOT TO MODIFY: start the game
        obs, _ = envs.reset()
        # trick: non_blocking host-to-device copies; the obs stack goes to the device once, for the policy and the store
        to_device = lambda x, dtype=None, device=device: torch.as_tensor(x, dtype=dtype).to(device, non_blocking=True)
        to_store = partial(to_device, device=store_device)
        obs = to_device(obs)
        no_step = (to_store(zeros, torch.long), to_store(zeros, torch.float32), to_store(zeros, torch.bool))
        store_add(store, obs[:, -1].to(store_device), to_store(zeros == 0), *no_step)
        next_check, mark = 0, (0, time.time())
        pbar = tqdm.tqdm(range(num_iterations), desc=SCRIPT, mininterval=2.0)
        for iteration in pbar:
            # ALGO LOGIC: put action logic here
            duration = args.exploration_fraction * args.total_timesteps
            epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
            epsilon_t.fill_(epsilon)  # trick: in place, the graphs read this tensor
            actions = policy(obs, epsilon_t)

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, rewards, terminations, truncations, info = envs.step(actions.cpu().numpy())
            game_over = info["terminated"].astype(bool) | truncations
            for episodic_return in game_returns(running_returns, info["reward"], game_over):
                episodic_returns.append(episodic_return)
                recent.append(episodic_return)
                append_line(curve, f"{global_step + args.num_envs},{time.time() - start_time:.3f},{episodic_return}")
                if args.track:
                    wandb.log({"charts/episodic_return": episodic_return, "charts/epsilon": epsilon}, global_step)

            # save data to the replay memory: the newest frame once, and whether it began a game (envpool restarts
            # the stack only there, not after a lost life). The sampler skips envpool's reset step after any done
            # step, whose action is ignored: after a lost life by the terminated flag stored before it
            obs = to_device(next_obs)
            first = info["elapsed_step"] == 0
            step = (actions.to(store_device), to_store(rewards, torch.float32), to_store(terminations))
            add(obs[:, -1].to(store_device), to_store(first), *step)

            # ALGO LOGIC: training, at the steps s > learning_starts with s % train_frequency == 0 (CleanRL's
            # schedule; with several envs, those of the steps this iteration covers)
            covered = range(global_step, global_step + args.num_envs)
            train_steps = [s for s in covered if s > args.learning_starts and s % args.train_frequency == 0]
            # update the target network (its steps are training steps: a multiple of --train-frequency), after the
            # iteration's last gradient step
            copy = any(s % args.target_network_frequency == 0 for s in train_steps)
            for i in range(len(train_steps)):
                out = update_step(copy_yes if copy and i == len(train_steps) - 1 else copy_no)
            global_step += args.num_envs

            if train_steps and iteration >= next_check:
                next_check = iteration + 100
                check(out)  # trick: the losses come to the host every 100 iterations only
                if args.track:
                    logs = {f"losses/{name}": value for name, value in losses.items()}
                    wandb.log({"charts/SPS": sps(), "charts/epsilon": epsilon, **logs}, step=global_step)
            if iteration + 1 == args.measure_burnin and iteration + 1 < num_iterations:
                mark = (global_step, time.time())
            if iteration % 100 == 0:
                mean_return = np.mean(recent) if recent else float("nan")
                pbar.set_postfix(sps=f"{sps():.0f}", ret=f"{mean_return:.1f}", refresh=False)
        if out is not None:
            check(out)
        envs.close()
        if args.save_model:
            model_path = run_dir / f"{args.exp_name}.pt"
            tmp_path = model_path.with_suffix(".pt.tmp")
            torch.save({"args": asdict(args), "model": q_network.state_dict()}, tmp_path)
            os.replace(tmp_path, model_path)  # atomic: a reader never sees half a checkpoint
            print(f"{SCRIPT}: model saved to {model_path}")
    except (KeyboardInterrupt, Exception) as err:
        status = {KeyboardInterrupt: "interrupted", Diverged: "diverged"}.get(type(err), "error")
        message = str(err) or type(err).__name__
        finish(status, global_step, sps(), episodic_returns, losses, message)
        if status == "interrupted":
            sys.exit(130)
        if status == "diverged":
            print(f"{SCRIPT}: {message}", file=sys.stderr)
            sys.exit(1)
        raise

    finish("ok", global_step, sps(), episodic_returns, losses)


if __name__ == "__main__":
    main(tyro.cli(Args))
