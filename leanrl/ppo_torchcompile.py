"""PPO for discrete actions (CleanRL's ppo.py, CartPole-v1): the fast twin, with LeanRL's speed tricks.

Run: python leanrl/ppo_torchcompile.py --env-id CartPole-v1 --compile --cudagraphs
"""

import random  # (trick: no contextlib below: no distribution checks, so no invalid_policy_is_divergence)
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: modules and storage bound with partial)
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch._dynamo.config  # trace_autograd_ops (a trick, see main)
import torch.nn as nn  # (trick: no torch.optim below: Adam as tensor ops, see make_adam)
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
    """whether to save the model at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # 8: the twin captures each CUDA graph at its 5th call: GAE's (one call an iteration) in iteration 5, plus a margin
    measure_burnin: int = 8
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile"""
    cudagraphs: bool = False
    """whether to use CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""

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
    clip_coef: float = 0.2
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


def make_envs(env_id, num_envs, video_dir=None):
    # gymnasium 1.x resets a finished env on the *next* step by default; CleanRL's bookkeeping expects the
    # reset in the same step (the returned obs begins the new episode, the episode's stats are in final_info)
    def make_env(video_dir=None):  # with a video_dir (--capture-video) the env renders and films its episodes there
        env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
        return gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RecordVideo(env, video_dir) if video_dir else env)

    envs = [lambda: make_env(video_dir)] + [make_env] * (num_envs - 1)  # env 0 alone is filmed
    return gym.vector.SyncVectorEnv(envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, int(envs.single_action_space.n)), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        # trick: skip the distribution's argument checks: each is a host sync, and a data-dependent branch that
        # would break the compiled graph and the CUDA graph (a broken policy then gives a NaN loss, which stops the run)
        probs = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation, (T, B) time-major; dones[t] == 1 means obs[t] begins an episode."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    delta = rewards + gamma * nextvalues * nextnonterminal - values
    # trick: GAE is the reverse linear recurrence A[t] = delta[t] + c[t] * A[t + 1]. Recursive doubling solves it in
    # log2(T) whole-tensor steps, not T sequential ones: A[t] += c[t] * A[t + s], c[t] *= c[t + s] for s = 1, 2, 4, ...,
    # zero past the end
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
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, stats


def policy_step(agent, obs, actions, logprobs, values, step):
    """The rollout's policy step at `step` (a 1-element index tensor): samples an action for obs[step] and writes it,
    its log-prob and the value into their (T, B) storage in place; returns the action."""
    # trick: the step is a device tensor and the storage is written inside the step: one compiled graph (and one CUDA
    # graph) serves every step, its only input the 8-byte index
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
    # trick: the bootstrap value and GAE are one function of the storage, compiled and captured like the updates
    with torch.no_grad():
        next_value = agent.get_value(obs[-1]).flatten()
        advantages.copy_(gae(rewards[1:], values, dones[:-1], next_value, dones[-1], gamma, gae_lambda))
        returns.copy_(advantages + values)


def make_adam(params, lr, eps):
    """Adam's state for a list of parameters, with torch.optim.Adam's betas (0.9, 0.999)."""
    # trick: Adam as tensor ops on the device (its step count a device tensor), so that a step is part of the compiled
    # graph: torch.optim's step breaks the graph on purpose. Inductor fuses it with the rest of the update
    return dict(
        params=params, lr=lr, eps=eps, step=torch.zeros((), device=params[0].device),
        exp_avg=[torch.zeros_like(p) for p in params], exp_avg_sq=[torch.zeros_like(p) for p in params],
    )  # fmt: skip


@torch.no_grad()
def adam_step(adam, grads, beta1=0.9, beta2=0.999):
    """One step of torch.optim.Adam (no weight decay, no amsgrad) on adam["params"], in place."""
    adam["step"] += 1
    torch._foreach_lerp_(adam["exp_avg"], grads, 1 - beta1)
    torch._foreach_mul_(adam["exp_avg_sq"], beta2)
    torch._foreach_addcmul_(adam["exp_avg_sq"], grads, grads, 1 - beta2)
    bias_correction1, bias_correction2 = 1 - beta1 ** adam["step"], 1 - beta2 ** adam["step"]
    denom = torch._foreach_add(
        torch._foreach_div(torch._foreach_sqrt(adam["exp_avg_sq"]), bias_correction2.sqrt()), adam["eps"]
    )
    torch._foreach_addcdiv_(adam["params"], torch._foreach_mul(adam["exp_avg"], -adam["lr"] / bias_correction1), denom)


# trick: the update returns these statistics as one stacked tensor: a CUDA graph clones each output at each replay
LOGGED = ("loss", "policy", "value", "entropy", "old_approx_kl", "approx_kl", "clipfrac")


def update(
    agent, optimizer, obs, actions, logprobs, advantages, returns, values, mb_inds,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss, max_grad_norm,
):  # fmt: skip
    """One gradient step on the minibatch mb_inds of the flat batch (T * B rows); returns its LOGGED statistics."""
    # trick: the minibatch is gathered here, inside the compiled (and captured) update: the flat batch is bound once and
    # its indices are the only input
    obs, actions, logprobs, advantages, returns, values = [
        x[mb_inds] for x in (obs, actions, logprobs, advantages, returns, values)
    ]
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    loss, stats = ppo_loss(
        newlogprob, logprobs, entropy, newvalue, values, advantages, returns,  # (trick: the minibatch gathered above)
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    # trick: the gradients from torch.autograd.grad, not backward() into .grad: traced into the compiled graph (see
    # main), and clipped to max_grad_norm as clip_grad_norm_ does, with tensor ops
    grads = torch.autograd.grad(loss, optimizer["params"])
    with torch.no_grad():
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, (max_grad_norm / (total_norm + 1e-6)).clamp(max=1.0))
    adam_step(optimizer, grads)
    return torch.stack([loss.detach(), *stats.values()])  # (trick: one output a replay; no distribution checks)


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps")
    bk.check_flags(__file__, args, positive)
    if args.eval_checkpoint is not None:
        return
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        bk.fail(__file__, f"--num-minibatches {args.num_minibatches} must divide the batch (--num-envs * --num-steps = "
             f"{batch_size})")  # fmt: skip
    if args.total_timesteps < batch_size:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs * "
             f"--num-steps = {batch_size})")  # fmt: skip
    bk.check_gym_env(__file__, args.env_id, gym.spaces.Discrete, "CartPole-v1")
    with gym.make(args.env_id) as env:  # e.g. FrozenLake's Discrete states
        if not isinstance(env.observation_space, gym.spaces.Box):
            bk.fail(__file__, f"--env-id {args.env_id} has no vector observations, the wrong family (try CartPole-v1)")


def evaluate(args, device):
    """Play args.eval_episodes episodes with the greedy (most probable) action of a saved agent."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    args.env_id = checkpoint["args"]["env_id"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_envs(args.env_id, 1, run.videos)
        agent = Agent(envs).to(device)
        agent.load_state_dict(checkpoint["model"])

        def act(obs):
            with torch.no_grad():
                return agent.actor(torch.Tensor(obs).to(device)).argmax(dim=1).cpu().numpy()

        run.play(envs, act, lambda *step: [r for r, _ in bk.gym_episodes(step[-1])], args.eval_episodes, seed=args.seed)


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # trick: TF32 matmuls on GPUs that have them
    torch.set_float32_matmul_precision("high")

    with bk.Run(__file__, args, device) as run:
        # env setup
        envs = make_envs(args.env_id, args.num_envs, run.videos)
        agent = Agent(envs).to(device)
        # trick: the lr is a device tensor annealed in place: no compiled or CUDA graph is rebuilt for it. Adam as
        # tensor ops (make_adam) keeps its step count on the device too: a step never syncs and can be captured
        optimizer = make_adam(list(agent.parameters()), lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)

        # ALGO Logic: Storage setup
        # trick: T + 1 rows, each written in place where the data lands, and what the env returns at step t
        # (observation, reward, done flag) is one row t + 1 of one tensor: obs, rewards and dones are views of it. Row T
        # is the bootstrap input and becomes row 0 of the next rollout. No per-step tensors to stack
        obs_dim = envs.single_observation_space.shape[0]
        env_out = torch.zeros((args.num_steps + 1, args.num_envs, obs_dim + 2), device=device)
        obs, rewards, dones = env_out[..., :obs_dim], env_out[..., obs_dim], env_out[..., obs_dim + 1]
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)
        advantages = torch.zeros((args.num_steps, args.num_envs), device=device)
        returns = torch.zeros((args.num_steps, args.num_envs), device=device)
        # trick: numpy writes the env's arrays into a host copy of that tensor (no torch op per array); on CPU the host
        # copy is the storage itself, on CUDA it is pinned (a non_blocking copy from pageable memory would wait for the
        # transfer) and each row goes to the device in one copy, not three, ordered before the policy step that reads it
        host = env_out if device.type == "cpu" else torch.zeros(env_out.shape, pin_memory=True)
        host_np = host.numpy()
        step_index = torch.arange(args.num_steps, device=device)

        # trick: torch.compile fuses the small kernels of the policy step, GAE and the update; CudaGraphModule replays
        # each as one CUDA graph. Storage, flat batch and constants are bound once with partial: a graph copies none of
        # them and takes only tensors. The warm-up calls compile and make Adam's state before the capture
        policy, advantages_fn, update_fn = policy_step, advantages_and_returns, update
        if args.compile:
            # trick: on CPU the policy step samples with aten's multinomial (fallback_random): inductor's own RNG goes
            # through a Python path on every call there. On GPU inductor's RNG is fused into the kernel and is kept.
            policy = torch.compile(policy, options={"fallback_random": device.type == "cpu"})
            # trick: with trace_autograd_ops, torch.compile traces torch.autograd.grad into the graph: the update (its
            # gradients, clipping and Adam step included) is one graph, one call with no frames resumed in Python
            torch._dynamo.config.trace_autograd_ops = True
            advantages_fn, update_fn = torch.compile(advantages_fn), torch.compile(update_fn, fullgraph=True)
        policy = partial(policy, agent, obs, actions, logprobs, values)
        advantages_fn = partial(
            advantages_fn, agent, obs, rewards, dones, values, advantages, returns, args.gamma, args.gae_lambda
        )
        update_fn = partial(
            update_fn, agent, optimizer, obs[:-1].flatten(0, 1), actions.view(-1), logprobs.view(-1),
            advantages.view(-1), returns.view(-1), values.view(-1), clip_coef=args.clip_coef, ent_coef=args.ent_coef,
            vf_coef=args.vf_coef, norm_adv=args.norm_adv, clip_vloss=args.clip_vloss, max_grad_norm=args.max_grad_norm,
        )  # fmt: skip
        if args.cudagraphs:
            policy = CudaGraphModule(policy, warmup=5)
            advantages_fn = CudaGraphModule(advantages_fn, warmup=5)
            update_fn = CudaGraphModule(update_fn, warmup=5)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=agent.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        next_obs, _ = envs.reset(seed=args.seed)
        host_np[-1, :, :obs_dim] = next_obs  # the first rollout's row 0; not done (trick: T + 1 rows)
        env_out[-1].copy_(host[-1])
        # a stopped run goes on: the state Run writes at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(agent=agent, optimizer=optimizer, global_step=global_step,
                                 envs=(envs, env_out[-1]))  # (trick: T + 1 rows: row T is the next obs) # fmt: skip
        global_step = run.resume("global_step")

        for iteration in run.progress(range(1, args.num_iterations + 1)):
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lrnow = frac * args.learning_rate
                optimizer["lr"].fill_(lrnow)  # (trick: in place, the graphs read this tensor)

            env_out[0] = env_out[-1]  # (trick: T + 1 rows: row T becomes row 0)
            for step in range(0, args.num_steps):
                global_step += args.num_envs
                # (trick: T + 1 rows: the env's obs and done land in their rows after the step, no copies here)

                # ALGO LOGIC: action logic
                action = policy(step_index[step : step + 1])  # (trick: the compiled, captured policy step)

                # TRY NOT TO MODIFY: execute the game and log data.
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                row = host_np[step + 1]  # (trick: one upload a step: the env's arrays into one host row)
                row[:, :obs_dim], row[:, obs_dim], row[:, obs_dim + 1] = next_obs, reward, terminations | truncations
                if host is not env_out:
                    env_out[step + 1].copy_(host[step + 1], non_blocking=True)

                for episodic_return, episodic_length in bk.gym_episodes(infos):
                    run.episode(global_step, episodic_return, episodic_length)

            # bootstrap value if not done
            advantages_fn()  # (trick: bootstrap value and GAE in one compiled, captured call)

            # Optimizing the policy and value network
            # (trick: no host index array: the minibatches are drawn on the device, below)
            clipfracs = []
            for _epoch in range(args.update_epochs):
                # trick: shuffle on the device (no index upload), and no host read here: the losses stay on the device
                b_inds = torch.randperm(args.batch_size, device=device).split(args.minibatch_size)
                for mb_inds in b_inds:
                    stats = update_fn(mb_inds)
                    clipfracs.append(stats[LOGGED.index("clipfrac")])
                if args.target_kl is not None and stats[LOGGED.index("approx_kl")] > args.target_kl:
                    break

            y_pred, y_true = values, returns
            var_y = y_true.var(correction=0)
            explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var(correction=0) / var_y)

            # log point, as CleanRL's: the last minibatch's losses, the mean clipfrac of all minibatches
            stats = dict(zip(LOGGED, stats), clipfrac=torch.stack(clipfracs).mean())  # (trick: one output a replay)
            logged = {"explained_variance": explained_var, "learning_rate": optimizer["lr"]}
            losses = run.check_finite(global_step, stats, unchecked=logged)
            run.tick(global_step)
            run.report(global_step, {
                "charts/learning_rate": losses["learning_rate"], "losses/value_loss": losses["value"],
                "losses/policy_loss": losses["policy"], "losses/entropy": losses["entropy"],
                "losses/old_approx_kl": losses["old_approx_kl"], "losses/approx_kl": losses["approx_kl"],
                "losses/clipfrac": losses["clipfrac"], "losses/explained_variance": losses["explained_variance"],
            })  # fmt: skip

        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
