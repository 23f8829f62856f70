"""R2D2 on Atari (envpool), the fast twin of r2d2_atari_envpool.py: same algorithm, with the speed tricks.

A conv (or MLP) torso, an LSTM that also sees the previous action and reward, a dueling head; sequences of 80 steps
(overlapping by 40) replayed after a burn-in of 40 steps from the recurrent state stored with them; n-step double
Q-learning on value-rescaled targets; prioritized replay of whole sequences from a sum tree kept in tensors.
The replay memory stores every frame once per env stream; a sequence is a start position in that stream.

Run: python leanrl/r2d2_atari_envpool_torchcompile.py --env-id Breakout-v5 --compile --cudagraphs
Memory task: python leanrl/r2d2_atari_envpool_torchcompile.py --env-id CartPole-v1 --mask-velocity --compile
"""

import random
import warnings
from dataclasses import dataclass
from functools import partial  # (trick: functions of tensors: network, optimizer, store bound with partial)
from pathlib import Path

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from tensordict.nn import CudaGraphModule  # (trick: CUDA graphs, --cudagraphs)

from leanrl import bookkeeping as bk

STACK = 4  # frames per Atari observation
CARTPOLE_POSITIONS = [0, 2]  # cart position and pole angle; --mask-velocity hides the two velocities


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
    """whether to save the model (what evaluation needs) and the training state (see --resume) into the run folder"""
    results_file: str = "runs/results.jsonl"
    """where the run appends its one JSON results line"""
    measure_burnin: int = 100
    """iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_episodes: int = 10
    """the number of full episodes to play with --eval-checkpoint"""
    eval_epsilon: float = 0.001
    """the exploration rate of the evaluation episodes"""
    compile: bool = False  # (trick: --compile and --cudagraphs switch on torch.compile and CUDA graphs)
    """whether to use torch.compile on the policy step and the update"""
    cudagraphs: bool = False
    """whether to capture the policy step, the replay write and the update as CUDA graphs (CudaGraphModule)"""

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """the id of the environment: an envpool Atari game, or a classic-control task such as CartPole-v1.
    No --capture-video: gymnasium's RecordVideo cannot wrap envpool, only ale-py's envs"""
    mask_velocity: bool = False
    """CartPole-v1 only: hide the two velocities (a memory task: only the LSTM can infer them)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments (all envs together), rounded down to a multiple of num_envs"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer (Adam)"""
    adam_eps: float = 1e-3
    """Adam's epsilon"""
    num_envs: int = 32
    """the number of parallel game environments (actors)"""
    buffer_size: int = 1000000
    """the replay memory size in frames (all env streams together)"""
    buffer_device: str | None = None
    """where the replay memory lives: cpu or cuda (default: the training device where it fits)"""
    hidden_size: int = 512
    """the width of the torso's last layer, of the LSTM and of the dueling head's layers"""
    burn_in: int = 40
    """steps replayed before each sequence only to rebuild the recurrent state"""
    seq_len: int = 80
    """steps per learned sequence (the last one only bootstraps)"""
    overlap: int = 40
    """steps shared by consecutive sequences of an env stream"""
    n_step: int = 5
    """the number of rewards summed before bootstrapping"""
    gamma: float = 0.997
    """the discount factor gamma"""
    value_rescale_eps: float = 1e-3
    """eps of the value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + eps x"""
    batch_size: int = 64
    """sequences per gradient step"""
    max_grad_norm: float = 40.0
    """the gradient clipping norm"""
    target_network_frequency: int = 2500
    """gradient steps between copies of the online network into the target network"""
    priority_eta: float = 0.9
    """a sequence's priority: eta * max|td| + (1 - eta) * mean|td|"""
    priority_exponent: float = 0.9
    """alpha: sampling probability proportional to priority^alpha"""
    importance_sampling_exponent: float = 0.6
    """beta: importance weights (N P(i))^-beta, normalised by the batch's largest"""
    epsilon_base: float = 0.4
    """env i of N explores with epsilon_base^(1 + epsilon_alpha i / (N - 1)) (Ape-X)"""
    epsilon_alpha: float = 7.0
    """see --epsilon-base"""
    learning_starts: int = 80000
    """timestep to start learning (all envs together)"""
    train_frequency: int = 640
    """env steps (all envs together) per gradient step: 4 samples per inserted 40-step sequence, as in Acme"""


def is_atari(obs_space):
    return obs_space.shape == (STACK, 84, 84) and obs_space.dtype == np.uint8


