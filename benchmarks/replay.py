"""Replay buffers as the scripts define them, timed against what real RL runs need of them.

A study of replay storage in real training jobs (``benchmarks/replay_storage_rates.csv``, which cites it) gives,
per algorithm, the buffer size, the bytes per item and the add and sample rates one job needs. This
file loads each script's own buffer functions (it copies none of them), fills a buffer at the study's
capacity and beyond, and times:

* ``add``: one call of the script's add function with what one env step brings (its default env count);
* ``sample``: one call of its sample function with its default batch size (for the Atari frame store,
  the obs and next-obs stacks are rebuilt from single frames as part of the sample; for R2D2, the sum tree's
  prioritized draw and the rebuilt sequences);
* ``update`` (prioritized replay): one write-back of a sampled batch's new priorities.

Each row gives items/s and MB/s (add: bytes stored per item; sample: bytes delivered per item) beside
the study's required rate for that algorithm, and the bytes the buffer stores per item. The twins'
functions are also timed under ``torch.compile`` (as the twins run them) unless ``--no-compile``.

A second section compares R2D2's prioritized samplers at 1e4, 1e5 and 1e6 slots: the sum tree as the twin
defines it (its own ``new_sum_tree``, ``tree_sample`` and ``update_priorities``) against stratified draws over
a cumulative sum (``cumsum_sample`` below, the alternative: ``torch.cumsum`` + ``torch.searchsorted``, the
update an index write), eager and compiled. Each sampler's draws are checked against priority^alpha / sum
(chi-square) before it is timed; one that fails is reported as ``FAIL`` and not timed.

Run::

    python benchmarks/replay.py [--quick] [--device cpu|cuda] [--buffers dqn_atari,sac] [--only samplers]
                                [--out DIR]

A full run writes ``benchmarks/results/replay_<device-tag>.md`` and ``.json`` (committed); ``--quick``
(small capacities, for CI; the samplers at 1e4 only) writes ``runs/benchmarks/replay_<device-tag>_quick.*``
and never replaces a full report; ``--only samplers`` (or ``buffers``) writes ``replay_<device-tag>_samplers.*``
beside it, not over it. ``python plots/plot.py --replay benchmarks/results/replay_cpu.md`` splices the table into
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (  # noqa: E402  (the machine stamp, the report policy, a script as a module)
    FULL_OUT,
    QUICK_OUT,
    ROOT,
    device_tag,
    load_script,
    machine_info,
    machine_line,
    stopped_by_signal,
    write_or_refuse,
)

STUDY = ROOT / "benchmarks" / "replay_storage_rates.csv"  # the study's rates, copied in with their source
SECTIONS = ["buffers", "samplers"]  # the buffers against the study's rates; R2D2's sum tree against a cumsum sampler


@dataclass
class Bench:
    """One filled buffer: add() writes one env step, sample() draws one batch; sizes in items and bytes."""

    add: Callable
    sample: Callable
    add_items: int
    sample_items: int
    stored_bytes: int  # the whole buffer
    capacity: int
    storage: dict  # the buffer's tensors, as the script made them
    update: Callable | None = None  # prioritized replay: one write-back of the sampled items' new priorities
    update_items: int = 0


# ---------------------------------------------------------------------------------------------------
# Each buffer: how to build and drive it with its script's own functions
# ---------------------------------------------------------------------------------------------------


def flat_rows(module, capacity, device, compiled, obs_dim, act_dim=None, num_envs=1, batch_size=128):
    """Rows of (obs, action, reward, next_obs, termination), uniform sampling: dqn*.py (discrete actions, act_dim
    None), sac_*.py and td3_*.py (continuous actions of act_dim)."""
    if act_dim is None:
        buffer = module.make_buffer(capacity, obs_dim, device)
        actions = torch.zeros(num_envs, dtype=torch.long, device=device)
    else:
        buffer = module.make_buffer(capacity, obs_dim, act_dim, device)
        actions = torch.zeros(num_envs, act_dim, device=device)
    twin = module.__name__.endswith("_torchcompile")
    count = torch.tensor(capacity, device=device) if twin else capacity  # the twin's write index is a tensor
    step = dict(
        obs=torch.randn(num_envs, obs_dim, device=device),
        actions=actions,
        rewards=torch.ones(num_envs, device=device),
        next_obs=torch.randn(num_envs, obs_dim, device=device),
        terminations=torch.zeros(num_envs, device=device),
    )
    add_fn, sample_fn = module.buffer_add, module.buffer_sample
    if compiled:
        add_fn, sample_fn = torch.compile(add_fn, fullgraph=True), torch.compile(sample_fn, fullgraph=True)
    # the count is not advanced between calls: every call writes the same amount at a full buffer's position
    return Bench(
        add=lambda: add_fn(buffer, count, step),
        sample=lambda: sample_fn(buffer, count, batch_size),
        add_items=num_envs,
        sample_items=batch_size,
        stored_bytes=sum(t.nbytes for t in buffer.values()),
        capacity=capacity,
        storage=buffer,
    )


def dqn_flat(module, capacity, device, compiled, num_envs=1, batch_size=128):
    """dqn.py / dqn_torchcompile.py on CartPole: 4 floats of obs, batch 128. Both write one numpy buffer in place; the
    eager script samples it with numpy and moves the batch to the device, the twin samples tensors on the device (on a
    CPU the buffer's own memory; on CUDA a copy, and its add here includes the upload of the written row)."""
    buffer = module.make_buffer(capacity, 4)
    storage = {key: torch.from_numpy(value) for key, value in buffer.items()}  # the buffer's memory as tensors
    rng = np.random.default_rng(0)
    obs = [rng.standard_normal((num_envs, 4), dtype=np.float32) for _ in range(2)]
    step = dict(obs=obs[0], actions=np.zeros(num_envs, dtype=np.int64), rewards=np.ones(num_envs), next_obs=obs[1])
    step["terminations"] = np.zeros(num_envs, dtype=bool)
    add = lambda: module.buffer_add(buffer, capacity, step)  # noqa: E731
    sample = lambda: module.buffer_sample(buffer, capacity, batch_size, device)  # noqa: E731
    if module.__name__.endswith("_torchcompile"):
        replay, count = {key: value.to(device) for key, value in storage.items()}, torch.tensor(capacity, device=device)
        sample_fn = torch.compile(module.buffer_sample, fullgraph=True) if compiled else module.buffer_sample
        sample = lambda: sample_fn(replay, count, batch_size)  # noqa: E731
        if device.type == "cuda":
            storage = {key: value.pin_memory() for key, value in storage.items()}
            buffer = {key: value.numpy() for key, value in storage.items()}
            add = lambda: module.upload(replay, storage, capacity, module.buffer_add(buffer, capacity, step))  # noqa: E731
    return Bench(
        add=add,
        sample=sample,
        add_items=num_envs,
        sample_items=batch_size,
        stored_bytes=sum(value.nbytes for value in buffer.values()),
        capacity=capacity,
        storage=storage,
    )


def mujoco_flat(module, capacity, device, compiled):
    """sac_* / td3_continuous_action*.py on HalfCheetah: 17 floats of obs, 6 of action, batch 256."""
    return flat_rows(module, capacity, device, compiled, obs_dim=17, act_dim=6, batch_size=256)


def dqn_frames(module, capacity, device, compiled, num_envs=1, batch_size=32):
    """dqn_atari_envpool*.py: single 84x84 frames per env, stacks rebuilt by index when sampled."""
    store = module.new_frame_store(num_envs, capacity, device)
    store["count"].fill_(store["frames"].shape[1] * 3)  # wrapped around several times: every slot is in use
    frames = torch.randint(0, 256, (num_envs, 84, 84), dtype=torch.uint8, device=device)
    first = torch.zeros(num_envs, dtype=torch.bool, device=device)
    actions = torch.zeros(num_envs, dtype=torch.long, device=device)
    rewards = torch.ones(num_envs, device=device)
    add_fn, sample_fn = module.store_add, module.sample
    if compiled:
        add_fn, sample_fn = torch.compile(add_fn), torch.compile(sample_fn)
    return Bench(
        add=lambda: add_fn(store, frames, first, actions, rewards, first),
        sample=lambda: sample_fn(store, batch_size),
        add_items=num_envs,
        sample_items=batch_size,
        stored_bytes=sum(t.nbytes for t in store.values()),
        capacity=capacity,
        storage=store,
    )


def r2d2_sequences(module, capacity, device, compiled, frame_shape, dtype, num_envs=32, batch_size=64):
    """r2d2_atari_envpool*.py: `capacity` sequences of single frames per env stream (period 40, 40 burn-in + 80
    steps), a sum tree of priorities. add: 40 env steps of the 32 envs (store_add, add_sequences), which complete 32
    sequences; sample: the tree's prioritized draw and the rebuilt sequences (obs stacks, previous action and
    reward, flags, stored LSTM state); update: the new priorities of a sampled batch written back."""
    period, length, hidden, alpha, beta = 40, 120, 512, 0.9, 0.6
    store = module.new_store(num_envs, capacity * period, period, hidden, frame_shape, dtype, device)
    sequences, slots = store["starts"].shape[0], store["frames"].shape[1]
    per_env = sequences // num_envs
    # a full store, wrapped around several times: every sequence slot holds a sequence with a priority
    store["starts"].copy_(torch.arange(sequences, device=device) % per_env * period + 3 * slots)
    module.tree_update(
        store["tree"], torch.arange(sequences, device=device), torch.rand(sequences, device=device) + 0.1
    )
    store["count"].fill_(3 * slots)
    frames = torch.zeros((num_envs, *frame_shape), dtype=dtype, device=device)
    flags = torch.zeros(num_envs, dtype=torch.bool, device=device)
    actions = torch.zeros(num_envs, dtype=torch.long, device=device)
    rewards = torch.ones(num_envs, device=device)
    priorities = torch.rand(batch_size, device=device)

    def add():
        count = int(store["count"])  # one host read per 40 steps: the scripts keep this count on the host too
        for step in range(period):
            add_fn(store, frames, flags, actions, rewards, flags, flags)
            module.add_sequences(store, count + step + 1, length, period, alpha)

    def sample(store):
        index, weights = module.tree_sample(store["tree"], batch_size, beta)
        return module.sample_sequences(store, index, length) | dict(index=index, weights=weights)

    def update(store, index):
        module.update_priorities(store, index, priorities, alpha)

    add_fn, sample_fn, update_fn = module.store_add, sample, update
    if compiled:
        add_fn, sample_fn, update_fn = (torch.compile(f, fullgraph=True) for f in (add_fn, sample_fn, update_fn))
    index = sample(store)["index"]
    batch_major = ("h", "c", "index", "weights")  # the others are time-major (length, B, ...)
    return Bench(
        add=add,
        sample=lambda: {k: v if k in batch_major else v.movedim(0, 1) for k, v in sample_fn(store).items()},
        add_items=num_envs,
        sample_items=batch_size,
        stored_bytes=sum(t.nbytes for t in store.values()),
        capacity=sequences,
        storage=store,
        update=lambda: update_fn(store, index),
        update_items=batch_size,
    )


def r2d2_atari(module, capacity, device, compiled):
    return r2d2_sequences(module, capacity, device, compiled, (84, 84), torch.uint8)


def r2d2_vector(module, capacity, device, compiled):
    """The vector-observation path (CartPole: 4 float32 per step), where 1e5 and 1e6 sequences fit in memory."""
    return r2d2_sequences(module, capacity, device, compiled, (4,), torch.float32)


@dataclass
class Case:
    name: str  # the buffer, as the table names it
    scripts: tuple[str, ...]  # eager script, twin
    build: Callable  # (module, capacity, device, compiled) -> Bench
    study: str | None  # the study's algorithm this buffer serves (None: no matching row)
    capacities: tuple[int, ...]
    quick_capacities: tuple[int, ...]


CASES = {
    "dqn": Case("DQN, CartPole (flat rows)", ("dqn", "dqn_torchcompile"), dqn_flat, None, (10_000, 1_000_000), (1000,)),
    "dqn_atari": Case(
        "DQN Atari (single-frame store)",
        ("dqn_atari_envpool", "dqn_atari_envpool_torchcompile"),
        dqn_frames,
        "DQN",
        (400_000, 1_000_000),
        (2000,),
    ),
    "sac": Case(
        "SAC, HalfCheetah (flat rows)",
        ("sac_continuous_action", "sac_continuous_action_torchcompile"),
        mujoco_flat,
        "SAC",
        (1_000_000,),
        (1000,),
    ),
    # 1e4 sequences of Atari frames are 400k frames (2.8 GB); 1e5 would be 28 GB, so the larger sizes (where the
    # sum tree's depth grows) are measured on the vector-observation store
    "r2d2_atari": Case(
        "R2D2 Atari (sequences of single frames, sum tree)",
        ("r2d2_atari_envpool", "r2d2_atari_envpool_torchcompile"),
        r2d2_atari,
        "R2D2",
        (10_000,),
        (64,),
    ),
    "r2d2_vector": Case(
        "R2D2 CartPole (vector sequences, sum tree)",
        ("r2d2_atari_envpool", "r2d2_atari_envpool_torchcompile"),
        r2d2_vector,
        "R2D2",
        (10_000, 100_000, 1_000_000),
        (64,),
    ),
    # the study has no TD3 job; SAC's (the same uniform 1M-row MuJoCo replay) is the nearest need
    "td3": Case(
        "TD3, HalfCheetah (flat rows; need: SAC's)",
        ("td3_continuous_action", "td3_continuous_action_torchcompile"),
        mujoco_flat,
        "SAC",
        (1_000_000,),
        (1000,),
    ),
}


# ---------------------------------------------------------------------------------------------------
# R2D2's prioritized sampler: the twin's sum tree against stratified draws over a cumulative sum
# ---------------------------------------------------------------------------------------------------

SAMPLER_SCRIPT = "r2d2_atari_envpool_torchcompile"  # the sum tree as the twin defines it (its own functions)
SAMPLER_CAPACITIES, SAMPLER_QUICK_CAPACITIES = (10_000, 100_000, 1_000_000), (10_000,)
SAMPLER_BATCH, SAMPLER_ALPHA, SAMPLER_BETA = 64, 0.9, 0.6  # R2D2's batch, priority and importance exponents
CHECK_BINS, CHECK_CALLS = 64, 1000  # the distribution check: 64k draws, counted in 64 bins of slots


def cumsum_sample(leaves, batch_size, beta):
    """The alternative under comparison (not in any script): stratified draws over the cumulative sum of the
    leaves (priority ** alpha per slot, kept so by cumsum_update), one uniform per stratum, found by searchsorted;
    importance weights as the twin's tree_sample gives them. Every draw reads every slot: linear in the capacity."""
    cdf = torch.cumsum(leaves, 0)
    u = (torch.arange(batch_size, device=leaves.device) + torch.rand(batch_size, device=leaves.device)) / batch_size
    # right=True: the first slot whose cumulative sum exceeds u, so a zero leaf is never drawn
    index = torch.searchsorted(cdf, u * cdf[-1], right=True).clamp(max=leaves.shape[0] - 1)
    p = leaves[index]
    return index, (p / p.min()) ** -beta


def cumsum_update(store, index, priorities, alpha):
    """The cumulative-sum store's priority update: an index write of priority ** alpha (the sum is made per draw),
    the running max kept as the twin's update_priorities keeps it."""
    store["leaves"].index_put_((index,), priorities**alpha)
    store["max_priority"].copy_(torch.maximum(store["max_priority"], priorities.max()))


def check_priorities(capacity, device, generator=None):
    """Priorities that make a wrong sampler visible in CHECK_BINS bins of slots (slot i in bin i % CHECK_BINS): the
    bins' masses grow 64-fold, so uniform draws or draws shifted by one slot fail; a few slots are empty (zero)."""
    slot = torch.arange(capacity)
    priorities = (torch.rand(capacity, generator=generator) + 0.5) * (1 + slot % CHECK_BINS)
    priorities[slot % 997 == 5] = 0.0
    return priorities.to(device)


@dataclass
class Sampler:
    """One filled prioritized store: sample() draws a batch (index, weights); update() writes the new priorities
    `new` of a fixed sampled batch back; step() samples and writes `new` back at the drawn slots, as the twin's update
    does; leaves() is priority ** alpha per slot as the store holds it."""

    sample: Callable
    update: Callable
    step: Callable
    leaves: Callable
    new: torch.Tensor


def tree_sampler(module, capacity, device, compiled, priorities, batch_size=SAMPLER_BATCH):
    """The twin's sum tree, driven by its own new_sum_tree, tree_sample and update_priorities."""
    store = dict(tree=module.new_sum_tree(capacity, device), max_priority=torch.ones((), device=device))
    module.update_priorities(store, torch.arange(capacity, device=device), priorities, SAMPLER_ALPHA)
    return _driven(
        store,
        lambda store: module.tree_sample(store["tree"], batch_size, SAMPLER_BETA),
        lambda store, index, new: module.update_priorities(store, index, new, SAMPLER_ALPHA),
        lambda: store["tree"][store["tree"].shape[0] // 2 :][:capacity],
        compiled,
        batch_size,
    )


def cumsum_sampler(module, capacity, device, compiled, priorities, batch_size=SAMPLER_BATCH):
    """Stratified draws over a cumulative sum (cumsum_sample, cumsum_update above)."""
    store = dict(leaves=torch.zeros(capacity, device=device), max_priority=torch.ones((), device=device))
    cumsum_update(store, torch.arange(capacity, device=device), priorities, SAMPLER_ALPHA)
    return _driven(
        store,
        lambda store: cumsum_sample(store["leaves"], batch_size, SAMPLER_BETA),
        lambda store, index, new: cumsum_update(store, index, new, SAMPLER_ALPHA),
        lambda: store["leaves"],
        compiled,
        batch_size,
    )


def _driven(store, sample, update, leaves, compiled, batch_size):
    device = store["max_priority"].device
    new = torch.rand(batch_size, device=device) + 0.5

    def step(store):  # as the twin's update runs them: draw, learn (not timed here), write the priorities back
        index, weights = sample(store)
        update(store, index, new)
        return index, weights

    sample_fn, update_fn, step_fn = sample, update, step
    if compiled:  # static shapes, one graph each, as the twin compiles them (dynamic=False: a graph per capacity)
        sample_fn, update_fn, step_fn = (
            torch.compile(f, fullgraph=True, dynamic=False) for f in (sample, update, step)
        )
    index = sample(store)[0]
    return Sampler(
        sample=lambda: sample_fn(store),
        update=lambda: update_fn(store, index, new),
        step=lambda: step_fn(store),
        leaves=leaves,
        new=new,
    )


SAMPLERS = {
    "sum tree": ("twin's `tree_sample` + `update_priorities`", tree_sampler),
    "cumsum": ("`torch.cumsum` + `torch.searchsorted`, index write", cumsum_sampler),
}


def chi_square_check(draw, leaves, calls=CHECK_CALLS, bins=CHECK_BINS):
    """Counts of `calls` batches of draws in `bins` bins (slot i in bin i % bins) against the leaves' shares, as a
    chi-square statistic with its bound (dof + 6 sqrt(2 dof): a multinomial sample passes with p > 1 - 1e-6, and
    stratified draws vary less than multinomial ones). Also fails on a draw outside the slots or on an empty one."""
    leaves = leaves.double().cpu()
    index = torch.cat([draw()[0].cpu() for _ in range(calls)])
    if index.min() < 0 or index.max() >= len(leaves):
        return dict(ok=False, error=f"a draw outside the {len(leaves)} slots: {int(index.min())}..{int(index.max())}")
    if (leaves[index] == 0).any():
        return dict(ok=False, error="an empty slot (zero priority) was drawn")
    slot_bins = torch.arange(len(leaves)) % bins
    expected = torch.zeros(bins, dtype=torch.float64).index_add_(0, slot_bins, leaves) / leaves.sum() * len(index)
    observed = torch.bincount(slot_bins[index], minlength=bins).double()
    full = expected > 0  # a bin of empty slots only: no draw lands there (checked above), no term
    chi2, dof = float(((observed - expected)[full] ** 2 / expected[full]).sum()), int(full.sum()) - 1
    bound = dof + 6 * math.sqrt(2 * dof)
    return dict(ok=chi2 <= bound, chi2=chi2, dof=dof, bound=bound, draws=len(index))


def measure_samplers(capacity, device, compiled, budget_s, module=None):
    """One row per sampler: its draws checked against priority ** alpha / sum, then (only if they pass) one sample,
    one update and one sample + update of SAMPLER_BATCH timed."""
    module = module or load_script(SAMPLER_SCRIPT)
    rows = []
    for name, (how, build) in SAMPLERS.items():
        torch.manual_seed(0)
        priorities = check_priorities(capacity, device)
        row = dict(
            section="sampler",
            sampler=name,
            how=how,
            script=f"{SAMPLER_SCRIPT}.py",
            form="compiled" if compiled else "as written",
            capacity=capacity,
            batch=SAMPLER_BATCH,
        )
        try:
            sampler = build(module, capacity, device, compiled, priorities)
            expected = priorities.double().cpu() ** SAMPLER_ALPHA
            check = chi_square_check(sampler.sample, expected)
            if check["ok"]:  # then one step: its update writes new ** alpha at the drawn slots, the draws follow
                expected[sampler.step()[0].cpu()] = sampler.new.double().cpu() ** SAMPLER_ALPHA
                if not torch.allclose(sampler.leaves().double().cpu(), expected, rtol=1e-5):
                    check = dict(ok=False, error="after an update the leaves are not priority ** alpha")
                else:
                    check = chi_square_check(sampler.sample, expected)
        except Exception as exc:  # noqa: BLE001  (a form that does not run is reported, not timed)
            check = dict(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        row["check"] = check
        if check["ok"]:
            for op, fn in (("sample", sampler.sample), ("update", sampler.update), ("step", sampler.step)):
                row[f"{op}_us"] = seconds_per_call(fn, device, budget_s) * 1e6
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def run_samplers(args, rows=None):
    """The sampler rows, appended to `rows` as each is measured (a run stopped early keeps those done)."""
    device = torch.device(args.device)
    module = load_script(SAMPLER_SCRIPT)
    rows = [] if rows is None else rows
    for capacity in SAMPLER_QUICK_CAPACITIES if args.quick else SAMPLER_CAPACITIES:
        for compiled in [False] + ([] if args.no_compile else [True]):
            t0 = time.perf_counter()
            for row in measure_samplers(capacity, device, compiled, args.budget, module):
                rows.append(row)
                result = f"{row['step_us']:>10,.1f} us/step" if row["check"]["ok"] else "FAIL " + str(row["check"])
                print(
                    f"sampler    {row['sampler']:10s} {row['form']:10s} {capacity:>9,} {result} "
                    f"({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def samplers_markdown(rows):
    """The comparison: per capacity and form, the two samplers side by side (µs; FAIL: wrong draws, not timed)."""
    lines = [
        "R2D2's prioritized sampler: the twin's sum tree against stratified draws over a cumulative sum, "
        f"batch {SAMPLER_BATCH}, priority exponent {SAMPLER_ALPHA}. µs per call (median after warm-up); step = one "
        "sample + one priority update of the sampled slots, as the twin's update runs them. Each sampler's draws were "
        f"checked first ({CHECK_CALLS * SAMPLER_BATCH:,} draws in {CHECK_BINS} bins of slots against "
        "priority^alpha / sum, chi-square, before and after an update; no empty slot drawn); FAIL = wrong draws, "
        "not timed.",
        "",
        "| slots | form | sampler | chi² (bound) | sample µs | update µs | step µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["check"]
        chi = f"{c['chi2']:.0f} ({c['bound']:.0f})" if "chi2" in c else c.get("error", "")
        times = (
            " | ".join(f"{r[f'{op}_us']:,.1f}" for op in ("sample", "update", "step"))
            if c["ok"]
            else "FAIL | FAIL | FAIL"
        )
        lines.append(f"| {r['capacity']:,} | {r['form']} | {r['sampler']}: {r['how']} | {chi} | {times} |")
    return lines


# ---------------------------------------------------------------------------------------------------
# Timing and the report
# ---------------------------------------------------------------------------------------------------


def study_rates(path=STUDY):
    """{algorithm: the study's first row for it} (items, item bytes, add and sample rates as floats); the file's
    lines starting with # cite the study."""
    rows = {}
    with open(path) as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            numbers = {k: float(v) for k, v in row.items() if k not in ("algorithm", "env", "buffer_property")}
            rows.setdefault(row["algorithm"], {**row, **numbers})
    return rows


def seconds_per_call(fn, device, budget_s, min_reps=5, max_reps=2000):
    """Median seconds of one call, after warm-up calls (compilation happens there)."""
    for _ in range(3):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    times, spent = [], 0.0
    while len(times) < min_reps or (spent < budget_s and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return statistics.median(times)


def measure(case, script, capacity, device, compiled, budget_s):
    bench = case.build(load_script(script), capacity, device, compiled)
    stored_per_item = bench.stored_bytes / bench.capacity
    delivered = bench.sample()
    sample_bytes = sum(v.nbytes for v in delivered.values()) / bench.sample_items
    rows = []
    ops = [
        ("add", bench.add, bench.add_items, stored_per_item),
        ("sample", bench.sample, bench.sample_items, sample_bytes),
    ]
    if bench.update is not None:  # a priority is one float32 per item
        ops.append(("update", bench.update, bench.update_items, 4))
    for op, fn, items, item_bytes in ops:
        s = seconds_per_call(fn, device, budget_s)
        rows.append(
            dict(
                buffer=case.name,
                script=f"{script}.py",
                form="compiled" if compiled else "as written",
                capacity=capacity,
                stored_bytes_per_item=stored_per_item,
                op=op,
                items_per_call=items,
                us_per_call=s * 1e6,
                items_per_s=items / s,
                item_bytes=item_bytes,  # add: stored per item; sample: delivered per item
                mb_per_s=items / s * item_bytes / 1e6,
                study=case.study,
            )
        )
    del bench, delivered
    return rows


def run(args, rows=None):
    """The buffer rows, appended to `rows` as each is measured (a run stopped early keeps those done)."""
    device = torch.device(args.device)
    study = study_rates()
    names = list(CASES) if args.buffers is None else args.buffers.split(",")
    rows = [] if rows is None else rows
    for name in names:
        case = CASES[name]
        for capacity in case.quick_capacities if args.quick else case.capacities:
            for script in case.scripts:
                forms = [False] + ([True] if script.endswith("_torchcompile") and not args.no_compile else [])
                for compiled in forms:
                    t0 = time.perf_counter()
                    for row in measure(case, script, capacity, device, compiled, args.budget):
                        need = study.get(case.study)
                        if need and f"{row['op']}_items_per_s" in need:  # the study has no priority-update rates
                            row["study_items_per_s"] = need[f"{row['op']}_items_per_s"]
                            row["study_mb_per_s"] = need[f"{row['op']}_bytes_per_s"] / 1e6
                            row["study_capacity"] = int(need["buffer_items"])
                            row["times_study"] = row["items_per_s"] / row["study_items_per_s"]
                        rows.append(row)
                        print(
                            f"{name:10s} {script:32s} {row['form']:10s} {capacity:>9,} {row['op']:6s} "
                            f"{row['items_per_s']:>12,.0f} items/s ({time.perf_counter() - t0:.0f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    return rows


def to_markdown(report):
    lines = [machine_line(report["machine"]), ""]
    if report.get("stopped"):  # a partial run: say so above its tables
        lines += [f"Stopped {report['stopped']}.", ""]
    if report["rows"] or not report.get("samplers"):
        lines += buffers_markdown(report["rows"])
    if report.get("samplers"):
        lines += samplers_markdown(report["samplers"]) + [""]
    lines += [f"Command: `{report['command']}`; total {report['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def buffers_markdown(rows):
    lines = [
        "| buffer | script | form | capacity | stored B/item | op | items/call | µs/call | items/s | MB/s "
        "| study needs items/s (MB/s) | × need |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        need = (
            f"{r['study_items_per_s']:,.0f} ({r['study_mb_per_s']:,.1f}) at {r['study_capacity']:,}"
            if r.get("study_items_per_s")
            else "—"
        )
        times = f"{r['times_study']:,.0f}x" if r.get("times_study") else "—"
        lines.append(
            f"| {r['buffer']} | `{r['script']}` | {r['form']} | {r['capacity']:,} | {r['stored_bytes_per_item']:,.0f} "
            f"| {r['op']} | {r['items_per_call']} | {r['us_per_call']:,.1f} | {r['items_per_s']:,.0f} "
            f"| {r['mb_per_s']:,.1f} | {need} | {times} |"
        )
    lines += [
        "",
        "add: one env step of the script's default envs, MB/s of bytes stored; sample: one batch of the script's "
        "default size, MB/s of bytes delivered (rebuilt frame stacks included). Study: the replay-storage study's "
        "rates for one training job of that algorithm (`benchmarks/replay_storage_rates.csv`). R2D2: an item is "
        "a sequence (40 burn-in + 80 steps); add is 40 steps of 32 envs, which complete 32 sequences; update writes "
        "a sampled batch's priorities back into the sum tree (the study gives no rate for it).",
        "",
    ]
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small capacities (CI)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--buffers", default=None, help=f"comma-separated, of {','.join(CASES)} (default: all)")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls aimed at per row")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled forms of the twins' functions")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=None, help=f"folder (default {FULL_OUT}; --quick: {QUICK_OUT})")
    p.add_argument("--tag", default=None, help="file suffix (default: the device, e.g. cpu; cpu_quick with --quick)")
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated sections, of {','.join(SECTIONS)} (default: all); a run of some sections writes "
        "replay_<device>_<sections>.* unless --tag says otherwise, never the full report",
    )
    args = p.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / (QUICK_OUT if args.quick else FULL_OUT))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("replay.py: error: --device cuda: CUDA is not available on this machine", file=sys.stderr)
        return 2
    unknown = sorted(set((args.buffers or "").split(",")) - set(CASES) - {""})
    if unknown:
        print(f"replay.py: error: --buffers: unknown {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    sections = SECTIONS if args.only is None else [s for s in SECTIONS if s in args.only.split(",")]
    unknown = sorted(set(args.only.split(",")) - set(SECTIONS)) if args.only is not None else []
    if unknown or not sections:
        print(f"replay.py: error: --only: unknown {unknown or [args.only]}; known: {SECTIONS}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    start = time.perf_counter()
    info = machine_info(device)
    report = {
        "machine": info,
        "quick": args.quick,
        "command": "python benchmarks/replay.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "sections": sections,
        "rows": [],
        "samplers": [],
    }
    with stopped_by_signal(report):
        if "buffers" in sections:
            run(args, report["rows"])
        if "samplers" in sections:
            run_samplers(args, report["samplers"])
    report["wall_s"] = time.perf_counter() - start
    part = "" if sections == SECTIONS else "_" + "_".join(sections)  # a partial run never replaces the full report
    tag = args.tag or device_tag(device) + part + ("_quick" if args.quick else "")
    return write_or_refuse(report, args.out, tag, prefix="replay", render=to_markdown)


if __name__ == "__main__":
    sys.exit(main())
