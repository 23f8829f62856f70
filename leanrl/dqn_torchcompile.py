"""DQN on classic-control envs (CleanRL's dqn.py, CartPole-v1): the fast twin, with LeanRL's speed tricks.

Run: python leanrl/dqn_torchcompile.py --env-id CartPole-v1 --compile --cudagraphs
"""

import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tqdm
import tyro
from tensordict.nn import CudaGraphModule


@dataclass
class Args:
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
    save_model: bool = False
    """whether to save the Q-network at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 100
    """vector-env steps after --learning-starts left out of the steps/s figure (the update compiles in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    eval_epsilon: float = 0.05
    """the exploration rate of an evaluation (CleanRL's evaluation uses 0.05)"""
    compile: bool = False
    """whether to use torch.compile on the policy step, the buffer write and the update"""
    cudagraphs: bool = False
    """whether to use CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"
    """the id of the environment (a gymnasium env with Discrete actions and vector observations)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
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


class Diverged(Exception):
    """A loss became NaN or infinite."""


def fail(msg):
    """Bad input: one line on stderr naming the flag, exit code 2, no traceback."""
    print(f"{Path(__file__).name}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def looks_like_atari(env_id):
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id or env_id.endswith("-v5")


def check_args(args):
    """Reject bad input before any training (cheap env construction at most)."""
    if getattr(args, "cudagraphs", False) and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs CUDA, and none is available")
    if args.measure_burnin < 0:
        fail(f"--measure-burnin must be >= 0, got {args.measure_burnin}")
    if args.eval_checkpoint is not None:
        if not Path(args.eval_checkpoint).is_file():
            fail(f"--eval-checkpoint {args.eval_checkpoint}: no such file")
        if args.eval_episodes <= 0:
            fail(f"--eval-episodes must be positive, got {args.eval_episodes}")
        if not 0.0 <= args.eval_epsilon <= 1.0:
            fail(f"--eval-epsilon must be in [0, 1], got {args.eval_epsilon}")
        return
    for flag in ("num_envs", "total_timesteps", "buffer_size", "batch_size", "train_frequency"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.target_network_frequency <= 0:
        fail(f"--target-network-frequency must be positive, got {args.target_network_frequency}")
    if args.learning_starts < 0:
        fail(f"--learning-starts must be >= 0, got {args.learning_starts}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than the buffer (--buffer-size {args.buffer_size})")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one step of --num-envs {args.num_envs} envs")
    if args.learning_starts >= args.total_timesteps:
        fail(
            f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}: "
            "the run would never learn"
        )
    if not 0.0 < args.exploration_fraction <= 1.0:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    for flag in ("start_e", "end_e", "tau", "gamma"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            fail(f"--{flag.replace('_', '-')} must be in [0, 1], got {getattr(args, flag)}")
    try:
        gym.spec(args.env_id)
    except gym.error.Error:
        if looks_like_atari(args.env_id):
            fail(
                f"--env-id {args.env_id} looks like an Atari id, the wrong family for this script: "
                "use dqn_atari_envpool.py, or a classic-control env such as CartPole-v1"
            )
        fail(f"--env-id {args.env_id} is not a registered gymnasium env (try CartPole-v1)")
    try:
        env = gym.make(args.env_id)
    except Exception as err:
        fail(f"--env-id {args.env_id} could not be made: {type(err).__name__}: {err}".splitlines()[0])
    action_space, observation_space = env.action_space, env.observation_space
    env.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"--env-id {args.env_id} has a {type(action_space).__name__} action space, the wrong family for this "
            "script: it needs Discrete actions, such as CartPole-v1's"
        )
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        shape = getattr(observation_space, "shape", None)
        fail(
            f"--env-id {args.env_id} has {type(observation_space).__name__} {shape} observations, the wrong family "
            "for this script: its MLP needs flat vector (1-D Box) observations, such as CartPole-v1's"
        )


def make_envs(env_id, num_envs, **make_kwargs):
    # gymnasium 1.x resets a finished env on the *next* step by default (and that step is no transition). Here the
    # reset happens in the same step: the returned obs begins the new episode, the true last obs is in
    # infos["final_obs"], the episode's statistics in infos["final_info"]
    return gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, **make_kwargs)) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def real_next_obs(next_obs, infos):
    """The obs each env reached in this step: the true final obs where an episode ended (terminated or truncated),
    not the reset obs that begins the next one. A truncated transition bootstraps from it."""
    real = next_obs.copy()
    if "final_obs" in infos:
        for i in np.flatnonzero(infos["_final_obs"]):
            real[i] = infos["final_obs"][i]
    return real


