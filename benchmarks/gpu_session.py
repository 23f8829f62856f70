"""One GPU session: every pair's eager script and twin, LeanRL's scripts beside them, each env's ceiling, in one call.

    benchmarks/gpu_session.sh OUT                      # on a GPU machine (the wrapper sets what its torch needs)
    python3 benchmarks/gpu_session.py --dry-run OUT    # the same steps on a CPU at tiny budgets, in about 2 minutes
    benchmarks/gpu_session.sh --peers OUT              # SB3 and TorchRL beside ours, a call of its own (see --peers)

What it measures (results.jsonl, one JSON object a line, each with "kind"):
  machine   GPU model and driver, CPU model and cores, torch, tensordict, envpool, gymnasium, mujoco versions;
  ceiling   each env family stepped with random actions and no agent, with the scripts' own env makers (envpool
            Breakout-v5 at 8 and 64 envs, HalfCheetah-v4 and CartPole-v1 at the scripts' one env): the steps/s no
            script can pass on this machine;
  run       a script (ours, LeanRL's from --peer, SB3's or TorchRL's with --peers) as a subprocess: its steady steps/s
            over a window of at least --steady-s seconds after the warm-up (compile and capture included in the
            warm-up), the time to reach that window, the warm-up's excess over steady iterations (compile and capture),
            and for twins the recompiles after the warm-up (TORCH_LOGS=recompiles) and the host syncs in the hot loop
            (torch.cuda.set_sync_debug_mode, counted by script line over a few iterations after the window).
  One run (PPO Atari's twin, 8 envs; --profile names others) also profiles ~10 iterations after its window:
            profile.md.

How a run is timed, the same way for our scripts and LeanRL's: a sitecustomize put on the subprocess's PYTHONPATH
(harness.hook_env) wraps tqdm.tqdm (both progress loops iterate over one; harness.stamp_first_loop) to stamp the
wall time at the start of every iteration of the first loop, and ends that loop once the window, the sync count and
the profile are done: the script then finishes as after its last iteration (ours write their results line). Budgets
are therefore windows of time, not steps; every run's --total-timesteps is its default or larger than the window can
reach.

--rounds, the ratios that hold: instead of the lanes, each pair with a LeanRL twin runs its twin and LeanRL's at the
same moment on equal cores (a slot's two halves), then again with the halves swapped; every record says its round, the
cores it was given and the cores the measured process saw (affinity). --alone: first, PPO Atari's twin at 8 envs on
every core with nothing else on the GPU, after envpool's ceiling on the same cores (the figure a user would see).
--fast: then PQN Atari's twin in its fast configuration (time_to_score.py's run) alone the same way, profiled: where
an iteration of the time-to-score run goes.

--peers DIR, SB3 and TorchRL beside ours: a call of its own, instead of the lanes (as --rounds is). For each pair they
share with ours (SAC, TD3 and PPO on HalfCheetah-v4, DQN on CartPole-v1) two lanes of their own: our eager script and
twin (both flags, the lanes' sizes), then SB3's run and TorchRL's with its compile options off; beside it TorchRL with
compile.compile, then with compile.cudagraphs too. Eight lanes of 2 cores on 16, estimated (not yet timed on a GPU): a
lane of ours about 3.5 minutes (our warm-ups in the archived calls, the peers' about as long), a TorchRL lane two cold
compiles of 1-2 minutes each plus their windows, within the 470 s of runs; a run still warming up at the deadline is
recorded without a window. Their commands are steady.py's for our run (peer_argv_for: our env, batch, buffer, learning
starts, network sizes; the flags a peer cannot follow recorded as left_out), SB3 on its default device (auto: the GPU).
DIR: a venv made by benchmarks/peers/install.sh, or the folder its --offline mode fills from wheels. They step a
progress bar by hand: the hook stamps each update of the bar that counts the run's env steps (harness.stamp_first_bar),
their window opens at the first stamp at or past the env steps of our run's warm-up, steps/s is the env steps between
the window's stamps over its time, and the process ends when the window does (they write no results line). --dry-run
--peers DIR: ours eager, SB3 and TorchRL eager for each pair (no compile on the CPU), about 70 s of one core.

The runs go in lanes that run at the same time, each lane pinned to its own CPU cores, all sharing the one GPU:
one call of at most 10 minutes cannot run them one after the other. Every record says its lane and cores. A run
still warming up when the session's deadline comes is stopped and recorded without a window.

Output in OUT (at most 8 files): results.jsonl, summary.md (plots/plot.py's GPU table of results.jsonl),
profile.md, logs.tar.gz (each run's log and stamps).
"""

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMPS = "GPU_SESSION_STAMPS"  # where the measured process writes its stamps
CONFIG = "GPU_SESSION_CONFIG"  # the measured process's window, checks and profile, as JSON
MARK = "[gpu_session] steady window from iteration"  # printed when the window starts: recompiles after it count

# ---------------------------------------------------------------- inside the measured process


def install(harness):
    """Stamp the first tqdm loop of this process and end it once the window and the checks are done (called by
    harness.hook_env's sitecustomize)."""
    path = os.environ.pop(STAMPS, None)
    if path is None:  # a ceiling's process: nothing to stamp
        return
    config = json.loads(os.environ.pop(CONFIG))
    if config.get("no_wandb"):
        install_wandb_stub()
    if config.get("inductor"):  # options this torch needs to compile (set by gpu_session.sh for that torch only)
        import torch._inductor.config as inductor_config

        for name, value in config["inductor"].items():
            setattr(inductor_config, name, value)
    state = dict(config=config, stamps=[], syncs={}, phase="warmup", affinity=sorted(os.sched_getaffinity(0)))
    if config.get("bar") is not None:  # SB3's and TorchRL's scripts: the updates of the bar of their run's env steps
        state["counts"] = []
        harness.stamp_first_bar(lambda done, now: bar_update(state, path, done, now), config["bar"])
    else:
        harness.stamp_first_loop(lambda done, now: advance(state, now))
    atexit.register(write_stamps, path, state)


