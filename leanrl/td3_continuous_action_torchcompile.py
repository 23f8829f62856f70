"""TD3 for continuous actions (CleanRL's td3_continuous_action): the fast twin, with LeanRL's speed tricks.

Run: python leanrl/td3_continuous_action_torchcompile.py --env-id HalfCheetah-v4 --compile --cudagraphs
"""

import random
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: modules, optimizers, buffer bound with partial)
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch._dynamo.config  # trace_autograd_ops (a trick, see main)
import torch.nn as nn
import torch.nn.functional as F  # (trick: no torch.optim below: Adam as tensor ops, see make_adam)
import tyro
from tensordict import TensorDict  # (trick: the Q-networks' parameters stacked, for the vmap)
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)
from torch.func import functional_call  # (trick: vmap over Q-networks)

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
    """whether to save the actor and the Q-networks at the end of training"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 100
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of episodes an evaluation plays (with the deterministic action)"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile on the policy step, the buffer write and the update"""
    cudagraphs: bool = False
    """whether to use CUDA graphs (tensordict's CudaGraphModule); needs CUDA"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (a gymnasium env with a Box action space and vector observations)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments, rounded down to a multiple of num_envs"""
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


def make_env(env_id, video_dir=None):
    """One env, its episodes' returns and lengths recorded; given a video_dir (--capture-video), it films them there."""
    with bk.mujoco_warning_dropped():
        env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    return gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RecordVideo(env, video_dir) if video_dir else env)


def make_envs(env_id, num_envs, video_dir=None):
    # gymnasium 1.x resets a finished env on the *next* step by default (and that step is no transition). Here the
    # reset happens in the same step: the returned obs begins the new episode, the true last obs is in
    # infos["final_obs"], the episode's statistics in infos["final_info"]
    envs = [lambda: make_env(env_id, video_dir)] + [lambda: make_env(env_id)] * (num_envs - 1)
    return gym.vector.SyncVectorEnv(envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)  # env 0 alone is filmed


def real_next_obs(next_obs, infos):
    """The obs each env reached in this step: the true final obs where an episode ended (terminated or truncated),
    not the reset obs that begins the next one. A truncated transition bootstraps from it."""
    real = next_obs.copy()
    if "final_obs" in infos:
        for i in np.flatnonzero(infos["_final_obs"]):
            real[i] = infos["final_obs"][i]
    return real


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
        buffer[key].index_copy_(0, rows, value)  # faster than buffer[key][rows] = value, the same write
    return count + n


def buffer_sample(buffer, count, batch_size):
    """A batch of transitions drawn uniformly, with replacement, from the filled rows."""
    size = count.clamp(max=buffer["obs"].shape[0])
    # trick: torch.randint needs its bound on the host (a sync): exact integers in [0, 2**62) modulo the device-side
    # size instead (a row's odds off by size / 2**62 at most; a float32 draw times the size would favour some rows)
    idx = torch.randint(2**62, (batch_size,), device=buffer["obs"].device) % size
    return {key: value.index_select(0, idx) for key, value in buffer.items()}  # value[idx], in a faster kernel


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
        # (trick: vmap over Q-networks: both target Q-networks in one call)
        qf1_next_target, qf2_next_target = q_values(qnet, qnet_target, batch["next_obs"], next_state_actions)
        next_q_value = clipped_double_q_target(
            batch["rewards"], batch["terminations"], qf1_next_target, qf2_next_target, gamma
        )
    qf1_a_values, qf2_a_values = q_values(qnet, qnet_params, batch["obs"], batch["actions"])  # (trick: vmapped Q-nets)
    qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
    qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
    qf_loss = qf1_loss + qf2_loss

    # optimize the model
    # trick: the gradients from torch.autograd.grad, not backward() into .grad: traced into the compiled graph (see
    # main), with no .grad to zero
    adam_step(q_optimizer, torch.autograd.grad(qf_loss, q_optimizer["params"]))
    # the statistics CleanRL logs, in its order (its qf_loss is the mean of the two losses)
    stats = dict(qf1_values=qf1_a_values.mean(), qf2_values=qf2_a_values.mean(), qf1_loss=qf1_loss, qf2_loss=qf2_loss)
    return {key: value.detach() for key, value in dict(stats, qf_loss=qf_loss / 2.0).items()}


