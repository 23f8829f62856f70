"""PPO on Atari (envpool), the fast twin of ppo_atari_envpool.py: same algorithm, with the speed tricks.

Run: python leanrl/ppo_atari_envpool_torchcompile.py --env-id Breakout-v5 --compile --cudagraphs
"""

import os  # (trick: --env-threads -1: the cores this process may use)
import random
from collections import deque  # (trick: --async-envs: the env groups in flight)
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)
from torch.distributions.categorical import Categorical

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
    """whether to save the model (and what evaluation needs) into the run folder at the end"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # PPO learns from iteration 1. 4 covers the twin's compiling and capturing: its GAE graph, called once an
    # iteration, is captured at its 3rd call (CudaGraphModule(warmup=3)), the others within iteration 1; one to spare
    measure_burnin: int = 4
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of full games to play with --eval-checkpoint"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile on the policy step and the update"""
    cudagraphs: bool = False
    """whether to capture the policy step and the update as CUDA graphs (tensordict's CudaGraphModule)"""

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
    # trick: GAE is the reverse linear recurrence A[t] = delta[t] + c[t] * A[t + 1]. Recursive doubling solves it in
    # log2(T) whole-tensor steps, not T sequential ones: A[t] += c[t] * A[t + s], c[t] *= c[t + s] for s = 1, 2, 4, ...,
    # zero past the end
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    advantages = rewards + gamma * nextvalues * nextnonterminal - values
    coefs = gamma * gae_lambda * nextnonterminal
    num_steps, shift = rewards.shape[0], 1
    while shift < num_steps:
        pad = advantages.new_zeros((shift,) + advantages.shape[1:])  # nothing follows the last step
        advantages, coefs = (
            advantages + coefs * torch.cat([advantages[shift:], pad]),
            coefs * torch.cat([coefs[shift:], pad]),
        )
        shift *= 2
    return advantages


def policy_step(agent, obs, actions, logprobs, values, step):
    """The rollout's policy step at `step` (a 1-element index tensor): reads obs[step], writes the sampled action,
    its log-prob and the value into their (T, B) storage in place; returns the action."""
    # trick: the step is a device tensor and the storage is written inside the step: one compiled graph (and one CUDA
    # graph) serves every step, its only input the 8-byte index
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(obs[step].flatten(0, 1))
    actions[step] = action
    logprobs[step] = logprob
    values[step] = value.flatten()
    return action


def advantages_and_returns(agent, obs, env_out, values, advantages, returns, gamma, gae_lambda):
    """The bootstrap value of obs[T] and GAE over the rollout storage, written into advantages and returns. obs and
    env_out hold T + 1 rows: row t + 1 is what the env returned at step t (observation, reward, done flag)."""
    # trick: the bootstrap value and GAE are one function of the storage, compiled and captured like the updates
    with torch.no_grad():
        next_value = agent.get_value(obs[-1]).reshape(-1)
        rewards, dones, next_done = env_out[1:, 0], env_out[:-1, 1], env_out[-1, 1]
        advantages.copy_(gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda))
        returns.copy_(advantages + values)