def spaces(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's notes on the float64 bounds of some spaces
        spec = envpool.make_spec(env_id)
        return spec.observation_space, spec.action_space


def make_env(env_id, num_envs, seed):
    """envpool: Atari as R2D2 plays it (full action set, 30 no-ops, no sticky actions, no life loss, raw rewards)."""
    if is_atari(spaces(env_id)[0]):
        return envpool.make(env_id, env_type="gym", num_envs=num_envs, seed=seed, episodic_life=False, noop_max=30,
                            reward_clip=False, full_action_space=True, repeat_action_probability=0.0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return envpool.make(env_id, env_type="gym", num_envs=num_envs, seed=seed)


def observe(obs, mask_velocity):
    """What the agent sees: the Atari stack as is; the CartPole vector without its velocities if asked."""
    return obs[:, CARTPOLE_POSITIONS] if mask_velocity else obs


class QNetwork(nn.Module):
    """Torso (Nature CNN on frames, MLP on vectors) -> LSTM fed also the previous action and reward -> dueling head."""

    def __init__(self, obs_shape, n_actions, hidden_size=512):
        super().__init__()
        self.register_buffer("actions", torch.arange(n_actions), persistent=False)
        self.image = len(obs_shape) == 3
        if self.image:
            self.torso = nn.Sequential(
                nn.Conv2d(obs_shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, hidden_size), nn.ReLU(),
            )  # fmt: skip
        else:
            self.torso = nn.Sequential(nn.Linear(obs_shape[0], hidden_size), nn.ReLU(),
                                       nn.Linear(hidden_size, hidden_size), nn.ReLU())  # fmt: skip
        self.lstm = nn.LSTMCell(hidden_size + n_actions + 1, hidden_size)
        head = lambda n: nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, n))
        self.value, self.advantage = head(1), head(n_actions)

    def forward(self, obs, prev_actions, prev_rewards, first, state):
        """Q-values (T, B, A) of T steps of B streams from the recurrent state (h, c) before the first step; where
        first[t] is set (an episode begins) the state, previous action and previous reward are zeroed."""
        T, B = first.shape
        x = obs.flatten(0, 1).float()
        if self.image:
            x = x / 255.0
        keep = (~first).float()[..., None]
        one_hot = (prev_actions[..., None] == self.actions).float()
        inputs = torch.cat([self.torso(x).view(T, B, -1), one_hot * keep, prev_rewards[..., None] * keep], dim=-1)
        h, c = state
        outputs = []
        for t in range(T):
            h, c = lstm_step(self.lstm, inputs[t], h, c, keep[t])  # (trick: one compiled LSTM step)
            outputs.append(h)
        out = torch.stack(outputs)
        advantage = self.advantage(out)
        q_values = self.value(out) + advantage - advantage.mean(dim=-1, keepdim=True)
        return q_values, (h, c)


# trick: one LSTM step is a nested compile region: compiled once and reused at every step, where the unrolled loop
# (120 steps in each of 4 passes an update) made one graph that took minutes to compile on a CPU
@torch.compiler.nested_compile_region
def lstm_step(lstm, x, h, c, keep):
    return lstm(x, (h * keep, c * keep))


