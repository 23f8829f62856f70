"""DQN on Atari (envpool), the fast twin of dqn_atari_envpool.py: same algorithm, with the speed tricks. The replay
memory stores every 84x84 frame once (about 7 KB per transition, not 28 KB) and rebuilds the 4-frame stacks by index.

Run: python leanrl/dqn_atari_envpool_torchcompile.py --env-id Breakout-v5 --compile --cudagraphs
"""

import random
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: modules, optimizer, store bound with partial)
from pathlib import Path

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)

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
    """if toggled, cuda will be enabled when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    save_model: bool = False
    """whether to save the model (and what evaluation needs, and the training state: see --resume) at the end"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 100  # covers the twin's update warm-up and capture: 3 calls, one every 4 steps
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of full games to play with --eval-checkpoint"""
    eval_epsilon: float = 0.05
    """the exploration rate of the evaluation games (CleanRL's DQN evals use 0.05)"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile on the policy step and the update"""
    cudagraphs: bool = False
    """whether to capture the policy step, the replay write and the update as CUDA graphs (CudaGraphModule)"""

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """an envpool Atari game (no --capture-video here: RecordVideo cannot wrap envpool, only ale-py's envs)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments, rounded down to a multiple of num_envs"""
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


def make_env(env_id, num_envs, seed):
    """envpool's Atari pipeline: 4 stacked 84x84 grey frames, frame skip 4, loss of life ends a training episode."""
    return envpool.make(env_id, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=seed)


class QNetwork(nn.Module):
    """The Nature CNN: three convolutions and a 512-unit layer, one Q-value per action."""

    def __init__(self, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
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
    return max((end_e - start_e) / duration * t + start_e, end_e)


def dqn_target(rewards, next_q_values, terminations, gamma):
    """CleanRL's DQN target r + gamma * max_a Q_target(s', a) * (1 - terminations); a truncated step bootstraps."""
    target_max, _ = next_q_values.max(dim=1)
    return rewards + gamma * target_max * (1 - terminations.float())


# ---------------------------------------------------------------- the frame store
# Per env a ring of `slots` single frames. The env's a-th observation (a = 0 is the first reset) is a stack of 4 whose
# newest frame sits in slot a % slots; first[a % slots] says that observation began a game (envpool's reset stack
# repeats that frame 4 times; a lost life does not restart the stack). The transition from observation a to a + 1
# keeps its action, clipped reward and termination flag in slot a. envpool's step after any done one (a lost life, a
# game over, a truncation) is a reset step that ignores its action: transition a is valid unless transition a - 1
# was terminated (a lost life counts) or observation a + 1 began a game (the reset after a game over or truncation).
# With n frames written per env, the transitions a in [max(0, n - slots + 3), n - 2] have all their frames, and the
# step data of transition a - 1, in the ring: capacity = slots - 4 per env.


def new_frame_store(num_envs, capacity, device="cpu", frame_shape=(84, 84)):
    """Preallocate the replay memory of `capacity` transitions (capacity // num_envs per env) on `device`."""
    shape = (num_envs, capacity // num_envs + 4)
    return dict(
        frames=torch.zeros(shape + tuple(frame_shape), dtype=torch.uint8, device=device),
        first=torch.zeros(shape, dtype=torch.bool, device=device),
        actions=torch.zeros(shape, dtype=torch.long, device=device),
        rewards=torch.zeros(shape, dtype=torch.float32, device=device),
        terminations=torch.zeros(shape, dtype=torch.bool, device=device),
        count=torch.zeros((), dtype=torch.long, device=device),  # trick: the write index lives on the device
    )


def store_add(store, frames, first, actions, rewards, terminations):
    """Append one step of every env (num_envs rows, on the store's device): the newest frame of each next obs (uint8),
    whether it began a game, and the action (long), clipped reward and termination flag of the step that led there.
    A reset's frames (a new run's first, a resumed run's) begin games: no transition reads that call's step data."""
    slots = store["frames"].shape[1]
    # trick: index_copy_ at a device index, no host sync (and no Python int: one graph for every step)
    previous, slot = ((store["count"] - 1) % slots).view(1), (store["count"] % slots).view(1)
    store["actions"].index_copy_(1, previous, actions[:, None])
    store["rewards"].index_copy_(1, previous, rewards[:, None])
    store["terminations"].index_copy_(1, previous, terminations[:, None])
    store["frames"].index_copy_(1, slot, frames[:, None])
    store["first"].index_copy_(1, slot, first[:, None])
    store["count"] += 1


def stack_frames(store, env, pos):
    """The observation stacks (B, 4, 84, 84) whose newest frames are the env's pos-th frames (env, pos: (B,)). Going
    back from pos, a frame that began a game is repeated in place of the older ones, as envpool does."""
    slots = store["frames"].shape[1]
    index = [pos]
    for _ in range(3):
        newer = index[0]
        index.insert(0, torch.where(store["first"][env, newer % slots], newer, newer - 1))
    return store["frames"][env[:, None], torch.stack(index, dim=1) % slots]


def sample_indices(store, batch_size, tries=8):
    """Uniform (env, pos) of valid transitions, never one whose frames were overwritten or are not written yet. Each
    draw takes the first of `tries` candidates that is not the reset step after a lost life or a game over (those are
    one in a life's length). If all `tries` miss (probability below 1e-10 in Atari), the draw moves to a neighbour:
    the first transition after it, or the done one before it (two reset steps never follow each other)."""
    num_envs, slots = store["first"].shape
    n = store["count"]  # (trick: device-side counters: no int(), no host sync)
    low = (n - slots + 3).clamp(min=0)
    device = store["first"].device
    env = torch.randint(num_envs, (tries, batch_size), device=device)
    # trick: the range's bounds stay on the device (a modulo of wide random integers: no host sync, no bias that
    # matters at 2**62 / 1e6)
    pos = low + torch.randint(2**62, (tries, batch_size), device=device) % (n - 1 - low)
    valid = ~(store["first"][env, (pos + 1) % slots] | store["terminations"][env, (pos - 1) % slots])
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
        terminations=store["terminations"][env, pos % slots],
    )


def update(q_network, target_network, optimizer, batch, gamma):
    """One gradient step on the TD error of a batch; returns the detached loss and mean Q-value, stacked."""
    with torch.no_grad():
        td_target = dqn_target(batch["rewards"], target_network(batch["next_obs"]), batch["terminations"], gamma)
    old_val = q_network(batch["obs"]).gather(1, batch["actions"][:, None]).squeeze(1)
    loss = F.mse_loss(td_target, old_val)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return torch.stack([loss.detach(), old_val.detach().mean()])


def train_step(q_network, target_network, optimizer, store, batch_size, gamma, copy_target):
    """Sample, update, and copy the Q-network to the target network where copy_target (a bool tensor) is set."""
    # trick: the whole training step is one function of device tensors, so that it compiles and is captured whole;
    # the periodic target copy is a masked copy in the graph (copy_target lives on the training device). It returns
    # update()'s one stacked tensor: a CUDA-graph replay clones each output, one clone for both logged scalars
    batch = {key: value.to(copy_target.device, non_blocking=True) for key, value in sample(store, batch_size).items()}
    out = update(q_network, target_network, optimizer, batch, gamma)
    with torch.no_grad():
        for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
            target_network_param.copy_(torch.where(copy_target, q_network_param, target_network_param))
    return out


def epsilon_greedy(q_network, obs, epsilon):
    """Epsilon-greedy actions of every env, all on the device (epsilon: a 0-d tensor)."""
    with torch.no_grad():  # trick: no host branch on the random draw: both choices are computed and one is kept per env
        q_values = q_network(obs)
    explore = torch.rand(len(obs), device=obs.device) < epsilon
    random_actions = torch.randint(q_values.shape[1], (len(obs),), device=obs.device)
    return torch.where(explore, random_actions, q_values.argmax(dim=1))


def check_args(args):
    """Reject bad input before any training."""
    positive = ("num_envs", "total_timesteps", "buffer_size", "batch_size", "train_frequency")
    bk.check_flags(__file__, args, (*positive, "target_network_frequency"))
    if args.eval_checkpoint is not None:
        return
    if args.buffer_device not in (None, "cpu", "cuda"):
        bk.fail(__file__, f"--buffer-device must be cpu or cuda, got {args.buffer_device!r}")
    if args.buffer_device == "cuda" and not (torch.cuda.is_available() and args.cuda):
        bk.fail(__file__, "--buffer-device cuda needs CUDA, and none is available")
    if args.target_network_frequency % args.train_frequency:
        bk.fail(__file__, f"--target-network-frequency must be a multiple of --train-frequency {args.train_frequency}")
    if args.learning_starts < 0:
        bk.fail(__file__, f"--learning-starts must not be negative, got {args.learning_starts}")
    if not 0.0 < args.exploration_fraction <= 1.0:
        bk.fail(__file__, f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if args.total_timesteps < args.num_envs:
        bk.fail(__file__, f"--total-timesteps must be at least --num-envs {args.num_envs} (one iteration)")
    if args.buffer_size < args.num_envs:
        bk.fail(__file__, f"--buffer-size {args.buffer_size} is smaller than --num-envs {args.num_envs}")
    if args.batch_size > args.buffer_size:
        bk.fail(__file__, f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    steps = args.total_timesteps // args.num_envs * args.num_envs
    if (args.learning_starts // args.train_frequency + 1) * args.train_frequency >= steps:  # the first training step
        bk.fail(__file__, f"--learning-starts {args.learning_starts} leaves no training step in --total-timesteps")
    bk.check_atari_env(__file__, args.env_id)


def evaluate(args, device):
    """Play --eval-episodes full games with a checkpoint, epsilon-greedy at --eval-epsilon as CleanRL's evals do."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    args.env_id, num_envs = checkpoint["args"]["env_id"], checkpoint["args"]["num_envs"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_env(args.env_id, num_envs, args.seed)
        q_network = QNetwork(envs.action_space.n).to(device)
        q_network.load_state_dict(checkpoint["model"])
        running_returns = np.zeros(num_envs)

        def act(obs):
            with torch.no_grad():
                actions = q_network(torch.as_tensor(obs, device=device)).argmax(dim=1).cpu().numpy()
            explore = np.random.random(num_envs) < args.eval_epsilon
            return np.where(explore, np.random.randint(envs.action_space.n, size=num_envs), actions)

        def games_of(rewards, terminations, truncations, infos):
            return bk.game_returns(running_returns, infos["reward"], infos["terminated"].astype(bool) | truncations)

        run.play(envs, act, games_of, args.eval_episodes)


def main(args):
    check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    # the replay memory lives on --buffer-device, by default on the training device where it fits (2 GiB left over)
    need = sum(t.nbytes for t in new_frame_store(args.num_envs, args.buffer_size, "meta").values())  # allocates nothing
    fits = device.type == "cuda" and need + 2 * 2**30 < torch.cuda.mem_get_info(device)[0]
    store_device = torch.device(args.buffer_device or (device.type if fits else "cpu"))
    bk.check_memory(__file__, f"--buffer-size {args.buffer_size}", need, store_device)
    if args.cudagraphs and store_device != device:  # (trick: CUDA graphs) the captured step samples the replay memory
        bk.fail(__file__, "--cudagraphs needs the replay memory on the GPU (see --buffer-device, --buffer-size)")
    burnin = (args.learning_starts + 1) // args.num_envs + args.measure_burnin  # the iterations up to learning_starts
    with bk.Run(__file__, args, device, burnin=burnin, buffer_device=store_device.type) as run:
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
        run.add_to_results(buffer_bytes=sum(t.nbytes for t in store.values()))
        running, zeros = np.zeros((args.num_envs, 2)), np.zeros(args.num_envs)  # per env: the game's score, steps
        # trick: the policy step, the replay write and the training step as functions of device tensors, so that each
        # compiles and is captured whole; epsilon and the target-copy flag are tensors: no recompile as they change
        policy, add = partial(epsilon_greedy, q_network), partial(store_add, store)
        update_step = partial(train_step, q_network, target_network, optimizer, store, args.batch_size, args.gamma)
        epsilon_t = torch.tensor(args.start_e, device=device)
        copy_yes, copy_no = torch.tensor(True, device=device), torch.tensor(False, device=device)
        if args.compile:  # trick: torch.compile fuses the small ops of the policy step and of the training step
            policy = torch.compile(policy, fullgraph=True)
            update_step = torch.compile(update_step)
        if args.cudagraphs:
            # trick: replay each as one CUDA graph: inputs are copied into static buffers, outputs cloned out; the
            # replay memory is written in place (its tensors are the graphs' own); the warm-up calls compile
            policy = CudaGraphModule(policy, warmup=3)
            add = CudaGraphModule(add, warmup=3)
            update_step = CudaGraphModule(update_step, warmup=3)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        global_step, out = 0, None
        obs, _ = envs.reset()

        # trick: host data goes to the GPU through pinned memory, so that a non_blocking copy does not make the host
        # wait (from pageable memory it may); PyTorch keeps a pinned block until its copy is done. The obs stack goes
        # to the device once, for the policy and the store
        def to_device(x, dtype=None, device=device):
            x = torch.as_tensor(x, dtype=dtype)
            return (x.pin_memory() if device.type == "cuda" else x).to(device, non_blocking=True)

        to_store = partial(to_device, device=store_device)
        obs = to_device(obs)
        no_step = (to_store(zeros, torch.long), to_store(zeros, torch.float32), to_store(zeros, torch.bool))
        run.state = lambda: dict(q_network=q_network, target_network=target_network, optimizer=optimizer, out=out,
                                 global_step=global_step, envs=(envs, obs, running), replay=store)  # fmt: skip
        global_step, out = run.resume("global_step", "out")  # a stopped run goes on (bookkeeping.py) in new games
        store_add(store, obs[:, -1].to(store_device), to_store(zeros == 0), *no_step)  # (trick: obs to the device once)
        for _ in run.progress(range(args.total_timesteps // args.num_envs)):
            # ALGO LOGIC: put action logic here
            duration = args.exploration_fraction * args.total_timesteps
            epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
            epsilon_t.fill_(epsilon)  # trick: in place, the graphs read this tensor
            actions = policy(obs, epsilon_t)

            # TRY NOT TO MODIFY: execute the game and log data.
            # (trick: the actions come from the device policy step: one read a step, for the env)
            next_obs, rewards, terminations, truncations, info = envs.step(actions.cpu().numpy())
            game_over = info["terminated"].astype(bool) | truncations
            score_and_steps = np.stack([info["reward"], zeros + 1], axis=1)  # a game's raw score and its length
            for episodic_return, episodic_length in bk.game_returns(running, score_and_steps, game_over):
                run.episode(global_step + args.num_envs, episodic_return, int(episodic_length))

            # save data to the replay memory: the newest frame once, and whether it began a game (envpool restarts the
            # stack only there). The sampler skips envpool's reset step after a done one, whose action is ignored
            obs = to_device(next_obs)  # (trick: the obs stack to the device once, for the policy and the store)
            step = (actions.to(store_device), to_store(rewards, torch.float32), to_store(terminations))
            add(obs[:, -1].to(store_device), to_store(info["elapsed_step"] == 0), *step)

            # ALGO LOGIC: training at CleanRL's steps: s > learning_starts and s % train_frequency == 0
            covered = range(global_step, global_step + args.num_envs)
            train_steps = [s for s in covered if s > args.learning_starts and s % args.train_frequency == 0]
            # (trick: sample, update and target copy are one compiled, captured call: update_step below)
            # update the target network after the iteration's gradient steps (its steps are training steps)
            copy = any(s % args.target_network_frequency == 0 for s in train_steps)
            for i in range(len(train_steps)):
                out = update_step(copy_yes if copy and i == len(train_steps) - 1 else copy_no)
            global_step += args.num_envs
            run.tick(global_step)
            if any(s % 100 == 0 for s in covered):  # log point every 100 steps, the losses at training steps as CleanRL
                losses = run.check_finite(global_step, dict(zip(("td_loss", "q_values"), out))) if train_steps else {}
                run.report(global_step, {"charts/epsilon": epsilon, **{f"losses/{k}": v for k, v in losses.items()}})

        run.check_finite(global_step, dict(zip(("td_loss", "q_values"), out)))  # check_args leaves a training step
        envs.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