def bar_update(state, path, done, now):
    """A peer's bar moved on to `done` env steps: stamp it; once the window is done, end the process here (a bar cannot
    end a loop, and a peer has no results line to write)."""
    state["counts"].append(done)
    if advance(state, now) is False:
        write_stamps(path, state)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # not SystemExit: a collector's threads and workers would outlive it


def install_wandb_stub():
    """LeanRL's scripts call wandb.init without --track; where wandb is not installed, a module that does nothing."""
    import importlib.util
    import types

    if importlib.util.find_spec("wandb") is not None:
        os.environ.setdefault("WANDB_MODE", "disabled")
        return
    stub = types.ModuleType("wandb")
    stub.init = lambda *a, **k: None
    stub.log = stub.finish = stub.watch = stub.define_metric = lambda *a, **k: None
    stub.config = {}
    sys.modules["wandb"] = stub


def advance(state, now):
    """Stamp an iteration's start and move through warm-up, window, sync count, profile; False: end the loop."""
    config, stamps = state["config"], state["stamps"]
    i = len(stamps)
    stamps.append(now)
    if state["phase"] == "warmup":
        # a peer's bar: its warm-up ends at the first stamp where its env steps reach those of our warm-up
        if state["counts"][-1] < config["k0_steps"] if "counts" in state else i < config["k0"]:
            return True
        state["phase"], state["window_from"] = "window", i
        print(f"{MARK} {i}", file=sys.stderr, flush=True)
    if state["phase"] == "window":
        start = state["window_from"]
        if now - stamps[start] < config["steady_s"] or i - start < config["min_iters"]:
            return True
        state["phase"], state["window_to"] = "syncs", i
        sync_debug(state, True)
    if state["phase"] == "syncs":
        if i - state["window_to"] < config.get("sync_iters", 0):
            return True
        sync_debug(state, False)
        state["phase"], state["syncs_to"] = "profile", i
        if config.get("profile"):
            start_profile(state)
    if state["phase"] == "profile":
        if config.get("profile") and i - state["syncs_to"] < config.get("profile_iters", 10):
            return True
        stop_profile(state, now)
        state["phase"] = "done"
    return False


def sync_debug(state, on):
    """torch.cuda.set_sync_debug_mode("warn") over the sync count, every warning counted by its script line."""
    torch = sys.modules.get("torch")
    if not state["config"].get("sync_iters") or torch is None or not torch.cuda.is_available():
        return
    import traceback
    import warnings

    if on:
        script = state["config"]["script"]
        shown = warnings.showwarning

        def count(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" not in str(message):
                return shown(message, category, filename, lineno, file, line)
            frames = [f for f in traceback.extract_stack()[:-1] if f.filename == script] or traceback.extract_stack()
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}: {(frames[-1].line or '').strip()}"
            state["syncs"][where] = state["syncs"].get(where, 0) + 1

        state["shown"], warnings.showwarning = shown, count
        warnings.filterwarnings("always", message=".*synchroniz.*")
        torch.cuda.set_sync_debug_mode("warn")
    else:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = state.get("shown", warnings.showwarning)


