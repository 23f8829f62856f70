"""PPO for continuous actions (CleanRL's ppo_continuous_action): the eager PyTorch baseline.

Run: python leanrl/ppo_continuous_action.py --env-id HalfCheetah-v4 --total-timesteps 1000000
"""

import random
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.normal import Normal

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
    """whether to save the model (and the observation-normalisation statistics) at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    # 8: the twin captures each CUDA graph at its 5th call: GAE's (one call an iteration) in iteration 5, plus a margin
    measure_burnin: int = 8
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (a gymnasium env with a Box action space)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments, rounded down to whole iterations (num_envs x num_steps each)"""
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


def make_env(env_id, gamma, video_dir=None):
    """CleanRL's wrapper stack (RecordEpisodeStatistics inside the normalisation: raw rewards); films in video_dir."""

    def thunk():
        with bk.mujoco_warning_dropped():
            env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
        env = gym.wrappers.RecordVideo(env, video_dir) if video_dir else env
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


def make_envs(env_id, gamma, num_envs, video_dir=None):
    # gymnasium 1.x resets a finished env on the *next* step by default; CleanRL's bookkeeping expects the
    # reset in the same step (the returned obs begins the new episode, the episode's stats are in final_info)
    return gym.vector.SyncVectorEnv(
        [make_env(env_id, gamma, None if i else video_dir) for i in range(num_envs)],  # env 0 alone is filmed
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def obs_normalizer(env):
    """The NormalizeObservation wrapper inside one sub-env's wrapper stack."""
    while not isinstance(env, gym.wrappers.NormalizeObservation):
        env = env.env
    return env


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
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation, (T, B) time-major; dones[t] == 1 means obs[t] begins an episode."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    nextvalues = torch.cat([values[1:], next_value[None]])
    delta = rewards + gamma * nextvalues * nextnonterminal - values
    # the recursion A[t] = delta[t] + gamma * lambda * nextnonterminal[t] * A[t + 1] runs in numpy (as SB3's does): T
    # steps of tiny torch ops cost many times the arithmetic (T = 2048 here)
    delta, coef = delta.cpu().numpy(), (gamma * gae_lambda * nextnonterminal).cpu().numpy()
    advantages = np.zeros_like(delta)
    lastgaelam = 0
    for t in reversed(range(len(delta))):
        advantages[t] = lastgaelam = delta[t] + coef[t] * lastgaelam
    return torch.from_numpy(advantages).to(rewards.device)


def ppo_loss(
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns,
    clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
):  # fmt: skip
    """CleanRL's clipped PPO loss on one minibatch; returns (loss, dict of detached statistics)."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
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


def update(agent, optimizer, batch, clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss, max_grad_norm):
    """One gradient step on a minibatch (obs, actions, logprobs, values, advantages, returns); returns its losses."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(batch["obs"], batch["actions"])
    loss, stats = ppo_loss(
        newlogprob, batch["logprobs"], entropy, newvalue, batch["values"], batch["advantages"], batch["returns"],
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.detach(), **stats)


@contextmanager
def invalid_policy_is_divergence(step):
    """Normal's argument check (on here, as in CleanRL) raises ValueError when an update left the policy's mean NaN or
    its std 0 or infinite: the loss cannot even be formed. That is the run diverging, and it is reported as such."""
    try:
        yield
    except ValueError:
        raise bk.Diverged(f"loss diverged at step {step}: the policy's Normal got invalid parameters") from None


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
    bk.check_gym_env(__file__, args.env_id, gym.spaces.Box, "HalfCheetah-v4")


def save_model(path, args, agent, envs):
    """Weights plus env 0's observation-normalisation statistics: evaluation needs both."""
    rms = obs_normalizer(envs.envs[0]).obs_rms
    obs_rms = dict(mean=torch.as_tensor(rms.mean), var=torch.as_tensor(rms.var), count=float(rms.count))
    bk.save_checkpoint(path, args, model=agent.state_dict(), obs_rms=obs_rms)


def evaluate(args, device):
    """Play args.eval_episodes episodes with the deterministic (mean) action, normalisation frozen."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model", "obs_rms")
    args.env_id, gamma = checkpoint["args"]["env_id"], checkpoint["args"]["gamma"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_envs(args.env_id, gamma, 1, run.videos)
        normalizer = obs_normalizer(envs.envs[0])
        rms = checkpoint["obs_rms"]
        normalizer.obs_rms.mean, normalizer.obs_rms.var = rms["mean"].numpy(), rms["var"].numpy()
        normalizer.obs_rms.count, normalizer.update_running_mean = rms["count"], False
        agent = Agent(envs).to(device)
        agent.load_state_dict(checkpoint["model"])

        def act(obs):
            with torch.no_grad():
                return agent.actor_mean(torch.Tensor(obs).to(device)).cpu().numpy()

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

    with bk.Run(__file__, args, device) as run:
        # env setup
        envs = make_envs(args.env_id, args.gamma, args.num_envs, run.videos)
        agent = Agent(envs).to(device)
        optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, foreach=True)

        # ALGO Logic: Storage setup
        obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
        actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
        logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
        rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
        dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
        values = torch.zeros((args.num_steps, args.num_envs)).to(device)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: save_model(run.model_path, args, agent, envs)
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        next_obs, _ = envs.reset(seed=args.seed)
        next_obs = torch.Tensor(next_obs).to(device)
        next_done = torch.zeros(args.num_envs).to(device)
        # a stopped run goes on: the state Run writes at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(agent=agent, optimizer=optimizer, global_step=global_step,
                                 envs=(envs, next_obs, next_done))  # fmt: skip
        global_step = run.resume("global_step")

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
                with torch.no_grad(), invalid_policy_is_divergence(global_step):
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob

                # TRY NOT TO MODIFY: execute the game and log data.
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                next_done = np.logical_or(terminations, truncations)
                rewards[step] = torch.tensor(reward).to(device).view(-1)
                next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

                for episodic_return, episodic_length in bk.gym_episodes(infos):
                    run.episode(global_step, episodic_return, episodic_length)

            # bootstrap value if not done
            with torch.no_grad():
                next_value = agent.get_value(next_obs).flatten()
                advantages = gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
                returns = advantages + values

            # flatten the batch
            b = dict(
                obs=obs.reshape((-1,) + envs.single_observation_space.shape),
                actions=actions.reshape((-1,) + envs.single_action_space.shape),
                logprobs=logprobs.reshape(-1),
                advantages=advantages.reshape(-1),
                returns=returns.reshape(-1),
                values=values.reshape(-1),
            )

            # Optimizing the policy and value network
            b_inds = np.arange(args.batch_size)
            clipfracs = []
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, args.batch_size, args.minibatch_size):
                    # a tensor of indices: each tensor indexed by a numpy array would convert it anew
                    mb_inds = torch.from_numpy(b_inds[start : start + args.minibatch_size])
                    with invalid_policy_is_divergence(global_step):
                        stats = update(
                            agent, optimizer, {k: v[mb_inds] for k, v in b.items()}, args.clip_coef, args.ent_coef,
                            args.vf_coef, args.norm_adv, args.clip_vloss, args.max_grad_norm,
                        )  # fmt: skip
                    clipfracs.append(stats["clipfrac"])
                    # one host read per minibatch (CleanRL reads its clipfrac here too): stop at the first bad loss
                    run.check_finite(global_step, {"loss": stats["loss"]})
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                    break

            y_pred, y_true = values, returns
            var_y = y_true.var(correction=0)
            explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var(correction=0) / var_y)

            # log point, as CleanRL's: the last minibatch's losses, the mean clipfrac of all minibatches
            stats["clipfrac"] = torch.stack(clipfracs).mean()
            logged = {"explained_variance": explained_var, "learning_rate": optimizer.param_groups[0]["lr"]}
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