def value_rescale(x, eps=1e-3):
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x: squashes large returns so that one network fits every game. Written
    as x / (sqrt(|x| + 1) + 1) + eps x (the same, times the conjugate): no cancellation near 0 in float32."""
    return x / (torch.sqrt(x.abs() + 1) + 1) + eps * x


def inverse_value_rescale(y, eps=1e-3):
    """The exact inverse of h, written without cancellation (float32 round trips stay within 1e-5 relative).

    With s = sqrt(|x| + 1), |y| = s - 1 + eps (s^2 - 1); solving for s - 1 and multiplying by the conjugate gives
    s - 1 = 4 |y| (|y| + 1 + eps) / ((1 + sqrt(D)) (1 + 2 eps + 2 |y| + sqrt(D))), D = 1 + 4 eps (1 + eps + |y|),
    and |x| = (s - 1)(s + 1).
    """
    a = y.abs()
    root = torch.sqrt(1 + 4 * eps * (1 + eps + a))
    s_minus_1 = 4 * a * (a + 1 + eps) / ((1 + root) * (1 + 2 * eps + 2 * a + root))
    return torch.sign(y) * s_minus_1 * (s_minus_1 + 2)


def nstep_double_q_targets(rewards, q_online, q_target, terminations, truncations, first, gamma, n_step, eps):
    """R2D2's n-step double-Q targets with value rescaling over a sequence, time-major.

    rewards, terminations, truncations: (T, B) of the step taken at each of the T learned steps; q_online, q_target:
    (T, B, A) their Q-values; first: (T, B), the step's observation began an episode. For t < T - 1:

        y_t = h( sum_{i<k} gamma^i r_{t+i} + gamma^k h^-1( Q_target(s_{t+k}, argmax_a Q_online(s_{t+k}, a)) ) )

    summing k = min(n, steps to the episode's end, T - 1 - t) rewards, with no bootstrap where the episode
    terminated (a truncated one bootstraps from its final observation). Returns the targets (T - 1, B) and where
    they are valid (T - 1, B): not at an episode's final observation, whose step only resets the env.
    """
    T, B = rewards.shape
    best = q_online.argmax(dim=-1, keepdim=True)
    values = inverse_value_rescale(q_target.gather(-1, best).squeeze(-1), eps)  # (T, B)
    pad = lambda x, fill: torch.cat([x, torch.full((n_step,) + x.shape[1:], fill, dtype=x.dtype, device=x.device)])
    rewards, values = pad(rewards[: T - 1], 0.0), pad(values[1:], 0.0)  # row t + i: the step t + i, the obs t + i + 1
    terminations, ends = pad(terminations[: T - 1], True), pad((terminations | truncations)[: T - 1], True)
    returns = torch.zeros(T - 1, B, dtype=rewards.dtype, device=rewards.device)
    discount = torch.ones_like(returns)
    running = torch.ones(T - 1, B, dtype=torch.bool, device=rewards.device)
    last = torch.arange(T - 1, device=rewards.device)[:, None] + torch.arange(n_step, device=rewards.device) >= T - 2
    for i in range(n_step):
        returns = returns + torch.where(running, discount * rewards[i : i + T - 1], 0.0)
        discount = discount * gamma
        stop = running & (ends[i : i + T - 1] | last[:, i : i + 1] | (i == n_step - 1))
        bootstrap = stop & ~terminations[i : i + T - 1]
        returns = returns + torch.where(bootstrap, discount * values[i : i + T - 1], 0.0)
        running = running & ~stop
    return value_rescale(returns, eps), ~first[1:]


def priority_mix(abs_td, valid, eta):
    """Per sequence (columns of (T, B)): eta * max|td| + (1 - eta) * mean|td| over its valid steps."""
    abs_td = torch.where(valid, abs_td, 0.0)
    mean = abs_td.sum(dim=0) / valid.sum(dim=0).clamp(min=1)
    return eta * abs_td.max(dim=0).values + (1 - eta) * mean


def actor_epsilons(num_envs, base, alpha):
    """Ape-X's fixed per-actor exploration: env i explores with base^(1 + alpha i / (N - 1))."""
    i = torch.arange(num_envs, dtype=torch.float64)
    return (base ** (1 + alpha * i / max(num_envs - 1, 1))).float()


# ---------------------------------------------------------------- prioritized replay: a sum tree in one tensor
# tree[1] is the root, node i has the children 2i and 2i + 1, the leaves (priority^alpha per sequence slot) sit at
# [C, 2C), C a power of two. Every operation is a fixed number of tensor ops: no host sync, no data-dependent shape.
# Why a tree and not stratified draws over a cumulative sum: the cumulative sum reads every slot per draw (linear in
# the capacity), the tree walks log2(capacity) levels (`python benchmarks/replay.py --only samplers` compares them).


def new_sum_tree(capacity, device="cpu"):
    leaves = 1 << max(capacity - 1, 1).bit_length()
    return torch.zeros(2 * leaves, dtype=torch.float32, device=device)


def tree_update(tree, index, value):
    """Set the leaves of the slots `index` (B,) to `value` (B,), then recompute their ancestors level by level. A slot
    given twice gets its last value on every device: all its writes carry that one (CUDA writes in no set order)."""
    leaves = tree.shape[0] // 2
    node, order = torch.sort(index + leaves, stable=True)  # a slot's repeats side by side, in the order given
    tree.index_put_((node,), value[order][torch.searchsorted(node, node, right=True) - 1])  # the last of each slot's
    for _ in range(leaves.bit_length() - 1):
        node = node // 2
        tree.index_put_((node,), tree[2 * node] + tree[2 * node + 1])


def tree_sample(tree, batch_size, beta):
    """Stratified prioritized draws: slot i with probability leaf_i / sum, its importance weight (N P(i))^-beta
    normalised by the batch's largest (N cancels). A zero leaf (an empty slot) is never drawn while the sum is > 0."""
    leaves = tree.shape[0] // 2
    u = (torch.arange(batch_size, device=tree.device) + torch.rand(batch_size, device=tree.device)) / batch_size
    u = u * tree[1]
    node = torch.ones(batch_size, dtype=torch.long, device=tree.device)
    for _ in range(leaves.bit_length() - 1):
        left, right = tree[2 * node], tree[2 * node + 1]
        go_right = (u >= left) & (right > 0)  # never into an empty subtree, also when rounding puts u past the sum
        u = torch.where(go_right, u - left, u)
        node = 2 * node + go_right.long()
    p = tree[node]
    weights = (p / p.min()) ** -beta
    return node - leaves, weights


# ---------------------------------------------------------------- the sequence store
# Per env a ring of R frames (R a multiple of the period P = seq_len - overlap). The env's a-th observation (a = 0 is
# the first reset) has its newest frame in slot a % R and first[a % R] says it began an episode; the step taken there
# keeps its action, reward, termination and truncation flags in slot a % R. A sequence is the L = burn_in + seq_len
# observations from a start position p, a multiple of P: it occupies sequence slot env * S + (p // P) % S (S = R / P),
# which keeps p and the LSTM state the actor had before observation p. It can be sampled (its leaf is non-zero) from
# when its last frame is written until the write that overwrites frame p - 3 (the oldest its stacks read).


def new_store(num_envs, capacity, period, hidden_size, frame_shape=(84, 84), dtype=torch.uint8, device="cpu"):
    """Preallocate the replay memory of `capacity` frames (capacity // num_envs per env, rounded to the period)."""
    slots = capacity // num_envs // period * period
    shape, sequences = (num_envs, slots), num_envs * slots // period
    return dict(
        frames=torch.zeros(shape + tuple(frame_shape), dtype=dtype, device=device),
        first=torch.zeros(shape, dtype=torch.bool, device=device),
        actions=torch.zeros(shape, dtype=torch.long, device=device),
        rewards=torch.zeros(shape, dtype=torch.float32, device=device),
        terminations=torch.zeros(shape, dtype=torch.bool, device=device),
        truncations=torch.zeros(shape, dtype=torch.bool, device=device),
        starts=torch.zeros(sequences, dtype=torch.long, device=device),
        h=torch.zeros(sequences, hidden_size, device=device),
        c=torch.zeros(sequences, hidden_size, device=device),
        tree=new_sum_tree(sequences, device),
        max_priority=torch.ones((), device=device),
        count=torch.zeros((), dtype=torch.long, device=device),  # trick: the write index lives on the device
    )


def store_bytes(num_envs, capacity, period, hidden_size, frame_shape=(84, 84), dtype=torch.uint8):
    """What new_store allocates, in bytes (its shapes on the meta device: nothing is allocated)."""
    store = new_store(num_envs, capacity, period, hidden_size, frame_shape, dtype, device="meta")
    return sum(t.nbytes for t in store.values())


def store_add(store, frames, first, actions, rewards, terminations, truncations):
    """Append one step of every env: the newest frame of each next obs, whether it began an episode (num_envs,),
    and the action, reward, termination and truncation flags of the step that led there (num_envs,) each. The very
    first call stores the reset frames (first all True); its step data land in a slot rewritten before any read."""
    slots = store["frames"].shape[1]
    # trick: index_copy_ at a device index, no host sync (and no Python int: one graph for every step)
    previous, slot = ((store["count"] - 1) % slots).view(1), (store["count"] % slots).view(1)
    store["actions"].index_copy_(1, previous, actions[:, None])
    store["rewards"].index_copy_(1, previous, rewards[:, None])
    store["terminations"].index_copy_(1, previous, terminations[:, None])
    store["truncations"].index_copy_(1, previous, truncations[:, None])
    store["frames"].index_copy_(1, slot, frames[:, None])
    store["first"].index_copy_(1, slot, first[:, None])
    store["count"] += 1


def sequence_slots(store, start):
    """The sequence slots (num_envs,) of the sequences that begin at stream position `start` (a multiple of P)."""
    num_envs, slots = store["first"].shape
    per_env = store["starts"].shape[0] // num_envs
    period = slots // per_env
    return torch.arange(num_envs, device=store["starts"].device) * per_env + (start // period) % per_env


def store_state(store, index, start, h, c):
    """Keep the actor's LSTM state (before observation `start`) with the sequences of the slots `index`."""
    store["starts"][index] = start
    store["h"][index] = h.to(store["h"].device)
    store["c"][index] = c.to(store["c"].device)


def stack_frames(store, env, pos, stack):
    """The observations at stream positions pos of the envs env (same shape): stacks of `stack` frames, newest last.
    Going back from pos, a frame that began an episode is repeated in place of the older ones, as envpool does."""
    slots = store["frames"].shape[1]
    if stack == 1:
        return store["frames"][env, pos % slots]
    index = [pos]
    for _ in range(stack - 1):
        newer = index[0]
        index.insert(0, torch.where(store["first"][env, newer % slots], newer, newer - 1))
    return store["frames"][env[..., None], torch.stack(index, dim=-1) % slots]


def sample_sequences(store, index, length):
    """The sequences of the slots `index` (B,), time-major (length, B, ...), with their stored LSTM states (B, H)."""
    num_envs, slots = store["first"].shape
    env = (index // (store["starts"].shape[0] // num_envs))[:, None]
    pos = store["starts"][index][:, None] + torch.arange(length, device=index.device)
    stack = STACK if store["frames"].dim() == 4 else 1
    at, before = pos % slots, (pos - 1) % slots
    batch = dict(obs=stack_frames(store, env, pos, stack))
    batch |= {f"prev_{key}": store[key][env, before] for key in ("actions", "rewards")}
    batch |= {key: store[key][env, at] for key in ("first", "actions", "rewards", "terminations", "truncations")}
    batch = {key: value.transpose(0, 1) for key, value in batch.items()}
    return batch | dict(h=store["h"][index], c=store["c"][index])


def add_sequences(store, count, length, period, alpha):
    """After a write brought the frames per env to `count`: the sequences it completed enter at the running max
    priority, those whose oldest frame it overwrote leave (their leaves go to zero). Host ints decide: no sync."""
    slots = store["frames"].shape[1]
    start = count - length
    if start >= 0 and start % period == 0:
        index = sequence_slots(store, start)
        tree_update(store["tree"], index, (store["max_priority"] ** alpha).expand(index.shape))
    gone = count - 1 + STACK - 1 - slots  # the sequence whose stacks read the frame just overwritten
    if gone >= 0 and gone % period == 0:
        index = sequence_slots(store, gone)
        tree_update(store["tree"], index, torch.zeros(index.shape, device=index.device))


def update_priorities(store, index, priorities, alpha):
    """New priorities (B,) of the sampled slots: the leaves get priority^alpha, the running max follows."""
    tree_update(store["tree"], index, priorities.to(store["tree"].device) ** alpha)
    store["max_priority"].copy_(torch.maximum(store["max_priority"], priorities.max().to(store["tree"].device)))


def part(batch, start, stop):
    """The network's inputs for the steps [start, stop) of a batch."""
    return tuple(batch[key][start:stop] for key in ("obs", "prev_actions", "prev_rewards", "first"))


def update(q_network, target_network, optimizer, batch, weights, burn_in, gamma, n_step, eps, max_grad_norm, eta):
    """One gradient step on a batch of sequences; returns the detached losses and the sequences' new priorities."""
    state = (batch["h"], batch["c"])
    with torch.no_grad():
        # burn-in: unroll the stored state through the first steps, for both networks, without learning from them
        online_state, target_state = state, state
        if burn_in > 0:
            _, online_state = q_network(*part(batch, 0, burn_in), state)
            _, target_state = target_network(*part(batch, 0, burn_in), state)
        q_target, _ = target_network(*part(batch, burn_in, None), target_state)
    q_values, _ = q_network(*part(batch, burn_in, None), online_state)
    learned = {key: batch[key][burn_in:] for key in ("rewards", "terminations", "truncations", "first")}
    with torch.no_grad():
        targets, valid = nstep_double_q_targets(
            learned["rewards"], q_values.detach(), q_target, learned["terminations"], learned["truncations"],
            learned["first"], gamma, n_step, eps)  # fmt: skip
    taken = q_values[:-1].gather(-1, batch["actions"][burn_in:-1, :, None]).squeeze(-1)
    td = targets - taken
    loss = (weights * (0.5 * td.square() * valid).sum(dim=0)).mean()
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
    optimizer.step()
    priorities = priority_mix(td.detach().abs(), valid, eta)
    return dict(loss=loss.detach(), q_values=taken.detach().mean()), priorities


def sample_and_update(q_network, target_network, optimizer, store, args, copy_target):
    """Sample, update, write the priorities back, and copy the online network to the target where copy_target is set."""
    # trick: the whole update is one function of device tensors, compiled and captured whole: the sum-tree walk, the
    # sequence gathers and the priority write-back stay on the device; the target copy is a masked copy in the graph
    index, weights = tree_sample(store["tree"], args.batch_size, args.importance_sampling_exponent)
    device = copy_target.device
    batch = {k: v.to(device) for k, v in sample_sequences(store, index, args.burn_in + args.seq_len).items()}
    out, priorities = update(
        q_network, target_network, optimizer, batch, weights.to(device), args.burn_in, args.gamma,
        args.n_step, args.value_rescale_eps, args.max_grad_norm, args.priority_eta,
    )  # fmt: skip
    update_priorities(store, index, priorities, args.priority_exponent)
    with torch.no_grad():
        for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
            target_network_param.copy_(torch.where(copy_target, q_network_param, target_network_param))
    return out


def act(q_network, obs, prev_actions, prev_rewards, first, h, c, epsilons):
    """Every env's epsilon-greedy action and the LSTM's next state, all on the device."""
    with torch.no_grad():  # trick: no host branch on the random draw: both choices are computed and one is kept per env
        q_values, (h, c) = q_network(obs[None], prev_actions[None], prev_rewards[None], first[None], (h, c))
    explore = torch.rand(len(epsilons), device=epsilons.device) < epsilons
    random_actions = torch.randint(q_values.shape[-1], (len(epsilons),), device=epsilons.device)
    return torch.where(explore, random_actions, q_values[0].argmax(dim=1)), h, c


def packed(arrays, device):
    """A host byte buffer (pinned for a GPU) and its device copy, laid out as `arrays` end to end at 16-byte boundaries,
    filled with them and sent up. Returns upload(*arrays), which does so again, and views of the arrays in both."""
    # trick: a step's host data goes up in one pinned, non_blocking copy (from pageable memory, each array's copy was
    # a synchronous one of its own); numpy fills the buffer (torch's CPU copy spins OpenMP threads on envpool's cores)
    tensors = [torch.from_numpy(x) for x in arrays]
    starts = np.cumsum([0] + [-(-t.nbytes // 16) * 16 for t in tensors])
    host = torch.zeros(int(starts[-1]), dtype=torch.uint8, pin_memory=device.type == "cuda")
    up = torch.zeros_like(host, device=device)
    views = lambda buffer: [buffer[a : a + t.nbytes].view(t.dtype).view(t.shape) for a, t in zip(starts, tensors)]
    host_arrays = [view.numpy() for view in views(host)]

    def upload(*step):
        for array, x in zip(host_arrays, step):
            np.copyto(array, x)
        up.copy_(host, non_blocking=True)

    upload(*arrays)
    return upload, views(host), views(up)


def check_env_id(env_id):
    """An envpool Atari game, or a classic-control task with discrete actions and a flat observation vector."""
    try:
        obs_space, act_space = spaces(env_id)
        if len(obs_space.shape) == 1 and isinstance(act_space, gym.spaces.Discrete):
            return  # CartPole-v1, Acrobot-v1...: the small tests' tasks
    except Exception:
        pass  # not an envpool task: check_atari_env says so
    bk.check_atari_env(__file__, env_id)


def frame_shape_of(env_id, mask_velocity):
    """The shape and dtype of one stored frame: the newest 84x84 Atari frame, or the whole observation vector."""
    space = spaces(env_id)[0]
    if is_atari(space):
        return (84, 84), torch.uint8
    return (len(CARTPOLE_POSITIONS) if mask_velocity else space.shape[0],), torch.float32


def buffer_device(args, device):
    """--buffer-device, or by default the training device where the replay memory fits (2 GiB left over)."""
    frame_shape, dtype = frame_shape_of(args.env_id, args.mask_velocity)
    period = args.seq_len - args.overlap
    need = store_bytes(args.num_envs, args.buffer_size, period, args.hidden_size, frame_shape, dtype)
    chosen = torch.device(args.buffer_device or "cpu")
    if args.buffer_device is None and device.type == "cuda" and need + 2 * 2**30 < torch.cuda.mem_get_info(device)[0]:
        chosen = device
    bk.check_memory(__file__, f"--buffer-size {args.buffer_size}", need, chosen)
    if args.cudagraphs and chosen != device:  # (trick: CUDA graphs) the graph samples the memory: it must be on its GPU
        bk.fail(__file__, f"--cudagraphs needs the replay memory on the GPU; it is on the CPU (--buffer-device cpu, or "
                f"--buffer-size {args.buffer_size} too large for the GPU)")  # fmt: skip
    return chosen


def check_args(args):
    """Reject bad input before any training."""
    if args.buffer_device not in (None, "cpu", "cuda"):
        bk.fail(__file__, f"--buffer-device must be cpu or cuda, got {args.buffer_device!r}")
    if args.buffer_device == "cuda" and not (torch.cuda.is_available() and args.cuda):
        bk.fail(__file__, "--buffer-device cuda needs CUDA, and none is available")
    positive = ("num_envs", "total_timesteps", "buffer_size", "batch_size", "hidden_size", "seq_len", "n_step")
    bk.check_flags(__file__, args, positive + ("train_frequency", "target_network_frequency"))
    if args.eval_checkpoint is not None:
        return
    for flag in ("burn_in", "overlap", "learning_starts"):
        if getattr(args, flag) < 0:
            bk.fail(__file__, f"--{flag.replace('_', '-')} must not be negative, got {getattr(args, flag)}")
    if args.overlap >= args.seq_len:
        bk.fail(__file__, f"--overlap {args.overlap} must be smaller than --seq-len {args.seq_len}")
    if args.seq_len < 2:
        bk.fail(__file__, f"--seq-len must be at least 2 (the last step only bootstraps), got {args.seq_len}")
    if not 0.0 < args.gamma <= 1.0:
        bk.fail(__file__, f"--gamma must be in (0, 1], got {args.gamma}")
    check_env_id(args.env_id)
    if args.mask_velocity and args.env_id != "CartPole-v1":
        bk.fail(__file__, f"--mask-velocity hides CartPole-v1's velocities; --env-id is {args.env_id!r}")
    if args.total_timesteps < args.num_envs:
        bk.fail(__file__, f"--total-timesteps {args.total_timesteps} is smaller than one iteration (--num-envs)")
    length, period = args.burn_in + args.seq_len, args.seq_len - args.overlap
    per_env = args.buffer_size // args.num_envs // period * period
    if per_env < length + STACK:
        bk.fail(__file__, f"--buffer-size {args.buffer_size} holds {per_env} frames per env (of --num-envs), fewer "
                f"than one sequence needs (--burn-in + --seq-len + {STACK} = {length + STACK})")  # fmt: skip
    if args.batch_size > args.num_envs * (per_env // period):
        bk.fail(__file__, f"--batch-size {args.batch_size} is larger than the buffer's "
                f"{args.num_envs * (per_env // period)} sequences (--buffer-size {args.buffer_size})")  # fmt: skip
    if args.learning_starts < length * args.num_envs:
        bk.fail(__file__, f"--learning-starts {args.learning_starts} comes before the first whole sequence: it must "
                f"be at least (--burn-in + --seq-len) * --num-envs = {length * args.num_envs}")  # fmt: skip
    steps = args.total_timesteps // args.num_envs * args.num_envs
    # gradient steps fall on the env steps s >= learning_starts with s % train_frequency == 0
    if -(-args.learning_starts // args.train_frequency) * args.train_frequency >= steps:
        bk.fail(__file__, f"--learning-starts {args.learning_starts} leaves no gradient step in the {steps} steps "
                "(--total-timesteps)")  # fmt: skip


def evaluate(args, device):
    """Play --eval-episodes full episodes with a checkpoint, epsilon-greedy at --eval-epsilon."""
    checkpoint = bk.load_checkpoint(__file__, args.eval_checkpoint, "model")
    train_args = checkpoint["args"]
    args.env_id, num_envs, mask = train_args["env_id"], train_args["num_envs"], train_args["mask_velocity"]
    with bk.Run(__file__, args, device, mode="eval") as run:
        envs = make_env(args.env_id, num_envs, args.seed)
        obs_shape = observe(np.zeros((1, *envs.observation_space.shape)), mask).shape[1:]
        q_network = QNetwork(obs_shape, envs.action_space.n, train_args["hidden_size"]).to(device)
        q_network.load_state_dict(checkpoint["model"])
        # what the LSTM carries from one step to the next: its state, the previous action and reward, episode starts
        memory = dict(state=tuple(torch.zeros(num_envs, train_args["hidden_size"], device=device) for _ in range(2)))
        memory |= dict(actions=np.zeros(num_envs, np.int64), rewards=np.zeros(num_envs, np.float32))
        memory["first"], running_returns = np.ones(num_envs, dtype=bool), np.zeros(num_envs)

        def act(obs):
            with torch.no_grad():
                inputs = (observe(obs, mask), memory["actions"], memory["rewards"], memory["first"])
                inputs = [torch.as_tensor(x, device=device)[None] for x in inputs]
                q_values, memory["state"] = q_network(*inputs, memory["state"])
            actions = q_values[0].argmax(dim=1).cpu().numpy()
            explore = np.random.random(num_envs) < args.eval_epsilon
            memory["actions"] = np.where(explore, np.random.randint(envs.action_space.n, size=num_envs), actions)
            return memory["actions"]

        def episodes_of(rewards, terminations, truncations, infos):
            memory["rewards"], memory["first"] = rewards.astype(np.float32), infos["elapsed_step"] == 0
            return bk.game_returns(running_returns, rewards, terminations | truncations)

        run.play(envs, act, episodes_of, args.eval_episodes)


def main(args):
    check_args(args)
    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate(args, device)
    store_device = buffer_device(args, device)
    num_iterations = args.total_timesteps // args.num_envs
    length, period = args.burn_in + args.seq_len, args.seq_len - args.overlap

    # steps/s leaves out the iterations before the first gradient step, and --measure-burnin more (the default 100
    # covers the twin's update capture at its 3rd call, 2 * train_frequency / num_envs = 40 iterations in at defaults)
    burnin = -(-args.learning_starts // args.train_frequency) * args.train_frequency // args.num_envs
    with bk.Run(__file__, args, device, burnin=burnin + args.measure_burnin, buffer_device=store_device.type) as run:
        # env setup
        envs = make_env(args.env_id, args.num_envs, args.seed)
        n_actions = envs.action_space.n
        obs = observe(envs.reset()[0], args.mask_velocity)
        q_network = QNetwork(obs.shape[1:], n_actions, args.hidden_size).to(device)
        # trick: fused Adam updates every parameter in one kernel (and spares torch.compile a kernel per parameter);
        # capturable keeps the step counts on the GPU, so a step never syncs and can be captured
        capturable = device.type == "cuda"
        optimizer = optim.Adam(
            q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True, capturable=capturable
        )
        target_network = QNetwork(obs.shape[1:], n_actions, args.hidden_size).to(device)
        target_network.load_state_dict(q_network.state_dict())
        # trick: the per-env epsilons live on the device, where the policy step draws its exploration
        epsilons = actor_epsilons(args.num_envs, args.epsilon_base, args.epsilon_alpha).to(device)

        frame_shape, dtype = frame_shape_of(args.env_id, args.mask_velocity)
        store = new_store(args.num_envs, args.buffer_size, period, args.hidden_size, frame_shape, dtype, store_device)
        run.add_to_results(buffer_bytes=sum(t.nbytes for t in store.values()))
        # trick: policy step, replay write and update as functions of device tensors: each compiled and captured whole
        policy, add = partial(act, q_network), partial(store_add, store)
        update_step = partial(sample_and_update, q_network, target_network, optimizer, store, args)
        copy_yes, copy_no = torch.tensor(True, device=device), torch.tensor(False, device=device)
        if args.compile:  # trick: torch.compile fuses the small ops of the LSTM steps, the losses and the sampler
            policy = torch.compile(policy, fullgraph=True)
            update_step = torch.compile(update_step)
        if args.cudagraphs:
            # trick: replay each as one CUDA graph: inputs are copied into static buffers, outputs cloned out; the
            # replay memory is written in place (its tensors are the graphs' own); the warm-up calls compile
            policy = CudaGraphModule(policy, warmup=3)
            add = CudaGraphModule(add, warmup=3)
            update_step = CudaGraphModule(update_step, warmup=3)
        running_returns, zeros = np.zeros(args.num_envs), np.zeros(args.num_envs)
        newest = (lambda o: o[:, -1]) if len(frame_shape) == 2 else (lambda o: o)

        if args.save_model:  # Run writes the checkpoint when the run ends, also when Ctrl-C or SIGTERM stops it
            run.save = lambda: bk.save_checkpoint(run.model_path, args, model=q_network.state_dict())
        # TRY NOT TO MODIFY: start the game
        to_store = lambda x, dtype=None: torch.as_tensor(x, dtype=dtype).to(store_device)
        no_step = (to_store(zeros, torch.long), to_store(zeros, torch.float32), to_store(zeros, torch.bool))
        store_add(store, to_store(newest(obs)), to_store(zeros == 0), *no_step, to_store(zeros, torch.bool))
        state = tuple(torch.zeros(args.num_envs, args.hidden_size, device=device) for _ in range(2))
        prev_actions = torch.zeros(args.num_envs, dtype=torch.long, device=device)
        # trick: the step's obs, episode starts, rewards and ends go up in one copy (packed, above), the reset's too;
        # the policy and the store read views of it (a store on the CPU: of the host buffer): the same tensors every
        # step, one compiled graph. The host rewrites the buffer after the next actions.cpu(): it waits for the stream
        upload, host, on_device = packed((obs, zeros == 0, zeros.astype(np.float32), zeros != 0, zeros != 0), device)
        stored = on_device if store_device == device else host  # frames, first, rewards, terminations, truncations
        obs, first, prev_rewards = on_device[:3]
        # a stopped run goes on: Run writes this state at an iteration's end, --resume restores it (see bookkeeping.py)
        global_step, updates, logged, out, begun = 0, 0, 0, None, run.iterations_done  # begun: the memory's start
        run.state = lambda: dict(
            q_network=q_network, target_network=target_network, optimizer=optimizer, replay=(store, begun),
            progress=(global_step, updates, logged, out),  # env and gradient steps, those logged, the last losses
            envs=(envs, obs, state, prev_actions, prev_rewards, first, running_returns, global_step))  # fmt: skip
        (global_step, updates, logged, out), (*_, envs_step), (_, begun) = run.resume("progress", "envs", "replay")
        if envs_step != global_step or begun:  # new episodes (envpool's), or a new memory: an episode starts here
            at = (run.iterations_done - begun) % store["first"].shape[1]  # the obs' position: the step 2 back ends
            store["frames"][:, at], store["first"][:, at], store["truncations"][:, at - 2] = to_store(newest(obs)), 1, 1
        for iteration in run.progress(range(num_iterations)):
            # a sequence starts here every `period` steps: it keeps the LSTM state the actor has now
            if (iteration - begun) % period == 0:
                store_state(store, sequence_slots(store, iteration - begun), iteration - begun, *state)

            # ALGO LOGIC: put action logic here
            actions, *state = policy(obs, prev_actions, prev_rewards, first, *state, epsilons)  # (trick: device policy)

            # TRY NOT TO MODIFY: execute the game and log data.
            # (trick: the actions come from the device policy step: one read a step, for the env)
            next_obs, rewards, terminations, truncations, infos = envs.step(actions.cpu().numpy())
            global_step += args.num_envs
            ended = terminations | truncations  # a game's length: envpool's count of its steps where it ends
            for ret, game_length in zip(bk.game_returns(running_returns, rewards, ended), infos["elapsed_step"][ended]):
                run.episode(global_step, ret, int(game_length))

            # save data to the replay memory: the newest frame once, whether it began an episode, the step's data
            next_obs = observe(next_obs, args.mask_velocity)
            next_first = infos["elapsed_step"] == 0
            upload(next_obs, next_first, rewards, terminations, truncations)  # (trick: one upload: obs, first too)
            add(newest(stored[0]), stored[1], actions.to(store_device), *stored[2:])  # (trick: from the upload)
            add_sequences(store, iteration - begun + 2, length, period, args.priority_exponent)
            prev_actions = actions  # (trick: the actions are on the device already)

            # ALGO LOGIC: training, one gradient step at each env step s >= learning_starts with
            # s % train_frequency == 0 (those of the steps this iteration covers; a new memory's: from begun on)
            covered = range(max(global_step - args.num_envs, args.learning_starts + begun * args.num_envs), global_step)
            train_steps = [s for s in covered if s % args.train_frequency == 0]
            for _ in train_steps:
                # (trick: sample, update, priority write-back and target copy: one captured call, below)
                updates += 1
                # update the target network
                # trick: the target-copy flag is a tensor: no recompile as it changes
                out = update_step(copy_yes if updates % args.target_network_frequency == 0 else copy_no)

            run.tick(global_step)
            # every 100 env steps (CleanRL's DQN) and at the end: SPS, new losses read in one go, stop if non-finite
            if global_step // 100 > (global_step - args.num_envs) // 100 or iteration == num_iterations - 1:
                logs = {}
                if updates > logged:
                    logged, losses = updates, run.check_finite(global_step, out)
                    logs = {"losses/td_loss": losses["loss"], "losses/q_values": losses["q_values"]}
                run.report(global_step, logs)
        envs.close()
        run.add_to_results(updates=updates)


if __name__ == "__main__":
    main(tyro.cli(Args))
