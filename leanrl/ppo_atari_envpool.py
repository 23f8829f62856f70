"""PPO on Atari (envpool), eager PyTorch: CleanRL's ppo_atari_envpool, the baseline of the speed tables.

Run: python leanrl/ppo_atari_envpool.py --env-id Breakout-v5 --total-timesteps 10000000
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
import torch.optim as optim
import tqdm
import tyro
from torch.distributions.categorical import Categorical

SCRIPT = Path(__file__).name


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

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
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
        is_atari = obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
        is_atari = is_atari and isinstance(act_space, gym.spaces.Discrete)
    except Exception:
        is_atari = False
    if not is_atari:
        fail(f"--env-id {env_id!r} is not an Atari game; this script needs stacked 84x84 frames and discrete actions")


def check_args(args):
    """Every bad input is refused here, before any training."""
    if args.eval_checkpoint is not None:
        if not Path(args.eval_checkpoint).is_file():
            fail(f"--eval-checkpoint {args.eval_checkpoint!r}: no such file")
        if args.eval_episodes <= 0:
            fail(f"--eval-episodes must be positive, got {args.eval_episodes}")
        return
    for flag in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps"):
        if getattr(args, flag) <= 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.measure_burnin < 0:
        fail(f"--measure-burnin must not be negative, got {args.measure_burnin}")
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps} is smaller than one iteration "
            f"(--num-envs x --num-steps = {batch_size})"
        )
    if batch_size % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} steps")
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


def append_line(path, text):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text + "\n")


def speed(marks, burnin):
    """Env steps/s from the end of burn-in to the end; marks[i] = (steps, time) after iteration i (0: start); None
    before the first iteration ends."""
    done = len(marks) - 1
    if done < 1:
        return None
    (s0, t0), (s1, t1) = marks[min(burnin, done - 1)], marks[-1]
    return (s1 - s0) / max(t1 - t0, 1e-9)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature CNN torso shared by a categorical actor and a value head."""

    def __init__(self, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation over (T, B) time-major tensors, CleanRL's reversed loop.

    dones[t] == 1 means obs[t] begins a new episode, so step t bootstraps from values[t + 1] unless dones[t + 1].
    """
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


def ppo_loss(
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
):  # fmt: skip
    """Clipped PPO loss on a minibatch (1-D tensors); returns (loss, dict of detached parts)."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()

    if norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    if clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    parts = dict(
        policy=pg_loss.detach(),
        value=v_loss.detach(),
        entropy=entropy_loss.detach(),
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, parts


def update(
    agent, optimizer, obs, actions, logprobs, advantages, returns, values,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss, max_grad_norm,
):  # fmt: skip
    """One gradient step on one minibatch; returns the detached losses."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    loss, parts = ppo_loss(
        newlogprob, logprobs, entropy, newvalue.view(-1), values, advantages, returns,
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.detach(), **parts)


class Diverged(Exception):
    pass


def first_non_finite(losses):
    return next(((name, value) for name, value in losses.items() if not math.isfinite(value)), None)


def evaluate(args, device):
    """Play --eval-episodes full games with a checkpoint; actions sampled from the policy, as CleanRL's evals do."""
    checkpoint = torch.load(args.eval_checkpoint, map_location="cpu")  # load_state_dict copies to the device
    train_args = checkpoint["args"]
    envs = make_env(train_args["env_id"], train_args["num_envs"], args.seed)
    agent = Agent(envs.action_space.n).to(device)
    agent.load_state_dict(checkpoint["model"])
    agent.eval()
    returns, steps = [], 0
    start = time.time()
    next_obs = torch.as_tensor(envs.reset()[0], device=device)
    episode_returns = np.zeros(train_args["num_envs"])
    while len(returns) < args.eval_episodes:
        with torch.no_grad():
            action, _, _, _ = agent.get_action_and_value(next_obs)
        next_obs_np, _, _, truncations, info = envs.step(action.cpu().numpy())
        steps += train_args["num_envs"]
        next_obs = torch.as_tensor(next_obs_np, device=device)
        returns += game_returns(episode_returns, info["reward"], info["terminated"].astype(bool) | truncations)
    envs.close()
    returns = returns[: args.eval_episodes]
    wall_s = time.time() - start
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

    def finish(status, steps, sps, returns, losses, message=None):
        mean_return = float(np.mean(returns[-100:])) if returns else None
        line.update(steps=steps, sps=sps, wall_s=time.time() - start_time, mean_return=mean_return)
        line.update(episodes=len(returns), status=status, losses=losses, message=message)
        line.update(time=datetime.now(UTC).isoformat())
        strict = finite_or_none(line)
        append_line(args.results_file, json.dumps(strict, allow_nan=False))
        print(summary(strict, args.results_file, run_dir))

    if args.eval_checkpoint is not None:
        # an evaluation has no run folder of its own: it reports the folder of the checkpoint it played
        run_dir = Path(args.eval_checkpoint).parent
        line.update(mode="eval", run_name=run_dir.name, checkpoint=args.eval_checkpoint)
        try:
            line["env_id"], steps, sps, returns = evaluate(args, device)
        except KeyboardInterrupt:
            finish("interrupted", 0, 0.0, [], {}, "interrupted")
            sys.exit(130)
        except Exception as err:
            finish("error", 0, 0.0, [], {}, f"{type(err).__name__}: {err}")
            raise
        finish("ok", steps, sps, returns, {})
        return

    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=run_name,
            sync_tensorboard=False,
        )

    global_step, episodic_returns, losses, marks = 0, [], {}, []
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        # env setup
        envs = make_env(args.env_id, args.num_envs, args.seed)
        agent = Agent(envs.action_space.n).to(device)
        optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
        update_step = partial(
            update,
            agent,
            optimizer,
            clip_coef=args.clip_coef,
            ent_coef=args.ent_coef,
            vf_coef=args.vf_coef,
            norm_adv=args.norm_adv,
            clip_vloss=args.clip_vloss,
            max_grad_norm=args.max_grad_norm,
        )

        # ALGO Logic: Storage setup
        obs_shape = envs.observation_space.shape
        obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
        rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
        dones = torch.zeros((args.num_steps, args.num_envs), device=device)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)

        curve = run_dir / "returns.csv"
        curve.write_text("step,wall_s,return\n")
        running_returns = np.zeros(args.num_envs)
        recent = deque(maxlen=100)
        next_obs = torch.as_tensor(envs.reset()[0], device=device)
        next_done = torch.zeros(args.num_envs, device=device)
        marks.append((global_step, time.time()))
        pbar = tqdm.tqdm(range(1, args.num_iterations + 1), desc=SCRIPT, mininterval=2.0)
        for iteration in pbar:
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
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob

                # TRY NOT TO MODIFY: execute the game and log data.
                next_obs_np, reward, terminations, truncations, info = envs.step(action.cpu().numpy())
                next_done_np = np.logical_or(terminations, truncations)
                rewards[step] = torch.as_tensor(reward, device=device)
                next_obs = torch.as_tensor(next_obs_np, device=device)
                next_done = torch.as_tensor(next_done_np, dtype=torch.float32, device=device)
                game_over = info["terminated"].astype(bool) | truncations
                for episodic_return in game_returns(running_returns, info["reward"], game_over):
                    episodic_returns.append(episodic_return)
                    recent.append(episodic_return)
                    append_line(curve, f"{global_step},{time.time() - start_time:.3f},{episodic_return}")
                    if args.track:
                        wandb.log({"charts/episodic_return": episodic_return}, step=global_step)

            # bootstrap value if not done
            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(-1)
                advantages = gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
                returns = advantages + values

            # flatten the batch
            b_obs = obs.reshape((-1,) + obs_shape)
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape(-1)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

            # Optimizing the policy and value network
            for _epoch in range(args.update_epochs):
                # minibatch indices drawn on the device: no index upload per minibatch
                for mb_inds in torch.randperm(args.batch_size, device=device).split(args.minibatch_size):
                    out = update_step(
                        b_obs[mb_inds],
                        b_actions[mb_inds],
                        b_logprobs[mb_inds],
                        b_advantages[mb_inds],
                        b_returns[mb_inds],
                        b_values[mb_inds],
                    )
                    losses = dict(zip(out, torch.stack(list(out.values())).tolist()))
                    bad = first_non_finite(losses)
                    if bad:
                        raise Diverged(f"loss diverged at step {global_step}: {bad[0]}={bad[1]}")
                if args.target_kl is not None and out["approx_kl"] > args.target_kl:
                    break

            marks.append((global_step, time.time()))
            sps = speed(marks, args.measure_burnin)
            mean_return = np.mean(recent) if recent else float("nan")
            pbar.set_postfix(sps=f"{sps:.0f}", ret=f"{mean_return:.1f}", refresh=False)
            if args.track:
                lr = optimizer.param_groups[0]["lr"]
                logs = {f"losses/{name}": value for name, value in losses.items()}
                wandb.log({"charts/SPS": sps, "charts/learning_rate": float(lr), **logs}, step=global_step)
        envs.close()
        if args.save_model:
            model_path = run_dir / f"{args.exp_name}.pt"
            tmp_path = model_path.with_suffix(".pt.tmp")
            torch.save({"args": asdict(args), "model": agent.state_dict()}, tmp_path)
            os.replace(tmp_path, model_path)  # atomic: a reader never sees half a checkpoint
            print(f"{SCRIPT}: model saved to {model_path}")
    except (KeyboardInterrupt, Exception) as err:
        status = {KeyboardInterrupt: "interrupted", Diverged: "diverged"}.get(type(err), "error")
        message = str(err) or type(err).__name__
        finish(status, global_step, speed(marks, args.measure_burnin), episodic_returns, losses, message)
        if status == "interrupted":
            sys.exit(130)
        if status == "diverged":
            print(f"{SCRIPT}: {message}", file=sys.stderr)
            sys.exit(1)
        raise

    finish("ok", global_step, speed(marks, args.measure_burnin), episodic_returns, losses)


if __name__ == "__main__":
    main(tyro.cli(Args))