def start_profile(state):
    """torch.profiler over the next iterations, with the env step and each CudaGraphModule call labelled."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def labelled(name, fn):
        def call(*args, **kwargs):
            with record_function(name(args) if callable(name) else name):
                return fn(*args, **kwargs)

        return call

    vector = sys.modules.get("gymnasium.vector")
    if vector is not None:  # the scripts' gymnasium envs step through SyncVectorEnv
        vector.SyncVectorEnv.step = labelled("env.step", vector.SyncVectorEnv.step)
    envpool = sys.modules.get("envpool.python.envpool")
    if envpool is not None:
        mixin = envpool.EnvPoolMixin
        for method in ("step", "send", "recv"):
            setattr(mixin, method, labelled(f"env.{method}", getattr(mixin, method)))
    cudagraphs = sys.modules.get("tensordict.nn.cudagraphs")
    if cudagraphs is not None:  # graph.1, graph.2, ...: the CudaGraphModules in the order of their first call here
        module, order = cudagraphs.CudaGraphModule, {}
        module.__call__ = labelled(lambda a: f"graph.{order.setdefault(id(a[0]), len(order) + 1)}", module.__call__)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    state["profiler"] = profile(activities=activities)
    state["profiler"].start()
    state["profile_from"] = time.time()


def stop_profile(state, now):
    profiler = state.pop("profiler", None)
    if profiler is None:
        return
    profiler.stop()
    rows = [
        dict(
            name=e.key,
            calls=e.count,
            cpu_us=e.cpu_time_total,
            self_cpu_us=e.self_cpu_time_total,
            self_device_us=getattr(e, "self_device_time_total", 0.0),
        )
        for e in profiler.key_averages()
    ]
    # kept: the labelled calls, the copies, the top host and device ops, and the device total over all events
    device_us = sum(r["self_device_us"] for r in rows)
    top = {r["name"] for key in ("self_cpu_us", "self_device_us") for r in sorted(rows, key=lambda r: -r[key])[:25]}
    keep = lambda r: r["name"] in top or r["name"].startswith(("env.", "graph.", "aten::copy_", "aten::to"))
    rows = [r for r in rows if keep(r)]
    state["profile"] = dict(
        wall_s=now - state["profile_from"],
        iterations=state["config"].get("profile_iters", 10),
        device_us=device_us,
        events=rows,
    )


def write_stamps(path, state):
    if state.get("profiler") is not None:
        stop_profile(state, time.time())
    keys = ("stamps", "counts", "syncs", "phase", "window_from", "window_to", "profile", "affinity")
    with open(path, "w") as f:
        json.dump({k: state[k] for k in keys if k in state}, f)


# ---------------------------------------------------------------- the arithmetic


def window_figures(stamps, steps_per_iter, start, window_from=None, window_to=None, counts=None):
    """Steady figures from iteration start times: steps/s over [window_from, window_to), the time from the process
    start to the window, and the warm-up iterations' excess over the median steady iteration (compile, capture).
    A peer's bar: `counts`, its env steps at each stamp, give the steps of the window."""
    if window_from is None or window_to is None or window_to <= window_from:
        return None
    steps = counts[window_to] - counts[window_from] if counts else steps_per_iter * (window_to - window_from)
    gaps = [b - a for a, b in zip(stamps[window_from:window_to], stamps[window_from + 1 : window_to + 1])]
    span = stamps[window_to] - stamps[window_from]
    median = sorted(gaps)[len(gaps) // 2]
    warm = [b - a for a, b in zip(stamps[:window_from], stamps[1 : window_from + 1])]
    return dict(
        sps=steps / span,
        window_s=span,
        window_iterations=window_to - window_from,
        iter_s_median=median,
        to_window_s=stamps[window_from] - start,
        warmup_excess_s=sum(max(0.0, g - median) for g in warm),
    )


def count_recompiles(log_text):
    """(before, after) the window's start: the lines TORCH_LOGS=recompiles prints for each recompile."""
    before, _, after = log_text.partition(MARK)
    pattern = re.compile(r"^.*Recompiling function", re.M)
    return len(pattern.findall(before)), len(pattern.findall(after))


# ---------------------------------------------------------------- the plan


def ours(script):
    return str(ROOT / "leanrl" / script)


def plan(peer, dry_run, cores):
    """The lanes: [(name, cores, [job, ...]), ...]; each job a dict that run_job() takes."""
    twin_flags = [] if dry_run else ["--compile", "--cudagraphs"]
    full = "twin" if dry_run else "twin --compile --cudagraphs"
    steady_s, min_iters = (1.0, 2) if dry_run else (20.0, 5)
    # sizes: on a GPU the scripts' defaults (replay pairs learning sooner, so the window comes within the call); the
    # dry run the tests' tiny ones
    if dry_run:
        atari8 = ["--num-envs", "4", "--num-steps", "8"]
        atari64 = ["--num-envs", "8", "--num-steps", "8"]
        cont = ["--num-steps", "64", "--num-minibatches", "2"]
        sac = td3 = ["--learning-starts", "300", "--batch-size", "32"]
        dqn = ["--learning-starts", "300"]
        pqn = ["--num-steps", "32"]
        dqn_atari = ["--learning-starts", "300", "--buffer-size", "2000", "--batch-size", "8"]
        r2d2 = ["--env-id", "CartPole-v1", "--num-envs", "4", "--hidden-size", "16", "--burn-in", "1", "--seq-len"]
        r2d2 += ["3", "--overlap", "1", "--batch-size", "8", "--train-frequency", "8", "--buffer-size", "400"]
        r2d2 += ["--learning-starts", "200", "--target-network-frequency", "10"]
        starts = dict(sac=300, td3=300, dqn=300, dqn_atari=300, r2d2=200)
    else:
        atari8, atari64 = ["--num-envs", "8"], ["--num-envs", "64"]
        cont = []
        sac = td3 = ["--learning-starts", "5000"]
        dqn = ["--learning-starts", "10000"]
        pqn = []
        dqn_atari = ["--learning-starts", "10000"]
        r2d2 = ["--learning-starts", "20000"]
        starts = dict(sac=5000, td3=5000, dqn=10000, dqn_atari=10000, r2d2=20000)
    ppo_k0 = 1 if dry_run else 4  # the twin's last graph is captured in iteration 3
    n8, n64 = (4, 8) if dry_run else (8, 64)
    steps_atari8, steps_atari64 = n8 * (8 if dry_run else 128), n64 * (8 if dry_run else 128)
    steps_cont = 64 if dry_run else 2048
    r2d2_envs = 4 if dry_run else 32
    steps_pqn, pqn_k0 = 4 * (32 if dry_run else 128), 1 if dry_run else 6  # the returns captured in iteration 5

    def job(side, pair, variant, flags, steps_per_iter, k0, env_id, num_envs, **extra):
        eager = variant == "eager"
        name = f"{pair}.py" if eager else f"{pair}_torchcompile.py"
        script = ours(name) if side == "leanrl" else str(Path(peer) / "leanrl" / name)
        if not eager:
            flags = flags + (twin_flags if variant == full else [f for f in variant.split()[1:]])
        return dict(
            side=side, pair=pair, variant=variant, script=script, flags=flags, steps_per_iter=steps_per_iter,
            k0=k0, env_id=env_id, num_envs=num_envs, steady_s=steady_s, min_iters=min_iters,
            sync_iters=0 if eager or dry_run else 3 if steps_per_iter >= 1000 else 300,
            profile_iters=3 if dry_run else 10, **extra,
        )  # fmt: skip

    def ceiling(family, env_id, num_envs):
        return dict(kind="ceiling", family=family, env_id=env_id, num_envs=num_envs, seconds=1.0 if dry_run else 8.0)

    atari = "Breakout-v5"
    cheetah, cartpole = "HalfCheetah-v4", "CartPole-v1"
    off = lambda n: n + (5 if dry_run else 100)  # the replay pairs: learning started, the update captured
    lanes = [
        [  # PPO Atari, ours: 8 and 64 envs, every variant at 8, the profile; PQN Atari on the same cores
            ceiling("envpool", atari, n8),
            ceiling("envpool", atari, n64),
            job("leanrl", "ppo_atari_envpool", "eager", atari8, steps_atari8, ppo_k0, atari, n8),
            job("leanrl", "ppo_atari_envpool", full, atari8, steps_atari8, ppo_k0, atari, n8, profile=True),
            job("leanrl", "pqn_atari_envpool", "eager", atari8, steps_atari8, ppo_k0, atari, n8),  # graphs as PPO's
            job("leanrl", "pqn_atari_envpool", full, atari8, steps_atari8, ppo_k0, atari, n8),
            *(  # the dry run has no flags: these would repeat the two above
                []
                if dry_run
                else [
                    job("leanrl", "ppo_atari_envpool", "twin", atari8, steps_atari8, ppo_k0, atari, n8),
                    job("leanrl", "ppo_atari_envpool", "eager", atari64, steps_atari64, ppo_k0, atari, n64),
                    job("leanrl", "ppo_atari_envpool", full, atari64, steps_atari64, ppo_k0, atari, n64),
                    job("leanrl", "ppo_atari_envpool", "twin --compile", atari8, steps_atari8, 4, atari, 8),
                ]
            ),
        ],
        [  # LeanRL's PPO pairs and DQN
            job("leanrl-peer", "ppo_atari_envpool", "eager", atari8, steps_atari8, ppo_k0, atari, n8),
            job("leanrl-peer", "ppo_atari_envpool", full, atari8, steps_atari8, ppo_k0, atari, n8),
            job("leanrl-peer", "dqn", "eager", dqn, 1, off(starts["dqn"]), cartpole, 1),
            job("leanrl-peer", "dqn", full, dqn, 1, off(starts["dqn"]), cartpole, 1),
            job("leanrl-peer", "ppo_continuous_action", "eager", cont, steps_cont, 3, cheetah, 1),
            job("leanrl-peer", "ppo_continuous_action", full, cont, steps_cont, 3, cheetah, 1),
        ],
        [  # ours: PPO continuous, SAC, TD3 eager
            ceiling("gymnasium", cheetah, 1),
            job("leanrl", "ppo_continuous_action", "eager", cont, steps_cont, 3, cheetah, 1),
            job("leanrl", "ppo_continuous_action", full, cont, steps_cont, 3, cheetah, 1),
            job("leanrl", "sac_continuous_action", "eager", sac, 1, off(starts["sac"]), cheetah, 1),
            job("leanrl", "sac_continuous_action", full, sac, 1, off(starts["sac"]), cheetah, 1),
            job("leanrl", "td3_continuous_action", "eager", td3, 1, off(starts["td3"]), cheetah, 1),
        ],
        [  # LeanRL's SAC and TD3, our TD3 twin, PQN CartPole
            ceiling("gymnasium", cartpole, 1),
            job("leanrl-peer", "sac_continuous_action", "eager", sac, 1, off(starts["sac"]), cheetah, 1),
            job("leanrl-peer", "sac_continuous_action", full, sac, 1, off(starts["sac"]), cheetah, 1),
            job("leanrl-peer", "td3_continuous_action", "eager", td3, 1, off(starts["td3"]), cheetah, 1),
            job("leanrl-peer", "td3_continuous_action", full, td3, 1, off(starts["td3"]), cheetah, 1),
            job("leanrl", "td3_continuous_action", full, td3, 1, off(starts["td3"]), cheetah, 1),
            job("leanrl", "pqn", "eager", pqn, steps_pqn, pqn_k0, cartpole, 4),
            job("leanrl", "pqn", full, pqn, steps_pqn, pqn_k0, cartpole, 4),
        ],
        [  # ours: R2D2 first (its twin's compile is the longest), DQN, DQN Atari (no LeanRL counterpart but DQN's)
            job("leanrl", "r2d2_atari_envpool", "eager", r2d2, r2d2_envs, off(starts["r2d2"] // r2d2_envs), atari, 32),
            job("leanrl", "r2d2_atari_envpool", full, r2d2, r2d2_envs, off(starts["r2d2"] // r2d2_envs), atari, 32),
            job("leanrl", "dqn", "eager", dqn, 1, off(starts["dqn"]), cartpole, 1),
            job("leanrl", "dqn", full, dqn, 1, off(starts["dqn"]), cartpole, 1),
            job("leanrl", "dqn_atari_envpool", "eager", dqn_atari, 1, off(starts["dqn_atari"]), atari, 1),
            job("leanrl", "dqn_atari_envpool", full, dqn_atari, 1, off(starts["dqn_atari"]), atari, 1),
        ],
    ]
    if dry_run:  # R2D2's tiny run is on CartPole
        for j in lanes[4][:2]:
            j["env_id"], j["num_envs"] = cartpole, 4
    # cores: the two PPO Atari lanes (ours and LeanRL's) get the same number of cores, envpool's threads included
    shares = split_cores(cores, len(lanes))
    names = ["ppo-atari", "leanrl-ppo-dqn", "mujoco", "leanrl-mujoco", "dqn-r2d2"]
    return list(zip(names, shares, lanes))


def select(lanes, names=None, pairs=None, profiled=None, peer=True):
    """The plan cut to some lanes (names) and pairs, a ceiling kept where a kept run steps its env; with profiled,
    the profile moves to the twin --compile --cudagraphs runs of those pairs, ours and LeanRL's."""
    keep = lambda j: "pair" not in j or ((pairs is None or j["pair"] in pairs) and (peer or j["side"] != "leanrl-peer"))
    lanes = [(name, share, [j for j in jobs if keep(j)]) for name, share, jobs in lanes if not names or name in names]
    stepped = {(j["env_id"], j["num_envs"]) for _, _, jobs in lanes for j in jobs if "pair" in j}
    lanes = [(name, share, [j for j in jobs if "pair" in j or (j["env_id"], j["num_envs"]) in stepped])
             for name, share, jobs in lanes]  # fmt: skip
    for _, _, jobs in lanes if profiled else []:
        for j in jobs:
            j["profile"] = j.get("pair") in profiled and "--compile" in j["variant"] and "--cudagraphs" in j["variant"]
    return [lane for lane in lanes if lane[2]]


RATIO_SLOTS = {  # the rounds' slots: pairs with a LeanRL twin, one after the other on a slot's two halves
    "ppo-atari-dqn": ["ppo_atari_envpool", "dqn"],
    "ppo-continuous": ["ppo_continuous_action"],  # LeanRL's twin warms up for about 3 minutes
    "sac-td3": ["sac_continuous_action", "td3_continuous_action"],
}


def rounds_plan(lanes, cores, pairs=None):
    """The ratio rounds: [(slot, cores a, cores b, [(our twin, LeanRL's twin), ...]), ...]. Each slot runs its pairs
    in turn; a pair runs twice, ours on a and LeanRL's on b at the same moment, then swapped (round 2), both with
    --compile --cudagraphs at the lanes' sizes (PPO Atari at 8 envs)."""
    jobs = [j for _, _, lane in lanes for j in lane if j.get("side") and "twin" in j["variant"]]
    full = max((j["variant"] for j in jobs), key=len)  # "twin --compile --cudagraphs" ("twin" in a dry run)
    twins = {}
    for j in jobs:
        if j["variant"] == full and (j["side"], j["pair"]) not in twins:  # the first: PPO Atari's 8 envs
            twins[(j["side"], j["pair"])] = dict(j, profile=False, sync_iters=0)
    slots = [(name, [p for p in wanted if pairs is None or p in pairs]) for name, wanted in RATIO_SLOTS.items()]
    slots = [(name, wanted) for name, wanted in slots if wanted]
    halves = split_halves(cores, len(slots))
    return [(name, a, b, [(twins[("leanrl", p)], twins[("leanrl-peer", p)]) for p in wanted])
            for (name, wanted), (a, b) in zip(slots, halves)]  # fmt: skip


def split_halves(cores, n):
    """n slots of two equal halves over the cores, what is left over to the first slot (PPO Atari's envpool threads);
    with fewer cores than halves, every slot gets the first core and the second."""
    half = len(cores) // (2 * n)
    if half == 0:
        return [([cores[0]], [cores[1 % len(cores)]])] * n
    sizes = [half + (len(cores) - 2 * n * half) // 2] + [half] * (n - 1)
    out, at = [], 0
    for size in sizes:
        out.append((cores[at : at + size], cores[at + size : at + 2 * size]))
        at += 2 * size
    return out


def alone_plan(lanes):
    """PPO Atari's twin at 8 envs (4 in a dry run), alone on the machine, after envpool's ceiling at the same size."""
    jobs = [j for _, _, lane in lanes for j in lane]
    twin = next(j for j in jobs if j.get("side") == "leanrl" and j["pair"] == "ppo_atari_envpool" and "twin" in
                j["variant"])  # fmt: skip
    ceiling = next(j for j in jobs if j.get("kind") == "ceiling" and (j["env_id"], j["num_envs"]) == (twin["env_id"],
                   twin["num_envs"]))  # fmt: skip
    return [ceiling, dict(twin, profile=False, alone=True)]


def fast_plan(lanes, dry_run):
    """PQN Atari's twin in its fast configuration (the script's FAST_FLAGS, time_to_score.py's run) alone on the
    machine, profiled after its window, after envpool's ceiling at its env count: where an iteration goes (env steps,
    policy, update, idle GPU)."""
    from benchmarks.harness import load_script

    ours = [j for _, _, lane in lanes for j in lane if j.get("side") == "leanrl"]
    twin = max((j for j in ours if j["pair"] == "pqn_atari_envpool" and "twin" in j["variant"]),
               key=lambda j: len(j["variant"]))  # the twin with both flags (none in a dry run)  # fmt: skip
    flags = load_script("pqn_atari_envpool_torchcompile").FAST_FLAGS.split()
    if dry_run:  # tiny sizes: 8 envs x 8 steps, 2 minibatches
        for flag, value in (("--num-envs", "8"), ("--num-steps", "8"), ("--num-minibatches", "2")):
            flags[flags.index(flag) + 1] = value
    num_envs, num_steps = (int(flags[flags.index(flag) + 1]) for flag in ("--num-envs", "--num-steps"))
    flags += [flag for flag in twin["flags"] if flag in ("--compile", "--cudagraphs")]
    ceiling = dict(kind="ceiling", family="envpool", env_id=twin["env_id"], num_envs=num_envs,
                   seconds=1.0 if dry_run else 8.0)  # fmt: skip
    run = dict(twin, flags=flags, num_envs=num_envs, steps_per_iter=num_envs * num_steps, profile=True, fast=True)
    return [ceiling, run]


PEER_PAIRS = {  # --peers: our pairs that SB3 and TorchRL have, by the short name of their lanes
    "sac_continuous_action": "sac",
    "td3_continuous_action": "td3",
    "ppo_continuous_action": "ppo-continuous",
    "dqn": "dqn",
}


def peers_plan(lanes, peers, cores):
    """--peers, instead of the lanes: for each pair of PEER_PAIRS a lane of ours (eager, then the twin with both
    flags, as in the lanes) then SB3's run and TorchRL's eager one, and a lane of TorchRL with its compile option, then
    with its cudagraphs option too (none in a dry run: no --compile there). Each peer's command is steady.py's for our
    run (peer_argv_for: our env, batch, buffer, learning starts and network sizes, its compile options as our flags),
    SB3 on its default device (auto: the GPU); its window starts at the first stamp of its bar at or past the env
    step where ours ends its warm-up."""
    from benchmarks.steady import SB3, TORCHRL, bar_total, peer_argv_for

    ours = {(j["pair"], j["variant"]): j for _, _, lane in lanes for j in lane
            if j.get("side") == "leanrl" and j["pair"] in PEER_PAIRS}  # fmt: skip
    full = max((v for _, v in ours if v != "eager"), key=len)  # "twin --compile --cudagraphs" ("twin" in a dry run)

    def peer(side, job, variant, drop=()):
        argv = [job["script"], *(flag for flag in job["flags"] if flag not in drop)]
        words, left_out = peer_argv_for(side, argv, job["script"])
        words += ["--device", "auto"] if side == SB3 else []
        root = ROOT if side == SB3 else Path(peers) / "torchrl-sota"
        return dict(
            job, side=side, variant=variant, script=str(root / words[0]), flags=words[1:], peers=str(peers),
            bar=bar_total(words), k0_steps=job["k0"] * job["steps_per_iter"], k0=None, steps_per_iter=None,
            sync_iters=0, profile=False, left_out=left_out,
        )  # fmt: skip

    out = []
    for pair, short in PEER_PAIRS.items():
        eager, twin = ours[(pair, "eager")], ours[(pair, full)]
        # the lanes count syncs and profile; a dry run's twin has no flag: it would repeat the eager run's path
        mine = [dict(j, profile=False, sync_iters=0) for j in (eager, twin) if j is eager or "--compile" in j["flags"]]
        compiled = []
        if "--compile" in twin["flags"]:
            compiled = [peer(TORCHRL, twin, "twin --compile", drop=["--cudagraphs"]), peer(TORCHRL, twin, full)]
        out += [(f"{short}-ours", [*mine, peer(SB3, eager, "eager"), peer(TORCHRL, eager, "eager")])]
        out += [(f"{short}-torchrl", compiled)] if compiled else []
    return [(name, share, jobs) for (name, jobs), share in zip(out, split_cores(cores, len(out)))]


def peers_python(peers):
    """(python, site) that runs SB3 and TorchRL from `peers`: a venv of benchmarks/peers/install.sh (its python, its
    packages alone), or the folder of its --offline mode (this python, the folder first on the path: its tensordict is
    TorchRL's, not ours); None where `peers` is neither or lacks TorchRL's scripts (torchrl-sota/)."""
    peers = Path(peers)
    if not (peers / "torchrl-sota").is_dir():
        return None
    if (peers / "bin" / "python").is_file():
        return str(peers / "bin" / "python"), None
    if (peers / "stable_baselines3").is_dir() and (peers / "torchrl").is_dir():
        return sys.executable, str(peers)
    return None


def peers_versions(peers):
    """The versions of the peers' packages in `peers` (a venv or an --offline folder), read from their metadata."""
    import glob
    import importlib.metadata as md

    paths = [str(peers), *glob.glob(str(Path(peers) / "lib" / "python*" / "site-packages"))]
    names = ("stable-baselines3", "torchrl", "tensordict", "hydra-core")
    found = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in md.distributions(path=paths)}
    return {name: found.get(name) for name in names}


def split_cores(cores, n):
    """n lanes over the cores: as even as they go, the first two lanes (PPO Atari, ours and LeanRL's) first served;
    with fewer cores than lanes, lanes share them round-robin."""
    if len(cores) < n:
        return [[cores[i % len(cores)]] for i in range(n)]
    sizes = [len(cores) // n] * n
    for i in range(len(cores) % n):
        sizes[i] += 1
    sizes[0] = sizes[1] = max(sizes[0], sizes[1])
    for i in range(n - 1, 1, -1):  # what the first two took, from the last lanes
        if sum(sizes) > len(cores):
            sizes[i] -= 1
    out, at = [], 0
    for size in sizes:
        out.append(cores[at : at + size])
        at += size
    return out


# ---------------------------------------------------------------- running


def ceiling_main(family, env_id, num_envs, seconds):
    """Step the scripts' own env for `seconds` with random actions and no agent; print steps/s as JSON."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    if family == "envpool":
        from leanrl.ppo_atari_envpool import make_env

        envs = make_env(env_id, num_envs, seed=1)
        envs.reset()
        n = envs.action_space.n
        step = lambda: envs.step(np.random.randint(0, n, size=num_envs))
    else:
        from leanrl.dqn import make_envs as discrete
        from leanrl.sac_continuous_action import make_envs as continuous

        envs = (discrete if env_id == "CartPole-v1" else continuous)(env_id, num_envs)
        envs.reset(seed=1)
        step = lambda: envs.step(envs.action_space.sample())
    for _ in range(20):
        step()
    steps, start = 0, time.time()
    while time.time() - start < seconds:
        step()
        steps += num_envs
    print(json.dumps(dict(sps=steps / (time.time() - start), steps=steps)))


def pinned(cores):
    def pin():
        with contextlib.suppress(OSError):  # a sandbox that refuses it: the lanes share every core
            os.sched_setaffinity(0, cores)

    return pin


def run_job(job, folder, cores, deadline, env):
    """Run one job in `folder`; its record."""
    folder.mkdir(parents=True)
    log = folder / "log.txt"
    start = time.time()
    if job.get("kind") == "ceiling":
        cmd = [sys.executable, __file__, "--ceiling", job["family"], job["env_id"], str(job["num_envs"])]
        cmd += [str(job["seconds"])]
        code, timed_out = call(cmd, folder, dict(env, OMP_NUM_THREADS=str(len(cores))), cores, deadline, log)
        record = dict(kind="ceiling", **{k: job[k] for k in ("family", "env_id", "num_envs")}, exit_code=code)
        try:
            record.update(json.loads(log.read_text().strip().splitlines()[-1]))
        except (ValueError, IndexError):
            record["status"] = "error"
        return record
    stamps = folder / "stamps.json"
    keys = ("k0", "k0_steps", "bar", "steady_s", "min_iters", "sync_iters", "profile", "profile_iters")
    config = {k: job.get(k) for k in keys}
    config.update(script=job["script"], no_wandb=job["side"] != "leanrl", inductor=env_inductor())
    run_env = dict(env, **{STAMPS: str(stamps), CONFIG: json.dumps(config)}, OMP_NUM_THREADS=str(len(cores)))
    run_env["WANDB_MODE"] = "disabled"
    compiled = "--compile" in job["flags"] or "compile.compile=True" in job["flags"]
    if compiled:
        run_env["TORCH_LOGS"] = "recompiles"
    cmd = [sys.executable, job["script"], "--seed", "1", *job["flags"]]
    if job.get("peers"):  # SB3's driver (its --seed in its flags) or TorchRL's script (hydra overrides)
        python, site = peers_python(job["peers"])
        hook, _, rest = run_env["PYTHONPATH"].partition(os.pathsep)  # hook_env put the hook's folder first
        run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook, site, rest])) if site else hook
        cmd = [python, job["script"], *job["flags"]]
    if job["side"] == "leanrl":
        cmd += ["--results-file", str(folder / "results.jsonl")]
    code, timed_out = call(cmd, folder, run_env, cores, deadline, log)
    keys = ("side", "pair", "variant", "env_id", "num_envs", "flags", "steps_per_iter", "k0", "k0_steps", "left_out")
    record = {k: job[k] for k in keys if k in job}
    record.update(kind="run", script=Path(job["script"]).name, exit_code=code, wall_s=time.time() - start)
    data = json.loads(stamps.read_text()) if stamps.exists() else {}
    record["affinity"] = data.get("affinity")  # the cores the measured process ran on, as it saw them
    figures = window_figures(
        data.get("stamps", []), job["steps_per_iter"], start, data.get("window_from"), data.get("window_to"),
        data.get("counts"),
    )  # fmt: skip
    record.update(figures or {})
    text = log.read_text(errors="replace")
    if figures is None:
        tail = [line for line in text.splitlines() if line.strip()][-3:]
        why = "stopped at the session's deadline" if timed_out else f"exit {code}"
        record.update(status=f"no window ({why}, in phase {data.get('phase', 'start')})", log_tail=tail)
    else:
        record["status"] = "ok" if code == 0 or data.get("phase") == "done" else f"window, then exit {code}"
    if compiled:
        record["recompiles_warmup"], record["recompiles_after"] = count_recompiles(text)
    if job.get("sync_iters") and "syncs" in data:
        record["sync_iters"] = job["sync_iters"]
        record["syncs"] = data["syncs"]
    results = folder / "results.jsonl"
    if results.exists() and results.read_text().strip():
        line = json.loads(results.read_text().splitlines()[-1])
        record["results_line"] = {k: line.get(k) for k in ("status", "steps", "sps", "mean_return", "episodes")}
    if data.get("profile"):
        record["profile"] = data["profile"]
    return record


def call(cmd, folder, env, cores, deadline, log):
    """Run cmd; at the deadline send SIGINT (a script writes its line), then SIGKILL 15 s later. (exit code, late)"""
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinned(cores)
        )
        try:
            return proc.wait(timeout=max(1.0, deadline - time.time())), False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                return proc.wait(timeout=15), True
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait(), True


def env_inductor():
    """Inductor options gpu_session.sh asked for (for a torch that needs them), applied in every measured process."""
    raw = os.environ.get("GPU_SESSION_INDUCTOR")
    return json.loads(raw) if raw else None


def profile_markdown(record):
    """The profile of a twin run: host time per rollout step by kind, GPU busy fraction, top ops."""
    prof = record["profile"]
    events = prof["events"]
    rollout_steps = prof["iterations"] * record["steps_per_iter"] // record["num_envs"]
    wall_us = prof["wall_s"] * 1e6
    per_step = lambda us: f"{us / rollout_steps:,.1f}"
    lines = [
        f"# Profile: {'LeanRL' if record.get('side') == 'leanrl-peer' else 'ours'}, `{Path(record['script']).name}` "
        f"{record['variant']}, {record['env_id']}, {record['num_envs']} envs",
        "",
        f"{prof['iterations']} iterations after the steady window ({rollout_steps} rollout steps and their updates), "
        f"{prof['wall_s']:.2f} s of wall time, {per_step(wall_us)} us a rollout step in all.",
        "",
        "| host time | us per rollout step | share of the wall time |",
        "|---|---|---|",
    ]
    named = [e for e in events if e["name"].startswith(("env.", "graph.")) and e["cpu_us"] > 0]
    copies = [e for e in events if e["name"] in ("aten::copy_", "aten::_to_copy", "aten::to")]
    inside = {"env.step": " (send and recv inside)"}  # envpool's step is its send, then its recv
    for e in sorted(named, key=lambda e: -e["cpu_us"]):
        name = f"`{e['name']}`{inside.get(e['name'], '')} ({e['calls']} calls)"
        lines.append(f"| {name} | {per_step(e['cpu_us'])} | {e['cpu_us'] / wall_us:.0%} |")
    copy_us = max((e["cpu_us"] for e in copies), default=0.0)
    lines.append(f"| copies (`aten::copy_`, uploads and downloads) | {per_step(copy_us)} | {copy_us / wall_us:.0%} |")
    kernels = prof["device_us"]
    lines += [
        "",
        f"GPU busy: {kernels / wall_us:.0%} of the wall time (the self device time of every event, kernels and "
        "copies, over the profiled wall time)."
        if kernels
        else "GPU busy: no device events (a CPU run).",
        "",
        "Top host ops by self CPU time:",
        "",
        "| op | calls | self CPU us | us per rollout step |",
        "|---|---|---|---|",
    ]
    for e in sorted(events, key=lambda e: -e["self_cpu_us"])[:15]:
        lines.append(f"| `{e['name'][:70]}` | {e['calls']} | {e['self_cpu_us']:,.0f} | {per_step(e['self_cpu_us'])} |")
    if kernels:
        lines += ["", "Top device ops:", "", "| op | calls | device us |", "|---|---|---|"]
        for e in sorted(events, key=lambda e: -e["self_device_us"])[:10]:
            lines.append(f"| `{e['name'][:70]}` | {e['calls']} | {e['self_device_us']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder for results.jsonl, summary.md, profile.md, logs.tar.gz")
    parser.add_argument("--dry-run", action="store_true", help="tiny budgets on the CPU, no --compile/--cudagraphs")
    parser.add_argument("--peer", default=str(ROOT / ".whl" / "peers" / "leanrl"), help="LeanRL's patched scripts")
    parser.add_argument("--no-peer", action="store_true", help="our scripts only (no folder of LeanRL's at hand)")
    parser.add_argument("--budget-s", type=float, help="seconds the lanes may run (default 470, dry run 600)")
    parser.add_argument("--lanes", help="run only these lanes (comma-separated names), e.g. for a test")
    parser.add_argument("--pairs", help="run only these pairs (comma-separated), e.g. to settle one pair's figure")
    parser.add_argument("--profile", help="profile the twin --compile --cudagraphs runs of these pairs, ours and "
                        "LeanRL's (comma-separated; default: PPO Atari's at 8 envs, ours)")  # fmt: skip
    parser.add_argument("--rounds", action="store_true", help="instead of the lanes: each pair's twin and LeanRL's "
                        "at the same moment on equal cores, then with the cores swapped (--pairs: some)")  # fmt: skip
    parser.add_argument("--fast", action="store_true", help="PQN Atari's twin in its fast configuration alone, "
                        "profiled, after the env's ceiling at its env count (with --alone: after it)")  # fmt: skip
    parser.add_argument("--alone", action="store_true", help="PPO Atari's twin at 8 envs alone on the machine, after "
                        "the env's ceiling on the same cores; then the rounds with --rounds, else nothing")  # fmt: skip
    parser.add_argument("--peers", metavar="DIR", help="instead of the lanes: SB3's and TorchRL's runs beside ours "
                        "(SAC, TD3, PPO continuous, DQN), from DIR: a venv made by benchmarks/peers/install.sh or the "
                        "folder of its --offline mode")  # fmt: skip
    parser.add_argument("--ceiling", nargs=4, metavar=("FAMILY", "ENV", "NUM_ENVS", "SECONDS"), help=argparse.SUPPRESS)
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--ceiling":
        family, env_id, num_envs, seconds = sys.argv[2:6]
        return ceiling_main(family, env_id, int(num_envs), float(seconds))
    args = parser.parse_args(argv)
    out, args.peer = Path(args.out).resolve(), str(Path(args.peer).resolve())
    if args.peers is not None:  # SB3 and TorchRL: their own call (LeanRL's scripts are not run in it)
        args.peers = str(Path(args.peers).resolve())
        why = None
        if peers_python(args.peers) is None:
            why = "not a venv made by benchmarks/peers/install.sh nor the folder of its --offline mode"
            why += " (no torchrl-sota/ beside bin/python or SB3's and TorchRL's packages)"
        elif args.rounds or args.alone or args.fast:
            why = "a call of its own: not with --rounds, --alone or --fast"
        if why:
            print(f"gpu_session: error: --peers {args.peers}: {why}", file=sys.stderr)
            return 2
    elif not args.no_peer and not (Path(args.peer) / "leanrl").is_dir():
        print(f"gpu_session: error: --peer {args.peer} has no leanrl/ folder of LeanRL's scripts", file=sys.stderr)
        return 2
    if args.rounds and args.no_peer:
        print(
            "gpu_session: error: --rounds measures ours beside LeanRL's twins: give --peer, not --no-peer",
            file=sys.stderr,
        )
        return 2
    if out.exists() and any(out.iterdir()):
        print(f"gpu_session: error: {out} is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    budget = args.budget_s or (600.0 if args.dry_run else 470.0)  # a dry run ends when its runs do
    work = Path(tempfile.mkdtemp(prefix="gpu-session-"))
    sys.path.insert(0, str(ROOT))
    from benchmarks.harness import hook_env, session_machine  # not at the top: a measured process loads this file

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env = hook_env(work / "site", env, __file__, "install")
    env["CUDA_VISIBLE_DEVICES"] = "" if args.dry_run else env.get("CUDA_VISIBLE_DEVICES", "0")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "inductor"))  # cold: a bare machine compiles everything
    results = out / "results.jsonl"
    info = dict(session_machine(), inductor=env_inductor())
    if args.peers is not None:
        info["peers"] = peers_versions(args.peers)
    command = ["benchmarks/gpu_session.py", *(a for a in (argv or sys.argv[1:]) if a != args.out), "OUT"]
    info.update(dry_run=args.dry_run, budget_s=budget, command=" ".join(command).replace(str(ROOT) + "/", ""))
    write = threading.Lock()

    def record(rec):
        with write, results.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    record(info)
    print(f"gpu_session: {info['device']}, {info['cpu']} ({info['cpu_count']} cores), torch {info['torch']}")
    cores = sorted(os.sched_getaffinity(0))
    split = lambda arg: arg.split(",") if arg else None
    whole = plan(args.peer, args.dry_run, cores)
    lanes = peers_plan(whole, args.peers, cores) if args.peers else whole
    lanes = select(lanes, split(args.lanes), split(args.pairs), split(args.profile), peer=not args.no_peer)
    deadline = time.time() + budget

    def run_one(name, n, job, job_cores, **extra):
        label = job.get("variant", "ceiling")
        what = f"{job.get('side', '')} {job.get('pair', job.get('family'))} {label}".strip()
        if time.time() > deadline - (3 if args.dry_run else 30):  # no time left for a window
            record(dict(kind="skipped", lane=name, what=what, status="skipped: session deadline", **extra))
            return
        started = time.time()
        rec = run_job(job, work / "runs" / f"{name}-{n:02d}", job_cores, deadline, env)
        rec.update(lane=name, cores=len(job_cores), core_ids=list(job_cores), started=started, what=what, **extra)
        rec["logs"] = f"runs/{name}-{n:02d}"  # its log and stamps in logs.tar.gz
        record(rec)
        sps = rec.get("sps")
        print(f"gpu_session: [{name}] {what}: {rec.get('status', 'ok')}, " + (f"{sps:,.0f} steps/s" if sps else ""))

    def lane_loop(name, lane_cores, jobs):
        for n, job in enumerate(jobs):
            run_one(name, n, job, lane_cores, **({"peers": True} if args.peers else {}))

    def slot_loop(slot, a, b, pairs):
        for n, (ours, theirs) in enumerate(pairs):  # round 1: ours on a, LeanRL's on b; round 2: swapped
            for r, (mine, peers) in enumerate([(a, b), (b, a)], 1):
                both = [
                    threading.Thread(
                        target=run_one,
                        args=(f"{slot}-{side}", 2 * n + r, job, job_cores),
                        kwargs=dict(slot=slot, round=r),
                    )  # fmt: skip
                    for side, job, job_cores in (("ours", ours, mine), ("leanrl", theirs, peers))
                ]
                for t in both:
                    t.start()
                for t in both:
                    t.join()

    if args.alone:  # first, with nothing else on the machine
        for n, job in enumerate(alone_plan(whole)):
            run_one("alone", n, job, cores, alone=True)
    if args.fast:
        for n, job in enumerate(fast_plan(whole, args.dry_run)):
            run_one("fast", n, job, cores, alone=True, fast=True)
    if args.rounds:
        threads = [
            threading.Thread(target=slot_loop, args=slot) for slot in rounds_plan(whole, cores, split(args.pairs))
        ]
    else:
        threads = [] if args.alone or args.fast else [threading.Thread(target=lane_loop, args=lane) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    try:  # the tables: a failure here still leaves results.jsonl and the logs
        records = [json.loads(line) for line in results.read_text().splitlines()]
        profiled = [r for r in records if r.get("profile")]
        profiles = "\n".join(profile_markdown(r) for r in profiled) or "no profile was recorded\n"
        (out / "profile.md").write_text(profiles)
        from plots.plot import gpu_markdown

        (out / "summary.md").write_text(gpu_markdown(records))
    except Exception:
        import traceback

        (out / "summary.md").write_text("gpu_session: the tables failed:\n\n" + traceback.format_exc())
    finally:
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            tar.add(work / "runs", arcname="runs")
        shutil.rmtree(work, ignore_errors=True)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