def actor_update(actor, qnet, qnet_params, actor_optimizer, obs):  # (trick: vmap over Q-networks)
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
    actor, actor_target, qnet, qnet_params, qnet_target, q_optimizer, actor_optimizer,  # (trick: vmap over Q-networks)
    buffer, count, transition, policy_update,
    batch_size, gamma, tau, policy_noise, noise_clip,
):  # fmt: skip
    """Store the vector step's transitions, sample a batch, update the critic; on policy steps also the actor and then
    all the targets. Returns (new count, the detached statistics)."""
    count = buffer_add(buffer, count, transition)
    batch = buffer_sample(buffer, count, batch_size)
    stats = critic_update(  # (trick: vmap over Q-networks: their stacked parameters and targets)
        actor_target, qnet, qnet_params, qnet_target, q_optimizer, batch, gamma, policy_noise, noise_clip
    )
    if policy_update:
        # (trick: vmap over Q-networks: Q1 is slice 0 of the stack)
        stats["actor_loss"] = actor_update(actor, qnet, qnet_params, actor_optimizer, batch["obs"])
        # update the target network
        update_targets(list(actor_target.parameters()) + list(qnet_target.values(True, True)),
                       list(actor.parameters()) + list(qnet_params.values(True, True)), tau)  # fmt: skip
    # trick: the statistics as one tensor (in STATS order), not a dict: a CUDA-graph replay clones each output
    return count, torch.stack(list(stats.values()))