def ppo_loss(
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
):  # fmt: skip
    """Clipped PPO loss on a minibatch (1-D tensors); returns (loss, dict of detached parts)."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
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
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, parts


def explained_variance(values, returns):
    """1 - Var[returns - values] / Var[returns] over the batch, NaN where the returns do not vary (CleanRL's)."""
    var_returns = returns.var(correction=0)
    return torch.where(var_returns == 0, torch.nan, 1 - (returns - values).var(correction=0) / var_returns)


def update(
    agent, optimizer, obs, actions, logprobs, advantages, returns, values, mb_inds,  # (trick: minibatch gathered below)
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss, max_grad_norm,
):  # fmt: skip
    """One gradient step on the minibatch mb_inds of the flat batch; returns the detached losses."""
    # trick: the minibatch is gathered here, inside the compiled (and captured) update: the flat batch is bound once and
    # its indices are the only input
    obs, actions, logprobs, advantages, returns, values = [
        x[mb_inds] for x in (obs, actions, logprobs, advantages, returns, values)
    ]
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    loss, parts = ppo_loss(
        newlogprob, logprobs, entropy, newvalue.view(-1), values, advantages, returns,
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    # trick: the grads set to None by hand, as zero_grad does: torch.compile does not trace zero_grad (a graph break)
    for param in agent.parameters():
        param.grad = None
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
    optimizer.step()
    # trick: the logged numbers as one tensor (LOSSES names them): a CUDA graph clones every output at each replay
    return torch.stack([loss.detach(), *parts.values()])


LOSSES = ("loss", "policy", "value", "entropy", "old_approx_kl", "approx_kl", "clipfrac")  # the update's, clipfrac last


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps")
    bk.check_flags(__file__, args, positive)
    if args.eval_checkpoint is not None:
        return
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs x "
                f"--num-steps = {batch_size})")  # fmt: skip
    if batch_size % args.num_minibatches:
        bk.fail(__file__, f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} steps")
    if args.env_threads < -1:  # (trick: --env-threads, --async-envs)
        bk.fail(__file__, f"--env-threads must be -1 (this process's cores), 0 or more, got {args.env_threads}")
    if args.async_envs and args.num_envs % 2:
        bk.fail(__file__, f"--async-envs splits the envs in two: --num-envs {args.num_envs} is odd")
    bk.check_atari_env(__file__, args.env_id)


def evaluate(args, device):
    """Play --eval-episodes full games with a checkpoint; actions sampled from the policy, as CleanRL's evals do."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    args.env_id, num_envs = checkpoint["args"]["env_id"], checkpoint["args"]["num_envs"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_env(args.env_id, num_envs, args.seed)
        agent = Agent(envs.action_space.n).to(device)
        agent.load_state_dict(checkpoint["model"])
        running_returns = np.zeros(num_envs)

        def act(obs):
            with torch.no_grad():
                return agent.get_action_and_value(torch.as_tensor(obs, device=device))[0].cpu().numpy()

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
    torch.set_float32_matmul_precision("high")  # trick: TF32 matmuls on GPUs that have them
    # trick: skip the distribution's argument checks; each one is a host sync
    Categorical.set_default_validate_args(False)

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)

    with bk.Run(__file__, args, device) as run:
        # env setup
        # trick: --async-envs: two groups of envs, each its own envpool (env i keeps its seed, seed + i, and its
        # column): envpool's threads step one group while the policy acts for the other, so neither waits
        num_groups = 2 if args.async_envs else 1
        group_size = args.num_envs // num_groups
        cols = [slice(g * group_size, (g + 1) * group_size) for g in range(num_groups)]
        env_groups = [make_env(args.env_id, group_size, args.seed + c.start, args.env_threads) for c in cols]
        envs = env_groups[0]
        agent = Agent(envs.action_space.n).to(device)
        # trick: the lr is a tensor annealed in place (no recompile, no re-capture). Fused Adam: one multi-tensor
        # kernel, its step counts on the device, capturable on CUDA whatever the flags so that a CUDA graph may replay
        # its step (docs/tricks.md: fused Adam beside the compiled graphs)
        optimizer = optim.Adam(
            agent.parameters(),
            lr=torch.tensor(args.learning_rate, device=device),
            eps=1e-5,
            fused=True,
            capturable=device.type == "cuda",
        )

        # ALGO Logic: Storage setup
        # trick: T + 1 rows, each written in place where the data lands: a row per env of one byte buffer holds the
        # env's observation, then its reward and done flag as float32 (4 x 84 x 84 bytes keep them aligned), so a step
        # lands in one copy, and obs and env_out (T + 1, 2, envs) are views of it. Row T is the bootstrap input and
        # becomes row 0 of the next iteration. No per-step tensors, no TensorDicts to validate and stack
        obs_shape = envs.observation_space.shape
        obs_bytes = int(np.prod(obs_shape))
        received = torch.zeros((args.num_steps + 1, args.num_envs, obs_bytes + 8), dtype=torch.uint8, device=device)
        obs = received[..., :obs_bytes].view(received.shape[:2] + obs_shape)
        env_out = received[..., obs_bytes:].view(torch.float32).permute(0, 2, 1)  # reward, done (trick: T + 1 rows)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
        # (trick: T + 1 rows: rewards and dones are rows of env_out)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)
        advantages = torch.zeros((args.num_steps, args.num_envs), device=device)
        returns = torch.zeros((args.num_steps, args.num_envs), device=device)
        # trick: a non_blocking copy from envpool's pageable arrays need not be asynchronous (the driver stages it). On
        # CUDA a step goes up from a pinned host buffer of the storage's rows, in one asynchronous copy, done before
        # its rows are written again (a group's next action.cpu() waits for the stream)
        staging = torch.zeros(received.shape[1:], dtype=torch.uint8, pin_memory=device.type == "cuda")
        host = staging.numpy()  # numpy's views of it, made once (a host tensor's: no sync)
        host_obs, host_out = host[:, :obs_bytes].reshape((-1,) + obs_shape), host[:, obs_bytes:].view(np.float32)
        step_index = torch.arange(args.num_steps, device=device)

        policy, advantages_fn, update_fn = policy_step, advantages_and_returns, update
        if args.compile:  # trick: torch.compile fuses the small ops of the policy step, GAE and the update
            policy, advantages_fn, update_fn = (
                torch.compile(policy),
                torch.compile(advantages_fn),
                torch.compile(update),
            )
        # trick: the storage and the flat batch (views of it) are bound once: neither graph copies them
        # (trick: --async-envs: a policy step per group, bound to the group's columns of the storage)
        policies = [partial(policy, agent, obs[:, c], actions[:, c], logprobs[:, c], values[:, c]) for c in cols]
        advantages_fn = partial(
            advantages_fn, agent, obs, env_out, values, advantages, returns, args.gamma, args.gae_lambda
        )
        update_step = partial(
            update_fn,  # (trick: torch.compile: the update compiled with --compile)
            agent,
            optimizer,
            obs[:-1].flatten(0, 1),  # (trick: the flat batch bound once, the minibatch gathered in the update)
            actions.view(-1),
            logprobs.view(-1),
            advantages.view(-1),
            returns.view(-1),
            values.view(-1),
            clip_coef=args.clip_coef,
            ent_coef=args.ent_coef,
            vf_coef=args.vf_coef,
            norm_adv=args.norm_adv,
            clip_vloss=args.clip_vloss,
            max_grad_norm=args.max_grad_norm,
        )
        if args.cudagraphs:
            # trick: replay each as one CUDA graph: tensor arguments (here only the indices) are copied into static
            # buffers, outputs cloned out; the warm-up calls (compiling) run before the capture
            policies = [CudaGraphModule(policy, warmup=3) for policy in policies]
            advantages_fn = CudaGraphModule(advantages_fn, warmup=3)
            update_step = CudaGraphModule(update_step, warmup=3)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=agent.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        running_returns = np.zeros(args.num_envs)  # each env's score in its current game
        # (trick: T + 1 rows: the first obs is row T; --async-envs: the groups' obs side by side)
        obs[-1] = torch.as_tensor(np.concatenate([envs.reset()[0] for envs in env_groups]), device=device)
        # a stopped run goes on: Run writes this state at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(
            agent=agent, optimizer=optimizer, global_step=global_step,
            envs=(env_groups, obs[-1], env_out[-1], running_returns))  # (trick: T + 1 rows)  # fmt: skip
        global_step = run.resume("global_step")

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

            # bootstrap value if not done
            advantages_fn()  # (trick: bootstrap value and GAE in one compiled, captured call)

            # Optimizing the policy and value network
            clipfracs = []
            for _epoch in range(args.update_epochs):
                # as a careful user writes CleanRL's shuffle: the minibatch indices are drawn on the device (no index
                # upload per minibatch), from torch's generator, so the twin draws the very same minibatches
                for mb_inds in torch.randperm(args.batch_size, device=device).split(args.minibatch_size):
                    out = update_step(mb_inds)
                    clipfracs.append(out[-1])  # trick: kept on the device
                if args.target_kl is not None and out[LOSSES.index("approx_kl")] > args.target_kl:
                    break
            # logged as CleanRL does: the last minibatch's losses, the mean clipped fraction, the explained variance
            # trick: read to the host once per iteration (not per minibatch), in one go, and the losses checked there
            logged = [out[:-1], torch.stack(clipfracs).mean().view(1), explained_variance(values, returns).view(1)]
            *logged, explained_var = torch.cat(logged).tolist()
            losses = run.check_finite(global_step, dict(zip(LOSSES, logged)))

            run.tick(global_step)
            # TRY NOT TO MODIFY: record rewards for plotting purposes (CleanRL's keys; the results line's short names)
            logs = {"charts/learning_rate": lrnow if args.anneal_lr else args.learning_rate}
            logs |= {"losses/value_loss": losses["value"], "losses/policy_loss": losses["policy"]}
            logs |= {f"losses/{name}": losses[name] for name in ("entropy", "old_approx_kl", "approx_kl", "clipfrac")}
            run.report(global_step, {**logs, "losses/explained_variance": explained_var})
        for envs in env_groups:  # (trick: --async-envs: every group)
            envs.close()


# trick: a fast configuration for one GPU and many cores, flags only (the defaults above stay CleanRL's): the env count
# of Cleanba's Nature-CNN PPO (cleanba_ppo_envpool_impala_atari_wrapper_naturecnn.py: 60 envs, CleanRL's other
# hyper-parameters), with the envs on every core and stepping while the policy acts; time_to_score.py runs it
FAST_FLAGS = "--num-envs 60 --async-envs --env-threads -1"


if __name__ == "__main__":
    main(tyro.cli(Args, description=f"{__doc__}\nFast configuration: {FAST_FLAGS}"))  # (trick: FAST_FLAGS)