def finished_episodes(infos):
    """(episodic return, length) of each episode that ended in this vector step."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    ended = np.flatnonzero(final["_episode"])
    return [(float(final["episode"]["r"][i]), int(final["episode"]["l"][i])) for i in ended]


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, n_actions),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    """Epsilon at env step t: linear from start_e (t = 0) to end_e (t = duration), then end_e."""
    return start_e + (end_e - start_e) * min(t / duration, 1.0)


def dqn_target(rewards, next_q_values, terminations, gamma):
    """CleanRL's TD target r + gamma * max_a Q_target(s', a), with no bootstrap from a terminated s'.

    next_q_values: (B, A) target-network values of the (true) next obs; rewards, terminations: (B,)."""
    target_max, _ = next_q_values.max(dim=1)
    return rewards + gamma * target_max * (1 - terminations)


def make_buffer(capacity, obs_dim, device):
    """The replay memory: preallocated tensors, one row per transition."""
    return dict(
        obs=torch.zeros(capacity, obs_dim, device=device),
        actions=torch.zeros(capacity, dtype=torch.long, device=device),
        rewards=torch.zeros(capacity, device=device),
        next_obs=torch.zeros(capacity, obs_dim, device=device),
        terminations=torch.zeros(capacity, device=device),
    )


def buffer_add(buffer, count, transition):
    """Write n transitions (a dict of tensors with n rows) into the ring after the `count` written so far;
    returns the new count. The oldest rows are overwritten once the buffer is full."""
    capacity = buffer["obs"].shape[0]
    n = transition["obs"].shape[0]
    # trick: the write position is a device tensor (count, a 0-d int64), so a write needs nothing from the host and
    # the same compiled code (and CUDA graph) serves every step; the function returns the new count
    rows = (count + torch.arange(n, device=buffer["obs"].device)) % capacity
    for key, value in transition.items():
        buffer[key][rows] = value
    return count + n


def buffer_sample(buffer, count, batch_size, generator=None):
    """A batch of transitions drawn uniformly, with replacement, from the filled rows."""
    size = count.clamp(max=buffer["obs"].shape[0])
    # trick: torch.randint needs its bound on the host (a sync); scale uniform draws by the device-side size instead
    # (the clamp guards float32 rounding up to `size` itself)
    u = torch.rand(batch_size, device=buffer["obs"].device, generator=generator)
    idx = torch.minimum((u * size).long(), size - 1)
    return {key: value[idx] for key, value in buffer.items()}


def epsilon_greedy(q_network, obs, epsilon):
    """One coin per env: a random action with probability epsilon, else the greedy one (device actions)."""
    # trick: coins and random actions are drawn on the device and merged with torch.where, so there is no host branch
    # on the draw: one graph (fullgraph=True), one CUDA graph. epsilon is a device tensor, so a new value recompiles
    # nothing; the Q-values are computed every step (cheaper than a branch)
    q_values = q_network(obs)
    explore = torch.rand(obs.shape[0], device=obs.device) < epsilon
    actions = torch.randint(q_values.shape[1], (obs.shape[0],), device=obs.device)
    return torch.where(explore, actions, q_values.argmax(dim=1))


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
    return update(q_network, target_network, optimizer, buffer_sample(buffer, count, batch_size), gamma)


def update_target(target_network, q_network, tau):
    """target <- tau * online + (1 - tau) * target (tau = 1: a copy)."""
    # trick: one fused multi-tensor lerp, in place (a CUDA graph of the update reads these very tensors). A separate
    # small compiled function called every --target-network-frequency steps, rather than a masked lerp inside
    # the update: no work on the other 49 updates out of 50. lerp with weight 1 returns the online values exactly
    with torch.no_grad():
        torch._foreach_lerp_(list(target_network.parameters()), list(q_network.parameters()), tau)


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sps_since(mark, steps):
    """Env steps/s since mark = (wall time, steps done then); None when no step was done since."""
    elapsed = time.time() - mark[0]
    return (steps - mark[1]) / elapsed if steps > mark[1] and elapsed > 0 else None


def finite_or_none(x):
    """Strict JSON: a non-finite float becomes null (also inside dicts and lists)."""
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite_or_none(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_results(args, device, **fields):
    """Append the run's one JSON line to args.results_file."""
    line = dict(
        script=Path(__file__).name,
        env_id=args.env_id,
        seed=args.seed,
        compile=getattr(args, "compile", False),
        cudagraphs=getattr(args, "cudagraphs", False),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        cpu=cpu_name(),
        cpu_count=os.cpu_count(),
        torch=torch.__version__,
        total_timesteps=args.total_timesteps,
        time=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    line.update(fields)
    path = Path(args.results_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(finite_or_none(line), allow_nan=False) + "\n")


def summary_line(status, steps, sps, mean_return, episodes, results_file, run_dir):
    """The one line a run prints when it ends."""
    sps_text = f"{sps:.0f}" if sps is not None and math.isfinite(sps) else "n/a"
    ret_text = f"{mean_return:.1f}" if mean_return is not None and math.isfinite(mean_return) else "n/a"
    return (
        f"{Path(__file__).name}: {status}: {steps} steps, {sps_text} steps/s, mean return {ret_text} over "
        f"{episodes} episodes; results: {results_file}, run folder: {run_dir}"
    )


def save_checkpoint(path, args, q_network):
    """The Q-network's weights and the run's arguments, written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"args": asdict(args), "model": q_network.state_dict()}, tmp)
    os.replace(tmp, path)


def evaluate(args, device):
    """Play args.eval_episodes episodes epsilon-greedily (args.eval_epsilon) with a saved Q-network."""
    try:
        checkpoint = torch.load(args.eval_checkpoint, map_location=device, weights_only=True)
        train_args, state = checkpoint["args"], checkpoint["model"]
        obs_dim, n_actions = state["network.0.weight"].shape[1], state["network.4.weight"].shape[0]
    except Exception as err:
        fail(f"--eval-checkpoint {args.eval_checkpoint} is not a checkpoint of this script ({type(err).__name__})")
    args.env_id, args.total_timesteps = train_args["env_id"], 0
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    envs = make_envs(args.env_id, 1)
    q_network = QNetwork(obs_dim, n_actions).to(device)
    q_network.load_state_dict(state)
    run_name = f"{args.env_id}__{args.exp_name}__eval__{args.seed}__{int(time.time())}"
    run_dir = Path(args.results_file).parent / run_name
    run_dir.mkdir(parents=True, exist_ok=True)

    start_time, steps, returns = time.time(), 0, []
    with (run_dir / "returns.csv").open("w") as returns_csv:
        returns_csv.write("step,wall_s,return\n")
        obs, _ = envs.reset(seed=args.seed)
        while len(returns) < args.eval_episodes:
            obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device)
            with torch.no_grad():
                actions = epsilon_greedy(q_network, obs_t, torch.tensor(args.eval_epsilon, device=device))
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
            steps += 1
            for episodic_return, _ in finished_episodes(infos):
                returns.append(episodic_return)
                returns_csv.write(f"{steps},{time.time() - start_time:.3f},{episodic_return}\n")
    envs.close()
    wall, mean_return = time.time() - start_time, float(np.mean(returns))
    write_results(
        args, device, run_name=run_name, mode="eval", checkpoint=args.eval_checkpoint, steps=steps,
        sps=steps / wall, wall_s=wall, mean_return=mean_return, episodes=len(returns),
        status="ok", losses={}, message=None,
    )  # fmt: skip
    print(summary_line("ok", steps, steps / wall, mean_return, len(returns), args.results_file, run_dir))


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    num_iterations = args.total_timesteps // args.num_envs
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = Path(args.results_file).parent / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=run_name,
            sync_tensorboard=False,
        )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # trick: TF32 matmuls on GPUs that have them
    torch.set_float32_matmul_precision("high")

    # env setup
    envs = make_envs(args.env_id, args.num_envs)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    q_network = QNetwork(obs_dim, n_actions).to(device)
    # trick: the lr is a device tensor (a new value recompiles nothing); fused Adam updates every parameter in one
    # CUDA kernel (on a CPU the default foreach Adam is faster); capturable keeps its step count on the GPU, so a
    # step never syncs and can be captured (torch.compile arranges this itself)
    optimizer = optim.Adam(
        q_network.parameters(),
        lr=torch.tensor(args.learning_rate, device=device),
        fused=device.type == "cuda",
        capturable=device.type == "cuda" and not args.compile,
    )
    target_network = QNetwork(obs_dim, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())

    buffer = make_buffer(args.buffer_size, obs_dim, device)
    count = torch.zeros((), dtype=torch.long, device=device)

    # trick: torch.compile fuses the small ops of the policy step, the buffer write and the update, and removes most
    # of their Python overhead; CudaGraphModule records each as a CUDA graph and replays it with one launch (inputs
    # copied into static buffers, outputs cloned out). The functions are compiled before the modules, optimizer,
    # buffer and non-tensor arguments are bound with partial: each keeps its own compiled code (compiled partials
    # would share one code cache and check each other's guards), and a CUDA graph takes only tensors and reads the
    # bound tensors in place. The warmup calls run before the capture: the compiler has finished and Adam has made
    # its state by then.
    policy_fn, add_fn, train_fn, target_fn = epsilon_greedy, buffer_add, train_step, update_target
    if args.compile:
        train_fn, target_fn = torch.compile(train_fn), torch.compile(target_fn, fullgraph=True)
    if args.compile and device.type == "cuda":
        # trick: the per-env-step functions only on CUDA, where they fuse kernels and feed the CUDA graphs. On a CPU
        # a compiled call's fixed cost (guards, wrappers: ~100 us on a loaded 2-core EPYC) exceeds what it saves on
        # a batch-1 MLP forward or a one-row buffer write, so there they run eagerly
        policy_fn, add_fn = torch.compile(policy_fn, fullgraph=True), torch.compile(add_fn, fullgraph=True)
    policy, add_fn = partial(policy_fn, q_network), partial(add_fn, buffer)
    train_fn = partial(
        train_fn, q_network, target_network, optimizer, buffer, batch_size=args.batch_size, gamma=args.gamma
    )
    target_fn = partial(target_fn, target_network, q_network, args.tau)
    if args.cudagraphs:
        policy = CudaGraphModule(policy, warmup=5)
        add_fn = CudaGraphModule(add_fn, warmup=5)
        train_fn = CudaGraphModule(train_fn, warmup=5)
        # trick: the target update is captured too, as a graph of its own (it runs apart from the update: see
        # update_target; its steps need not be training steps)
        target_fn = CudaGraphModule(target_fn, warmup=2)
    # no-ops (the target equals the online network yet) that compile the target update, and with --cudagraphs warm it
    # up twice and capture it, before the clock runs
    for _ in range(3 if args.cudagraphs else 1):
        target_fn()
    epsilon_t = torch.ones((), device=device)

    # run bookkeeping: the results line is written in `finally`, also when the run fails
    start_time = time.time()
    global_step, episode_returns, losses, stats, epsilon = 0, [], {}, None, args.start_e
    burnin_mark = None  # (wall time, steps) where the steps/s figure starts: after the burn-in
    status, message = "ok", None
    returns_csv = (run_dir / "returns.csv").open("w")
    returns_csv.write("step,wall_s,return\n")
    try:
        obs, _ = envs.reset(seed=args.seed)
        obs = torch.as_tensor(obs, dtype=torch.float32, device=device)
        pbar = tqdm.trange(num_iterations, desc=Path(__file__).stem, unit="it", mininterval=1.0)
        for iteration in pbar:
            # ALGO LOGIC: put action logic here
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            with torch.no_grad():
                actions = policy(obs, epsilon_t.fill_(epsilon))  # trick: epsilon written in place

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, rewards, terminations, truncations, infos = envs.step(actions.cpu().numpy())
            learning = global_step > args.learning_starts
            global_step += args.num_envs
            for episodic_return, episodic_length in finished_episodes(infos):
                episode_returns.append(episodic_return)
                returns_csv.write(f"{global_step},{time.time() - start_time:.3f},{episodic_return}\n")
                if args.track:
                    wandb.log(
                        {
                            "charts/episodic_return": episodic_return,
                            "charts/episodic_length": episodic_length,
                            "charts/epsilon": epsilon,
                        },
                        step=global_step,
                    )

            # save data to the replay buffer: a truncated episode's transition keeps its true last obs (and
            # bootstraps from it); only a terminated one stops the bootstrap
            # trick: the actions never leave the device for the buffer; non_blocking host-to-device copies, and the
            # next obs uploaded once (a second upload only where an episode ended)
            next_obs_t = torch.as_tensor(next_obs, dtype=torch.float32).to(device, non_blocking=True)
            real_next_obs_t = next_obs_t
            if "final_obs" in infos:
                real_next_obs_t = torch.as_tensor(real_next_obs(next_obs, infos), dtype=torch.float32).to(device)
            transition = dict(
                obs=obs,
                actions=actions,
                rewards=torch.as_tensor(rewards, dtype=torch.float32).to(device, non_blocking=True),
                next_obs=real_next_obs_t,
                terminations=torch.as_tensor(terminations, dtype=torch.float32).to(device, non_blocking=True),
            )
            count = add_fn(count, transition)

            # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
            obs = next_obs_t

            # ALGO LOGIC: training.
            if learning:
                if iteration % args.train_frequency == 0:
                    stats = train_fn(count)  # trick: no .item() here: the losses stay on the device until a log point
                # update target network
                if iteration % args.target_network_frequency == 0:
                    target_fn()
                if burnin_mark is None and global_step > args.learning_starts + args.measure_burnin * args.num_envs:
                    burnin_mark = (time.time(), global_step)

            # log point: read the losses every 100 steps, and stop on a non-finite one
            if iteration % 100 == 0 or iteration == num_iterations - 1:
                if stats is not None:
                    losses = {"td_loss": float(stats[0]), "q_values": float(stats[1])}
                    for name, value in losses.items():
                        if not math.isfinite(value):
                            raise Diverged(f"loss diverged at step {global_step}: {name}={value}")
                if iteration % 1000 == 0:
                    sps = sps_since(burnin_mark or (start_time, 0), global_step)
                    recent = np.mean(episode_returns[-100:]) if episode_returns else float("nan")
                    pbar.set_postfix(sps=f"{sps or 0:.0f}", ret=f"{recent:.1f}")
                    if args.track:
                        wandb.log(
                            {"charts/SPS": sps or 0.0, **{f"losses/{k}": v for k, v in losses.items()}},
                            step=global_step,
                        )

        if args.save_model:
            model_path = run_dir / f"{args.exp_name}.pt"
            save_checkpoint(model_path, args, q_network)
            print(f"model saved to {model_path}")
    except KeyboardInterrupt:
        status, message = "interrupted", "interrupted by the user"
    except Diverged as err:
        status, message = "diverged", str(err)
        print(f"{Path(__file__).name}: {message}", file=sys.stderr)
    except Exception as err:
        status, message = "error", f"{type(err).__name__}: {err}"
        raise
    finally:
        returns_csv.close()
        envs.close()
        # a run that ends inside its burn-in is measured from its start
        sps = sps_since(burnin_mark if burnin_mark and burnin_mark[1] < global_step else (start_time, 0), global_step)
        mean_return = float(np.mean(episode_returns[-100:])) if episode_returns else None
        write_results(
            args, device, run_name=run_name, mode="train", steps=global_step, sps=sps,
            wall_s=time.time() - start_time, mean_return=mean_return, episodes=len(episode_returns),
            status=status, losses=losses, message=message, epsilon=epsilon,
        )  # fmt: skip
        print(summary_line(status, global_step, sps, mean_return, len(episode_returns), args.results_file, run_dir))
        if args.track:
            wandb.finish()
    if status == "interrupted":
        sys.exit(130)
    if status == "diverged":
        sys.exit(1)


if __name__ == "__main__":
    main(tyro.cli(Args))
