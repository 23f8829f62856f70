"""TD3 for continuous actions (CleanRL's td3_continuous_action): the fast twin, with LeanRL's speed tricks.

Run: python leanrl/td3_continuous_action_torchcompile.py --env-id HalfCheetah-v4 --compile --cudagraphs
"""

import json
import math
import os
import platform
import random
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch._dynamo.config  # trace_autograd_ops (a trick, see main)
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from torch.func import functional_call


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
    """whether to save the actor and the Q-networks at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 100
    """vector-env steps after --learning-starts left out of the steps/s figure (the update compiles in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays (with the deterministic action)"""
    compile: bool = False
    """whether to use torch.compile on the policy step, the buffer write and the update"""
    cudagraphs: bool = False
    """whether to use CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (a gymnasium env with a Box action space and vector observations)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = int(1e6)
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    policy_noise: float = 0.2
    """the scale of policy noise"""
    exploration_noise: float = 0.1
    """the scale of exploration noise"""
    learning_starts: int = 25000
    """timestep to start learning (random actions until then)"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed); the targets are updated with it"""
    noise_clip: float = 0.5
    """noise clip parameter of the Target Policy Smoothing Regularization"""


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
        return
    for flag in ("num_envs", "total_timesteps", "buffer_size", "batch_size", "policy_frequency"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
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
    for flag in ("tau", "gamma"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            fail(f"--{flag.replace('_', '-')} must be in [0, 1], got {getattr(args, flag)}")
    for flag in ("policy_noise", "exploration_noise", "noise_clip"):
        if not getattr(args, flag) >= 0.0:
            fail(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    try:
        gym.spec(args.env_id)
    except gym.error.Error:
        if looks_like_atari(args.env_id):
            fail(
                f"--env-id {args.env_id} looks like an Atari id, the wrong family for this script: "
                "it needs a continuous-action gymnasium env such as HalfCheetah-v4"
            )
        fail(f"--env-id {args.env_id} is not a registered gymnasium env (try HalfCheetah-v4)")
    try:
        with mujoco_settotalmass_warning_dropped():
            env = gym.make(args.env_id)
    except Exception as err:
        fail(f"--env-id {args.env_id} could not be made: {type(err).__name__}: {err}".splitlines()[0])
    action_space, observation_space = env.action_space, env.observation_space
    env.close()
    if not isinstance(action_space, gym.spaces.Box):
        fail(
            f"--env-id {args.env_id} has a {type(action_space).__name__} action space, the wrong family for this "
            "script: it needs continuous (Box) actions, such as HalfCheetah-v4"
        )
    if not np.all(np.isfinite(action_space.low)) or not np.all(np.isfinite(action_space.high)):
        fail(f"--env-id {args.env_id} has an unbounded action space: the tanh actor needs finite bounds")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        shape = getattr(observation_space, "shape", None)
        fail(
            f"--env-id {args.env_id} has {type(observation_space).__name__} {shape} observations, the wrong family "
            "for this script: its MLP needs flat vector (1-D Box) observations, such as HalfCheetah-v4's"
        )


@contextmanager
def mujoco_settotalmass_warning_dropped():
    """Drop one MuJoCo warning, and only while an env is made.

    gymnasium's HalfCheetah-v4 model (half_cheetah.xml) sets <compiler settotalmass="14">, which MuJoCo 4 deprecates:
    compiling it prints a 'settotalmass' deprecation warning on stderr (and writes MUJOCO_LOG.TXT) each time the env
    is made. The -v4 envs take no other XML, so the call cannot be avoided. MuJoCo's warnings come from C through
    its warning callback, not through Python's `warnings`, so this drops exactly that message there and prints any
    other one as MuJoCo does; MuJoCo's own handler is back once the env is made.
    """
    try:
        import mujoco
    except ImportError:  # an env that needs no MuJoCo
        yield
        return
    previous = mujoco.get_mju_user_warning()

    def handler(msg):
        if "'settotalmass' is deprecated" in msg:
            return
        if previous is not None:
            previous(msg)
        else:
            print(f"WARNING: {msg}", file=sys.stderr)

    mujoco.set_mju_user_warning(handler)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def make_env(env_id, **make_kwargs):
    """One env, its episodes' returns and lengths recorded."""
    with mujoco_settotalmass_warning_dropped():
        env = gym.make(env_id, **make_kwargs)
    return gym.wrappers.RecordEpisodeStatistics(env)


def make_envs(env_id, num_envs, **make_kwargs):
    # gymnasium 1.x resets a finished env on the *next* step by default (and that step is no transition). Here the
    # reset happens in the same step: the returned obs begins the new episode, the true last obs is in
    # infos["final_obs"], the episode's statistics in infos["final_info"]
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(env_id, **make_kwargs) for _ in range(num_envs)],
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


# ALGO LOGIC: initialize agent here:
class QNetwork(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + act_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 1)

    def forward(self, x, a):
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


class Actor(nn.Module):
    def __init__(self, obs_dim, action_low, action_high):
        super().__init__()
        act_dim = len(action_low)
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, act_dim)
        # action rescaling
        low, high = np.asarray(action_low, np.float64), np.asarray(action_high, np.float64)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_low", torch.tensor(low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(high, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = torch.tanh(self.fc_mu(x))
        return x * self.action_scale + self.action_bias


def exploration_action(actions, noise, exploration_noise, action_scale, action_low, action_high):
    """The behaviour action: the actor's plus N(0, (action_scale * exploration_noise)^2) noise, clipped to the box;
    noise is standard normal, passed in."""
    return (actions + noise * action_scale * exploration_noise).clamp(action_low, action_high)


def act(actor, obs, exploration_noise):
    """The policy step: the actor's action plus exploration noise, clipped to the box (kept on the device)."""
    # trick: a function of tensors only (noise drawn on the device, no numpy), so it compiles whole and is captured as
    # a CUDA graph
    actions = actor(obs)
    return exploration_action(
        actions, torch.randn_like(actions), exploration_noise, actor.action_scale, actor.action_low, actor.action_high
    )


def q_values(qnet, params, obs, actions):
    """Both Q-networks at once: their parameters stacked (leading dim 2) and vmapped through one copy; (2, B)."""
    # trick: one vmap over the stacked parameters runs the two Q-networks as batched matmuls (half the kernels); qnet
    # is a parameter-less (meta-device) copy that functional_call runs with each slice of the stack (functional_call
    # rather than TensorDict.to_module: torch.compile 2.13 fails on two to_module swaps in one frame)
    flat = dict(params.flatten_keys(".").items())
    return torch.vmap(lambda p: functional_call(qnet, p, (obs, actions)).view(-1))(flat)


def target_policy_smoothing(next_actions, noise, policy_noise, noise_clip, action_scale, action_low, action_high):
    """TD3's target action: the target actor's plus clipped noise (standard-normal noise * policy_noise, clipped to
    +-noise_clip, scaled to the box), clipped to the box."""
    clipped_noise = (noise * policy_noise).clamp(-noise_clip, noise_clip) * action_scale
    return (next_actions + clipped_noise).clamp(action_low, action_high)


def clipped_double_q_target(rewards, terminations, next_q1, next_q2, gamma):
    """r + gamma * min(Q1'(s', a'), Q2'(s', a')), with no bootstrap from a terminated s'; all inputs (B,)."""
    return rewards + (1 - terminations) * gamma * torch.min(next_q1, next_q2)


def actor_loss_fn(q1_pi):
    """TD3's deterministic policy loss: -Q1(s, actor(s)) averaged over the batch."""
    return -q1_pi.mean()


def make_buffer(capacity, obs_dim, act_dim, device):
    """The replay memory: preallocated float32 tensors, one row per transition."""
    return dict(
        obs=torch.zeros(capacity, obs_dim, device=device),
        actions=torch.zeros(capacity, act_dim, device=device),
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


def make_adam(params, lr):
    """Adam's state for a list of parameters, with torch.optim.Adam's defaults (betas 0.9, 0.999, eps 1e-8)."""
    # trick: Adam as tensor ops on the device (its step count a device tensor), so that a step is part of the compiled
    # graph: torch.optim's step breaks the graph on purpose. Inductor fuses it with the rest of the update
    return dict(
        params=params, lr=lr, step=torch.zeros((), device=params[0].device),
        exp_avg=[torch.zeros_like(p) for p in params], exp_avg_sq=[torch.zeros_like(p) for p in params],
    )  # fmt: skip


@torch.no_grad()
def adam_step(adam, grads, beta1=0.9, beta2=0.999, eps=1e-8):
    """One step of torch.optim.Adam (no weight decay, no amsgrad) on adam["params"], in place."""
    adam["step"] += 1
    torch._foreach_lerp_(adam["exp_avg"], grads, 1 - beta1)
    torch._foreach_mul_(adam["exp_avg_sq"], beta2)
    torch._foreach_addcmul_(adam["exp_avg_sq"], grads, grads, 1 - beta2)
    bias_correction1, bias_correction2 = 1 - beta1 ** adam["step"], 1 - beta2 ** adam["step"]
    denom = torch._foreach_add(
        torch._foreach_div(torch._foreach_sqrt(adam["exp_avg_sq"]), bias_correction2.sqrt()), eps
    )
    torch._foreach_addcdiv_(adam["params"], torch._foreach_mul(adam["exp_avg"], -adam["lr"] / bias_correction1), denom)


def critic_update(actor_target, qnet, qnet_params, qnet_target, q_optimizer, batch, gamma, policy_noise, noise_clip):
    """One gradient step of both Q-networks on the clipped double-Q target; returns detached statistics."""
    with torch.no_grad():
        next_state_actions = target_policy_smoothing(
            actor_target(batch["next_obs"]), torch.randn_like(batch["actions"]), policy_noise, noise_clip,
            actor_target.action_scale, actor_target.action_low, actor_target.action_high,
        )  # fmt: skip
        qf1_next_target, qf2_next_target = q_values(qnet, qnet_target, batch["next_obs"], next_state_actions)
        next_q_value = clipped_double_q_target(
            batch["rewards"], batch["terminations"], qf1_next_target, qf2_next_target, gamma
        )
    qf1_a_values, qf2_a_values = q_values(qnet, qnet_params, batch["obs"], batch["actions"])
    qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
    qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
    qf_loss = qf1_loss + qf2_loss

    # optimize the model
    # trick: the gradients from torch.autograd.grad, not backward() into .grad: traced into the compiled graph (see
    # main), with no .grad to zero
    adam_step(q_optimizer, torch.autograd.grad(qf_loss, q_optimizer["params"]))
    return dict(
        qf_loss=qf_loss.detach() / 2.0, qf1_values=qf1_a_values.mean().detach(), qf2_values=qf2_a_values.mean().detach()
    )


def actor_update(actor, qnet, qnet_params, actor_optimizer, obs):
    """One gradient step of the actor; returns its detached loss."""
    # trick: Q1's parameters (slice 0 of the stack) enter detached: the actor's backward computes no Q-gradients,
    # which the eager script's next critic step throws away anyway (its zero_grad). Detached by apply: TensorDict's
    # .data warns in a compiled graph
    qf1_params = dict(qnet_params.apply(torch.Tensor.detach)[0].flatten_keys(".").items())
    actor_loss = actor_loss_fn(functional_call(qnet, qf1_params, (obs, actor(obs))))
    adam_step(actor_optimizer, torch.autograd.grad(actor_loss, actor_optimizer["params"]))
    return actor_loss.detach()


def update_targets(targets, sources, tau):
    """target <- tau * online + (1 - tau) * target, over lists of tensors."""
    # trick: one fused multi-tensor lerp over all parameters, in place (a CUDA graph reads these very tensors)
    with torch.no_grad():
        torch._foreach_lerp_(targets, sources, tau)


def train_step(
    actor, actor_target, qnet, qnet_params, qnet_target, q_optimizer, actor_optimizer,
    buffer, count, transition, policy_update,
    batch_size, gamma, tau, policy_noise, noise_clip,
):  # fmt: skip
    """Store the vector step's transitions, sample a batch, update the critic; on policy steps also the actor and then
    all the targets. Returns (new count, dict of detached statistics)."""
    count = buffer_add(buffer, count, transition)
    batch = buffer_sample(buffer, count, batch_size)
    stats = critic_update(
        actor_target, qnet, qnet_params, qnet_target, q_optimizer, batch, gamma, policy_noise, noise_clip
    )
    if policy_update:
        stats["actor_loss"] = actor_update(actor, qnet, qnet_params, actor_optimizer, batch["obs"])
        # update the target network
        update_targets(list(actor_target.parameters()) + list(qnet_target.values(True, True)),
                       list(actor.parameters()) + list(qnet_params.values(True, True)), tau)  # fmt: skip
    return count, stats


def random_actions(low, high, num_envs):
    """Uniform actions in the box, from numpy's seeded generator (before --learning-starts)."""
    return np.random.uniform(low, high, size=(num_envs, len(low))).astype(np.float32)


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


def save_checkpoint(path, args, actor, qf_state):
    """The actor's and the Q-networks' weights and the run's arguments, written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"args": asdict(args), "actor": actor.state_dict(), "qf": qf_state}, tmp)
    os.replace(tmp, path)


def evaluate(args, device):
    """Play args.eval_episodes episodes with a saved actor's deterministic action (no exploration noise)."""
    try:
        checkpoint = torch.load(args.eval_checkpoint, map_location=device, weights_only=True)
        train_args, state = checkpoint["args"], checkpoint["actor"]
    except Exception as err:
        fail(f"--eval-checkpoint {args.eval_checkpoint} is not a checkpoint of this script ({type(err).__name__})")
    args.env_id, args.total_timesteps = train_args["env_id"], 0
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    envs = make_envs(args.env_id, 1)
    space = envs.single_action_space
    actor = Actor(envs.single_observation_space.shape[0], space.low, space.high).to(device)
    actor.load_state_dict(state)
    run_name = f"{args.env_id}__{args.exp_name}__eval__{args.seed}__{int(time.time())}"
    run_dir = Path(args.results_file).parent / run_name
    run_dir.mkdir(parents=True, exist_ok=True)

    start_time, steps, returns = time.time(), 0, []
    with (run_dir / "returns.csv").open("w") as returns_csv:
        returns_csv.write("step,wall_s,return\n")
        obs, _ = envs.reset(seed=args.seed)
        while len(returns) < args.eval_episodes:
            with torch.no_grad():
                actions = actor(torch.as_tensor(obs, dtype=torch.float32, device=device))
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
    # CleanRL's published numbers use the -v4 MuJoCo envs: silence gymnasium's "out of date" note
    warnings.filterwarnings("ignore", message=".*is out of date", category=DeprecationWarning)
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

    # env setup
    envs = make_envs(args.env_id, args.num_envs)
    # trick: TF32 matmuls on GPUs that have them
    torch.set_float32_matmul_precision("high")

    obs_dim, space = envs.single_observation_space.shape[0], envs.single_action_space
    act_dim = space.shape[0]
    actor = Actor(obs_dim, space.low, space.high).to(device)
    qf1 = QNetwork(obs_dim, act_dim).to(device)
    qf2 = QNetwork(obs_dim, act_dim).to(device)
    target_actor = Actor(obs_dim, space.low, space.high).to(device)
    target_actor.load_state_dict(actor.state_dict())
    # trick: the two Q-networks' parameters stacked into one TensorDict (leading dim 2, an nn.Module whose parameters
    # Adam steps), the targets a detached clone of the stack, and one meta-device network to vmap them through
    qnet_params = TensorDict.from_modules(qf1, qf2, as_module=True)
    qnet_target = qnet_params.data.clone()
    qnet = QNetwork(obs_dim, act_dim).to("meta")
    q_optimizer = make_adam(list(qnet_params.parameters()), lr=args.learning_rate)
    actor_optimizer = make_adam(list(actor.parameters()), lr=args.learning_rate)

    buffer = make_buffer(args.buffer_size, obs_dim, act_dim, device)
    count = torch.zeros((), dtype=torch.long, device=device)

    # trick: torch.compile fuses the small ops of the policy step and of the update (buffer write, sampling, critic,
    # actor, targets) and removes most of their Python overhead; CudaGraphModule records each as a CUDA graph and
    # replays it with one launch (inputs copied into static buffers, outputs cloned out). The functions are compiled
    # before the modules, optimizers, buffer and non-tensor arguments are bound with partial, so a CUDA graph takes only
    # tensors (count, the transition) and reads the bound tensors in place. The update is two graphs, one with the
    # actor step and the target updates (every --policy-frequency steps) and one without: Adam's step counts and
    # moments advance on every step it takes, so a masked actor step in one graph would not be the same algorithm.
    # The warmup calls run before the capture: the compiler has finished and Adam has made its state by then.
    policy_fn, add_fn, train_fn = act, buffer_add, train_step
    if args.compile:
        # trick: with trace_autograd_ops, torch.compile traces torch.autograd.grad into the graph: each variant of the
        # update (its gradients and Adam steps included) is one graph with no break, one call with no frames resumed
        # in Python, and no activations saved between a forward and a backward graph
        torch._dynamo.config.trace_autograd_ops = True
        train_fn = torch.compile(train_fn, fullgraph=True)
    if args.compile and device.type == "cuda":
        # trick: the policy step and the warm-up buffer write only on CUDA, where they fuse kernels and feed the CUDA
        # graphs. On a CPU a compiled call's fixed cost exceeds what it saves on a batch-1 MLP forward
        policy_fn, add_fn = torch.compile(policy_fn, fullgraph=True), torch.compile(add_fn, fullgraph=True)
    policy = partial(policy_fn, actor, exploration_noise=args.exploration_noise)
    add_fn = partial(add_fn, buffer)
    bound = (actor, target_actor, qnet, qnet_params, qnet_target, q_optimizer, actor_optimizer, buffer)
    hyper = dict(batch_size=args.batch_size, gamma=args.gamma, tau=args.tau)
    hyper.update(policy_noise=args.policy_noise, noise_clip=args.noise_clip)
    train_fns = [partial(train_fn, *bound, policy_update=update, **hyper) for update in (False, True)]
    if args.cudagraphs:
        policy = CudaGraphModule(policy, warmup=5)
        add_fn = CudaGraphModule(add_fn, warmup=5)
        train_fns = [CudaGraphModule(fn, warmup=5) for fn in train_fns]

    # run bookkeeping: the results line is written in `finally`, also when the run fails
    start_time = time.time()
    global_step, episode_returns, losses, stats = 0, [], {}, None
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
            if global_step < args.learning_starts:
                actions = torch.as_tensor(random_actions(space.low, space.high, args.num_envs), device=device)
            else:
                with torch.no_grad():
                    actions = policy(obs)

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, rewards, terminations, truncations, infos = envs.step(actions.cpu().numpy())
            learning = global_step > args.learning_starts
            global_step += args.num_envs
            for episodic_return, episodic_length in finished_episodes(infos):
                episode_returns.append(episodic_return)
                returns_csv.write(f"{global_step},{time.time() - start_time:.3f},{episodic_return}\n")
                if args.track:
                    wandb.log(
                        {"charts/episodic_return": episodic_return, "charts/episodic_length": episodic_length},
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

            # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
            obs = next_obs_t

            # ALGO LOGIC: training.
            if learning:
                # trick: one call (one CUDA-graph replay) writes the transition, samples and updates; no .item() here:
                # the losses stay on the device until a log point
                count, stats = train_fns[iteration % args.policy_frequency == 0](count, transition)
                if burnin_mark is None and global_step > args.learning_starts + args.measure_burnin * args.num_envs:
                    burnin_mark = (time.time(), global_step)
            else:
                count = add_fn(count, transition)

            # log point: read the losses every 100 steps, and stop on a non-finite one
            if iteration % 100 == 0 or iteration == num_iterations - 1:
                if stats is not None:
                    losses.update({k: float(v) for k, v in stats.items()})
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
            # the stacked Q-parameters (a trick above) split back into qf1's and qf2's state dicts: the eager script's
            # checkpoint format, so the two scripts' checkpoints are interchangeable
            qf_state = {f"qf{i + 1}": qnet_params.data[i].flatten_keys(".").clone().to_dict() for i in range(2)}
            save_checkpoint(model_path, args, actor, qf_state)
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
        sps = sps_since(burnin_mark or (start_time, 0), global_step)
        mean_return = float(np.mean(episode_returns[-100:])) if episode_returns else None
        write_results(
            args, device, run_name=run_name, mode="train", steps=global_step, sps=sps,
            wall_s=time.time() - start_time, mean_return=mean_return, episodes=len(episode_returns),
            status=status, losses=losses, message=message,
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
