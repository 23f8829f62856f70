"""PPO for continuous actions (CleanRL's ppo_continuous_action): the fast twin, with LeanRL's speed tricks.

Run: python leanrl/ppo_continuous_action_torchcompile.py --env-id HalfCheetah-v4 --compile --cudagraphs
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
import torch.nn as nn
import torch.optim as optim
import tqdm
import tyro
from tensordict.nn import CudaGraphModule
from torch.distributions.normal import Normal


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
    """whether to save the model (and the observation-normalisation statistics) at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 3
    """iterations left out of the steps/s figure"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    compile: bool = False
    """whether to use torch.compile"""
    cudagraphs: bool = False
    """whether to use CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (a gymnasium env with a Box action space)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


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
    for flag in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} must divide the batch (--num-envs * --num-steps = {batch_size})"
        )
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is smaller than one iteration "
            f"(--num-envs * --num-steps = {batch_size})"
        )
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
    if isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) > 1:
        fail(
            f"--env-id {args.env_id} has image-like {observation_space.shape} observations, the wrong family for "
            "this script: its MLP needs vector observations, such as HalfCheetah-v4's"
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


def make_env(env_id, gamma):
    """CleanRL's wrapper stack; RecordEpisodeStatistics sits inside the normalisation, so it sees raw rewards."""

    def thunk():
        with mujoco_settotalmass_warning_dropped():
            env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        # gymnasium 1.x wants the space of the transformed observations
        clipped = gym.spaces.Box(-10.0, 10.0, env.observation_space.shape, np.float32)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), clipped)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


