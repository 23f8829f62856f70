"""PPO on Atari (envpool), eager PyTorch: CleanRL's ppo_atari_envpool, the baseline of the speed tables.

Run: python leanrl/ppo_atari_envpool.py --env-id Breakout-v5 --total-timesteps 10000000
"""

import random
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
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

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def make_env(env_id, num_envs, seed):
    """envpool's Atari pipeline: 4 stacked 84x84 grey frames, frame skip 4, loss of life ends a training episode."""
    return envpool.make(env_id, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=seed)


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

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)

    with bk.Run(__file__, args, device) as run:
        # env setup
        envs = make_env(args.env_id, args.num_envs, args.seed)
        agent = Agent(envs.action_space.n).to(device)
        optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, foreach=True)

        # ALGO Logic: Storage setup
        obs_shape = envs.observation_space.shape
        obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
        actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
        logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
        rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
        dones = torch.zeros((args.num_steps, args.num_envs), device=device)
        values = torch.zeros((args.num_steps, args.num_envs), device=device)

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

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=agent.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step = 0
        running_returns = np.zeros(args.num_envs)  # each env's score in its current game
        next_obs = torch.as_tensor(envs.reset()[0], device=device)
        next_done = torch.zeros(args.num_envs, device=device)
        # a stopped run goes on: Run writes this state at an iteration's end, --resume restores it (see bookkeeping.py)
        run.state = lambda: dict(
            agent=agent, optimizer=optimizer, global_step=global_step,
            envs=(envs, next_obs, next_done, running_returns))  # fmt: skip
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
                # a lost life ends a training episode; a game (and its score) ends on the last life or the time limit
                game_over = info["terminated"].astype(bool) | truncations
                for episodic_return in bk.game_returns(running_returns, info["reward"], game_over):
                    run.episode(global_step, episodic_return)

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
            clipfracs = []
            for _epoch in range(args.update_epochs):
                # as a careful user writes CleanRL's shuffle: the minibatch indices are drawn on the device (no index
                # upload per minibatch), from torch's generator, so the twin draws the very same minibatches
                for mb_inds in torch.randperm(args.batch_size, device=device).split(args.minibatch_size):
                    out = update_step(
                        b_obs[mb_inds],
                        b_actions[mb_inds],
                        b_logprobs[mb_inds],
                        b_advantages[mb_inds],
                        b_returns[mb_inds],
                        b_values[mb_inds],
                    )
                    # one host read per minibatch (CleanRL reads its clipfrac here too): stop at the first bad loss
                    losses = run.check_finite(global_step, out)
                    clipfracs.append(losses["clipfrac"])
                if args.target_kl is not None and losses["approx_kl"] > args.target_kl:
                    break
            # logged as CleanRL does: the last minibatch's losses, the mean clipped fraction, the explained variance
            losses = run.check_finite(global_step, {**losses, "clipfrac": float(np.mean(clipfracs))})
            explained_var = explained_variance(b_values, b_returns).item()

            run.tick(global_step)
            # TRY NOT TO MODIFY: record rewards for plotting purposes (CleanRL's keys; the results line's short names)
            logs = {"charts/learning_rate": lrnow if args.anneal_lr else args.learning_rate}
            logs |= {"losses/value_loss": losses["value"], "losses/policy_loss": losses["policy"]}
            logs |= {f"losses/{name}": losses[name] for name in ("entropy", "old_approx_kl", "approx_kl", "clipfrac")}
            run.report(global_step, {**logs, "losses/explained_variance": explained_var})
        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