STATS = ("qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss")  # train_step's, in order


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "total_timesteps", "buffer_size", "batch_size", "policy_frequency")
    bk.check_flags(__file__, args, positive)
    if args.eval_checkpoint is not None:
        return
    if args.learning_starts < 0:
        bk.fail(__file__, f"--learning-starts must be >= 0, got {args.learning_starts}")
    if args.batch_size > args.buffer_size:
        bk.fail(__file__, f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.num_envs > args.buffer_size:  # one vector step would overwrite its own rows
        bk.fail(__file__, f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}")
    if args.total_timesteps < args.num_envs:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one step of --num-envs "
                f"{args.num_envs} envs")  # fmt: skip
    if args.learning_starts >= args.total_timesteps:
        bk.fail(__file__, f"--learning-starts {args.learning_starts} is not below --total-timesteps "
                f"{args.total_timesteps}: the run would never learn")  # fmt: skip
    for flag in ("tau", "gamma"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            bk.fail(__file__, f"--{flag} must be in [0, 1], got {getattr(args, flag)}")
    for flag in ("policy_noise", "exploration_noise", "noise_clip"):
        if not getattr(args, flag) >= 0.0:
            bk.fail(__file__, f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    bk.check_gym_env(__file__, args.env_id, gym.spaces.Box, "HalfCheetah-v4")
    env = make_env(args.env_id)
    space, obs_shape = env.action_space, getattr(env.observation_space, "shape", None)
    env.close()
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        bk.fail(__file__, f"--env-id {args.env_id} has an unbounded action space: the tanh actor needs finite bounds")
    if obs_shape is None or len(obs_shape) != 1:
        bk.fail(__file__, f"--env-id {args.env_id} has {obs_shape} observations: its MLP needs flat vector ones")


def evaluate(args, device):
    """Play args.eval_episodes episodes with a saved actor's deterministic action (no exploration noise)."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "actor")
    args.env_id = checkpoint["args"]["env_id"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_envs(args.env_id, 1, run.videos)
        space = envs.single_action_space
        actor = Actor(envs.single_observation_space.shape[0], space.low, space.high).to(device)
        actor.load_state_dict(checkpoint["actor"])

        def act(obs):
            with torch.no_grad():
                return actor(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()

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

    # steps/s: the iterations before learning starts (learning = global_step > learning_starts) and --measure-burnin
    # more are left out. The twin's update variants (with and without the actor) compile at their first calls and are
    # captured at their 5th (CudaGraphModule's warmup): within 5 * --policy-frequency learning iterations
    burnin = args.learning_starts // args.num_envs + 1 + args.measure_burnin
    with bk.Run(__file__, args, device, burnin=burnin) as run:
        # env setup
        envs = make_envs(args.env_id, args.num_envs, run.videos)
        torch.set_float32_matmul_precision("high")  # trick: TF32 matmuls on GPUs that have them
        obs_dim, space = envs.single_observation_space.shape[0], envs.single_action_space
        act_dim = space.shape[0]
        actor = Actor(obs_dim, space.low, space.high).to(device)
        qf1 = QNetwork(obs_dim, act_dim).to(device)
        qf2 = QNetwork(obs_dim, act_dim).to(device)
        # (trick: no target Q-networks to build: their parameters are a clone of the stack, below)
        target_actor = Actor(obs_dim, space.low, space.high).to(device)
        target_actor.load_state_dict(actor.state_dict())
        # trick: the two Q-networks' parameters stacked into one TensorDict (leading dim 2, an nn.Module whose
        # parameters Adam steps), the targets a detached clone of the stack, a meta-device network to vmap them through
        qnet_params = TensorDict.from_modules(qf1, qf2, as_module=True)
        qnet_target = qnet_params.data.clone()
        qnet = QNetwork(obs_dim, act_dim).to("meta")
        q_optimizer = make_adam(list(qnet_params.parameters()), lr=args.learning_rate)
        actor_optimizer = make_adam(list(actor.parameters()), lr=args.learning_rate)

        buffer = make_buffer(args.buffer_size, obs_dim, act_dim, device)
        count = torch.zeros((), dtype=torch.long, device=device)

        # trick: torch.compile fuses the small ops of the policy step and of the update; CudaGraphModule replays each as
        # one CUDA graph. Compiled, then bound with partial: a graph takes only tensors (count, transition). Two update
        # graphs, with and without the actor step and target updates (docs/tricks.md: two update graphs)
        policy_fn, add_fn, train_fn = act, buffer_add, train_step
        if args.compile:
            # trick: with trace_autograd_ops, torch.compile traces torch.autograd.grad into the graph: each variant of
            # the update (its gradients and Adam steps included) is one graph with no break, one call with no frames
            # resumed in Python, and no activations saved between a forward and a backward graph
            torch._dynamo.config.trace_autograd_ops = True
            train_fn = torch.compile(train_fn, fullgraph=True)
        if args.compile and device.type == "cuda":
            # trick: the policy step and the warm-up buffer write only on CUDA, where they fuse kernels and feed the
            # CUDA graphs. On a CPU a compiled call's fixed cost exceeds what it saves on a batch-1 MLP forward
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

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            # the stacked Q-parameters (a trick above) split back into qf1's and qf2's state dicts: the eager script's
            # checkpoint format, so the two scripts' checkpoints are interchangeable
            qf_state = lambda: {f"qf{i + 1}": qnet_params.data[i].flatten_keys(".").clone().to_dict() for i in range(2)}
            run.save = lambda: bk.save_checkpoint(run.model_path, args, actor=actor.state_dict(), qf=qf_state())
        # TRY NOT TO MODIFY: start the game
        global_step, stats, losses = 0, {}, {}
        obs, _ = envs.reset(seed=args.seed)
        # trick: the reset obs laid out as the step's upload lays it out (a column of it): one graph takes both
        obs = torch.zeros((args.num_envs, 2 * obs_dim + 2), device=device)[:, :obs_dim].copy_(torch.from_numpy(obs))
        # a stopped run goes on: the state Run writes at a step's end, restored by --resume (bookkeeping.py says how)
        run.state = lambda: dict(qnet_params=qnet_params, qnet_target=qnet_target.to_dict(),  # the stack: trick above
                                 actor=actor, target_actor=target_actor, q_optimizer=q_optimizer,
                                 actor_optimizer=actor_optimizer, global_step=global_step, losses=losses,
                                 envs=(envs, obs), replay=(buffer, count))  # fmt: skip
        global_step, losses, (_, obs), (_, count) = run.resume("global_step", "losses", "envs", "replay")
        for iteration in run.progress(range(num_iterations)):
            # ALGO LOGIC: put action logic here
            if global_step < args.learning_starts:
                env_actions = np.random.uniform(space.low, space.high, (args.num_envs, act_dim)).astype(np.float32)
                actions = torch.as_tensor(env_actions, device=device)  # for the buffer: the env takes them as they are
            else:
                with torch.no_grad():
                    actions = policy(obs)  # (trick: the compiled, captured policy step)
                env_actions = actions.cpu().numpy()

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, rewards, terminations, truncations, infos = envs.step(env_actions)
            learning = global_step > args.learning_starts
            global_step += args.num_envs
            for episodic_return, episodic_length in bk.gym_episodes(infos):
                run.episode(global_step, episodic_return, episodic_length)

            # trick: one upload a step, pinned on CUDA so it is asynchronous: next obs, true next obs, rewards, ends
            up = torch.from_numpy(np.column_stack([next_obs, real_next_obs(next_obs, infos), rewards, terminations]))
            up = (up.float().pin_memory() if device.type == "cuda" else up.float()).to(device, non_blocking=True)
            # save data to the replay buffer: a truncated episode's transition keeps its true last obs (and
            # bootstraps from it); only a terminated one stops the bootstrap
            transition = dict(
                obs=obs,
                actions=actions,
                rewards=up[:, -2],  # (trick: one upload a step, above)
                next_obs=up[:, obs_dim:-2],
                terminations=up[:, -1],
            )

            # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
            obs = up[:, :obs_dim]  # (trick: one upload a step: the next obs is on the device already)

            # ALGO LOGIC: training.
            if learning:
                # trick: one call (one CUDA-graph replay) writes, samples and updates; the losses stay on the device
                count, stats = train_fns[iteration % args.policy_frequency == 0](count, transition)
            else:
                count = add_fn(count, transition)  # (trick: functions of tensors: the buffer write, captured on CUDA)
            run.tick(global_step)

            # log point: read the losses every 100 steps, and stop on a non-finite one
            if iteration % 100 == 0 or iteration == num_iterations - 1:
                # a step without the actor's update has no actor loss: the last one read stays
                losses.update(zip(STATS, stats))  # (trick: one output a replay)
                run.report(global_step, {f"losses/{k}": v for k, v in run.check_finite(global_step, losses).items()})

        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