def make_envs(env_id, gamma, num_envs):
    # gymnasium 1.x resets a finished env on the *next* step by default; CleanRL's bookkeeping expects the
    # reset in the same step (the returned obs begins the new episode, the episode's stats are in final_info)
    return gym.vector.SyncVectorEnv(
        [make_env(env_id, gamma) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def obs_normalizer(env):
    """The NormalizeObservation wrapper inside one sub-env's wrapper stack."""
    while not isinstance(env, gym.wrappers.NormalizeObservation):
        env = env.env
    return env


def finished_episodes(infos):
    """(raw episodic return, length) of each episode that ended in this vector step."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    ended = np.flatnonzero(final["_episode"])
    return [(float(final["episode"]["r"][i]), int(final["episode"]["l"][i])) for i in ended]


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        act_dim = int(np.prod(envs.single_action_space.shape))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        # state-independent log standard deviation
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        # trick: skip the distribution's argument checks: each is a host sync, and a data-dependent branch that
        # would break the compiled graph and the CUDA graph (a broken policy then gives a NaN loss, which stops the run)
        probs = Normal(action_mean, action_std, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation, (T, B) time-major; dones[t] == 1 means obs[t] begins an episode."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    delta = rewards + gamma * nextvalues * nextnonterminal - values
    # trick: GAE is the reverse linear recurrence A[t] = delta[t] + coef[t] * A[t + 1]. Recursive doubling solves
    # it in log2(T) vectorized steps instead of T sequential ones (11 instead of 2048 here): after step k, A[t]
    # sums 2**k terms and coef[t] is the product of 2**k coefficients; both are zero past the end.
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
    """CleanRL's clipped PPO loss on one minibatch; returns (loss, dict of detached statistics)."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    if norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    newvalue = newvalue.view(-1)
    if clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    stats = dict(
        policy=pg_loss.detach(),
        value=v_loss.detach(),
        entropy=entropy_loss.detach(),
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, stats


def policy_step(agent, obs, actions, logprobs, values, step):
    """The rollout's policy step at `step` (a 1-element index tensor): samples an action for obs[step] and writes it,
    its log-prob and the value into their (T, B) storage in place; returns the action."""
    # trick: the step is an index tensor and the storage is written inside the step, so one compiled graph (and one
    # CUDA graph) serves every step of every rollout, and its only input is the 8-byte index
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(obs[step].flatten(0, 1))
        actions[step] = action
        logprobs[step] = logprob
        values[step] = value.flatten()
    return action


def advantages_and_returns(agent, obs, rewards, dones, values, advantages, returns, gamma, gae_lambda):
    """The bootstrap value of obs[T] and GAE over the rollout storage, written into advantages and returns.

    obs, rewards and dones hold T + 1 rows: row t + 1 is what the env returned at step t (observation, reward, done
    flag), row 0 is the last row of the previous rollout.
    """
    # trick: the bootstrap value and GAE are one function of the storage, compiled (and captured) as one
    with torch.no_grad():
        next_value = agent.get_value(obs[-1]).flatten()
        advantages.copy_(gae(rewards[1:], values, dones[:-1], next_value, dones[-1], gamma, gae_lambda))
        returns.copy_(advantages + values)


def update(
    agent, optimizer, obs, actions, logprobs, advantages, returns, values, mb_inds,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss, max_grad_norm,
):  # fmt: skip
    """One gradient step on the minibatch mb_inds of the flat batch (obs, actions, ...: T * B rows); returns its
    losses."""
    # trick: the minibatch is gathered here, inside the compiled (and captured) update: the flat batch is bound once
    # and the indices are the only input, so no field is gathered outside the graph and then copied into it again
    obs, actions, logprobs, advantages, returns, values = [
        x[mb_inds] for x in (obs, actions, logprobs, advantages, returns, values)
    ]
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    loss, stats = ppo_loss(
        newlogprob, logprobs, entropy, newvalue, values, advantages, returns,
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    # trick: the grads are set to None by hand, as zero_grad does: torch.compile does not trace Optimizer.zero_grad
    # (a graph break)
    for param in agent.parameters():
        param.grad = None
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.detach(), **stats)


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sps_since_burnin(marks, measure_burnin, iterations_done, steps):
    """Env steps/s after the burn-in; marks[k] = (wall time, steps) once k iterations were done."""
    start_time, start_steps = marks[max(0, min(measure_burnin, iterations_done - 1))]
    elapsed = time.time() - start_time
    return (steps - start_steps) / elapsed if steps > start_steps and elapsed > 0 else None


def finite_or_none(obj):
    """A results line is strict JSON: every non-finite float (NaN, inf), nested ones included, becomes null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite_or_none(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_none(value) for value in obj]
    return obj


def summary(line, results_file, run_dir):
    """The one line a run prints when it ends: what it did, and where its results and its folder are."""
    sps = f"{line['sps']:.0f}" if line["sps"] else "n/a"
    mean_return = "n/a" if line["mean_return"] is None else f"{line['mean_return']:.1f}"
    return (
        f"{line['script']}: {line['status']}: {line['steps']} steps, {sps} steps/s, mean return {mean_return} over "
        f"{line['episodes']} episodes; results: {Path(results_file).resolve()}, run folder: {Path(run_dir).resolve()}"
    )


def write_results(args, device, run_dir, **fields):
    """Append the run's one JSON line to args.results_file, then print the summary line."""
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
    line = finite_or_none(line)
    path = Path(args.results_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(line, allow_nan=False) + "\n")
    print(summary(line, path, run_dir), flush=True)


def save_checkpoint(path, args, agent, envs):
    """Weights plus env 0's observation-normalisation statistics, written atomically."""
    rms = obs_normalizer(envs.envs[0]).obs_rms
    checkpoint = {
        "args": asdict(args),
        "model": agent.state_dict(),
        "obs_rms": {
            "mean": torch.as_tensor(rms.mean),
            "var": torch.as_tensor(rms.var),
            "count": float(rms.count),
        },
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, device):
    """(training args, weights on `device`, observation statistics as numpy arrays) of a saved checkpoint.

    Everything is loaded to the CPU first: numpy reads only CPU tensors (a checkpoint loaded straight to CUDA
    would fail there); the weights then move to `device`.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    rms = checkpoint["obs_rms"]
    obs_stats = dict(mean=rms["mean"].numpy(), var=rms["var"].numpy(), count=float(rms["count"]))
    weights = {key: value.to(device) for key, value in checkpoint["model"].items()}
    return checkpoint["args"], weights, obs_stats


def evaluate(args, device):
    """Play args.eval_episodes episodes with the deterministic (mean) action, normalisation frozen."""
    try:
        train_args, weights, obs_stats = load_checkpoint(args.eval_checkpoint, device)
        env_id, gamma = train_args["env_id"], train_args["gamma"]
    except Exception as err:
        fail(f"--eval-checkpoint {args.eval_checkpoint} is not a checkpoint of this script ({type(err).__name__})")
    args.env_id, args.total_timesteps = env_id, 0
    # an evaluation has no run folder of its own: it reports the folder of the checkpoint it plays
    run_dir = Path(args.eval_checkpoint).parent
    start_time, steps, returns = time.time(), 0, []
    status, message = "ok", None
    try:
        envs = make_envs(env_id, gamma, 1)
        normalizer = obs_normalizer(envs.envs[0])
        normalizer.obs_rms.mean, normalizer.obs_rms.var = obs_stats["mean"], obs_stats["var"]
        normalizer.obs_rms.count = obs_stats["count"]
        normalizer.update_running_mean = False
        agent = Agent(envs).to(device)
        agent.load_state_dict(weights)
        next_obs, _ = envs.reset(seed=args.seed)
        while len(returns) < args.eval_episodes:
            with torch.no_grad():
                action = agent.actor_mean(torch.Tensor(next_obs).to(device))
            next_obs, _, _, _, infos = envs.step(action.cpu().numpy())
            steps += 1
            returns += [r for r, _ in finished_episodes(infos)]
        envs.close()
    except KeyboardInterrupt:
        status, message = "interrupted", "interrupted by the user"
    except Exception as err:
        status, message = "error", f"{type(err).__name__}: {err}"
        raise
    finally:
        wall = time.time() - start_time
        write_results(
            args, device, run_dir, run_name=run_dir.name, mode="eval", checkpoint=args.eval_checkpoint,
            steps=steps, sps=steps / wall if steps and wall > 0 else None, wall_s=wall,
            mean_return=float(np.mean(returns)) if returns else None, episodes=len(returns),
            status=status, losses={}, message=message,
        )  # fmt: skip
    if status == "interrupted":
        sys.exit(130)


def main(args):
    # CleanRL's published numbers use the -v4 MuJoCo envs: silence gymnasium's "out of date" note
    warnings.filterwarnings("ignore", message=".*is out of date", category=DeprecationWarning)
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
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
    envs = make_envs(args.env_id, args.gamma, args.num_envs)
    agent = Agent(envs).to(device)
    # trick: the learning rate is a device tensor annealed in place, so neither a compiled graph nor a CUDA graph
    # has to be rebuilt for it. Capturable Adam keeps its step count on the GPU and reads the lr there, so
    # optimizer.step() never syncs with the host and a CUDA graph can replay it (torch.compile arranges this itself)
    optimizer = optim.Adam(
        agent.parameters(),
        lr=torch.tensor(args.learning_rate, device=device),
        eps=1e-5,
        capturable=device.type == "cuda" and not args.compile,
    )

    # ALGO Logic: Storage setup
    # trick: T + 1 rows, each written in place where the data lands, and what the env returns at step t (observation,
    # reward, done flag) is one row t + 1 of one tensor: obs, rewards and dones are views of it. Row T is the bootstrap
    # input and becomes row 0 of the next rollout. No per-step tensors, no TensorDicts to validate and stack
    obs_dim = envs.single_observation_space.shape[0]
    env_out = torch.zeros((args.num_steps + 1, args.num_envs, obs_dim + 2), device=device)
    obs, rewards, dones = env_out[..., :obs_dim], env_out[..., obs_dim], env_out[..., obs_dim + 1]
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    advantages = torch.zeros((args.num_steps, args.num_envs), device=device)
    returns = torch.zeros((args.num_steps, args.num_envs), device=device)
    # trick: numpy writes the env's arrays into a host copy of that tensor (no torch op per array); on CPU the host copy
    # is the storage itself, on CUDA it is pinned and each row goes to the device in one non_blocking copy, not three
    # (a row is written again only in the next rollout, long after its copy is done)
    host = env_out if device.type == "cpu" else torch.zeros(env_out.shape, pin_memory=True)
    host_np = host.numpy()
    step_index = torch.arange(args.num_steps, device=device)

    # trick: torch.compile fuses the many small kernels of the policy step, GAE and the update, and removes most of
    # their Python overhead; CudaGraphModule records each as a CUDA graph and replays it with one launch. The
    # storage, the flat batch (views of it) and the non-tensor arguments are bound once with partial: no graph copies
    # them, and a CUDA graph takes only tensors (here an index tensor or nothing). The warmup calls run before the
    # graph is recorded, so the compiler has finished and Adam has made its state by then.
    policy, advantages_fn, update_fn = policy_step, advantages_and_returns, update
    if args.compile:
        # trick: on CPU the policy step samples with aten's normal_ (fallback_random): inductor's own RNG goes through
        # a Python path on every call there, which made the compiled step no faster than the eager one (about 230 us
        # per step either way, 170 us with aten's). On GPU inductor's RNG is fused into the kernel and is kept.
        policy = torch.compile(policy, options={"fallback_random": device.type == "cpu"})
        advantages_fn, update_fn = torch.compile(advantages_fn), torch.compile(update_fn)
    policy = partial(policy, agent, obs, actions, logprobs, values)
    advantages_fn = partial(
        advantages_fn, agent, obs, rewards, dones, values, advantages, returns, args.gamma, args.gae_lambda
    )
    update_fn = partial(
        update_fn, agent, optimizer, obs[:-1].flatten(0, 1), actions.flatten(0, 1), logprobs.view(-1),
        advantages.view(-1), returns.view(-1), values.view(-1), clip_coef=args.clip_coef, ent_coef=args.ent_coef,
        vf_coef=args.vf_coef, norm_adv=args.norm_adv, clip_vloss=args.clip_vloss, max_grad_norm=args.max_grad_norm,
    )  # fmt: skip
    if args.cudagraphs:
        policy = CudaGraphModule(policy, warmup=5)
        advantages_fn = CudaGraphModule(advantages_fn, warmup=5)
        update_fn = CudaGraphModule(update_fn, warmup=5)

    # run bookkeeping: the results line is written in `finally`, also when the run fails
    start_time = time.time()
    global_step, iterations_done, episode_returns, losses = 0, 0, [], {}
    marks = [(start_time, 0)]
    status, message = "ok", None
    returns_csv = (run_dir / "returns.csv").open("w", buffering=1)  # line by line: the curve can be watched live
    returns_csv.write("step,wall_s,return\n")
    try:
        next_obs, _ = envs.reset(seed=args.seed)
        host_np[-1, :, :obs_dim] = next_obs  # the first rollout's row 0; not done
        env_out[-1].copy_(host[-1])
        pbar = tqdm.trange(1, args.num_iterations + 1, desc=Path(__file__).stem, unit="it")
        for iteration in pbar:
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lrnow = frac * args.learning_rate
                optimizer.param_groups[0]["lr"].fill_(lrnow)

            env_out[0] = env_out[-1]
            for step in range(0, args.num_steps):
                global_step += args.num_envs

                # ALGO LOGIC: action logic
                action = policy(step_index[step : step + 1])

                # TRY NOT TO MODIFY: execute the game and log data.
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                row = host_np[step + 1]
                row[:, :obs_dim], row[:, obs_dim], row[:, obs_dim + 1] = next_obs, reward, terminations | truncations
                if host is not env_out:
                    env_out[step + 1].copy_(host[step + 1], non_blocking=True)

                for episodic_return, episodic_length in finished_episodes(infos):
                    episode_returns.append(episodic_return)
                    returns_csv.write(f"{global_step},{time.time() - start_time:.3f},{episodic_return}\n")
                    if args.track:
                        wandb.log(
                            {"charts/episodic_return": episodic_return, "charts/episodic_length": episodic_length},
                            step=global_step,
                        )

            # bootstrap value if not done
            advantages_fn()

            # Optimizing the policy and value network
            for _epoch in range(args.update_epochs):
                # trick: shuffle on the device (no index upload per minibatch), and no .item() in this loop: the
                # losses stay on the device until the log point below
                b_inds = torch.randperm(args.batch_size, device=device).split(args.minibatch_size)
                for mb_inds in b_inds:
                    stats = update_fn(mb_inds)
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                    break

            # log point: read the last minibatch's losses once per iteration, and stop on a non-finite one
            # trick: the six losses are stacked on the device and read to the host in one copy, not six
            losses = dict(zip(stats, torch.stack(list(stats.values())).tolist(), strict=True))
            for name, value in losses.items():
                if not math.isfinite(value):
                    raise Diverged(f"loss diverged at step {global_step}: {name}={value}")
            iterations_done = iteration
            if len(marks) <= args.measure_burnin:
                marks.append((time.time(), global_step))
            sps = sps_since_burnin(marks, args.measure_burnin, iterations_done, global_step)
            recent = np.mean(episode_returns[-100:]) if episode_returns else float("nan")
            pbar.set_postfix(sps=f"{sps or 0:.0f}", ret=f"{recent:.1f}")
            if args.track:
                wandb.log(
                    {
                        "charts/learning_rate": float(optimizer.param_groups[0]["lr"]),
                        "charts/SPS": sps or 0.0,
                        **{f"losses/{k}": v for k, v in losses.items()},
                    },
                    step=global_step,
                )

        if args.save_model:
            model_path = run_dir / f"{args.exp_name}.pt"
            save_checkpoint(model_path, args, agent, envs)
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
        write_results(
            args, device, run_dir, run_name=run_name, mode="train", steps=global_step,
            sps=sps_since_burnin(marks, args.measure_burnin, iterations_done, global_step),
            wall_s=time.time() - start_time,
            mean_return=float(np.mean(episode_returns[-100:])) if episode_returns else None,
            episodes=len(episode_returns), status=status, losses=losses, message=message,
        )  # fmt: skip
        if args.track:
            wandb.finish()
    if status == "interrupted":
        sys.exit(130)
    if status == "diverged":
        sys.exit(1)


if __name__ == "__main__":
    main(tyro.cli(Args))
