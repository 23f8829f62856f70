"""Steady-state speed of leanrl scripts, measured in turn from one or more checkouts ("sides").

    python3 benchmarks/steady.py --run "leanrl/dqn.py --total-timesteps 30000" --cpu 1 --cold --rounds 3 \\
        --side base=../leanrl-base --side new=.

Each --run (a script relative to a side's root, and its flags) runs as a subprocess of that side's checkout, rounds
times, round-robin over the sides (base, new, base, new, ...), so a drift in the machine's load hits both alike.
--cpu N pins it to core N (taskset); OMP_NUM_THREADS=1 unless the environment sets it (always 1 when pinned);
--cold gives each run an empty inductor cache, so the warm-up includes a cold compile.

The figures come from per-iteration timestamps: a sitecustomize that this harness puts on the run's PYTHONPATH wraps
leanrl.bookkeeping's Run.tick to note (step, wall time, process CPU time) in memory and Run.__exit__ to write them to
ticks.csv, so both sides run their commit's code unchanged and a normal run pays nothing. The warm-up is the script's
own burn-in (Run.burnin ticks, what its results line leaves out; at least one tick), stretched to --warmup-s seconds
from the process start if asked. Reported: steps per wall-second and per process CPU-second after the warm-up, the
time from the process start to the end of the warm-up (imports, env, compile, burn-in: "compile time" with --cold) and
the median, p10 and p90 of the seconds per steady iteration. A side whose bookkeeping has no Run.tick falls back to its
results line's sps (no CPU time, no warm-up, no spread).

--peer DIR adds one more side, named peer, measured after ours in each round: LeanRL's scripts (DIR/leanrl/<script>.py,
the same file names as ours; a script it lacks is left out of its side). They have no bookkeeping and no results line:
the recorder stamps the end of every iteration of the first tqdm loop they iterate over (harness.stamp_first_loop;
PPO: num_envs * num_steps env steps an item; the off-policy scripts: one vector step of num_envs envs), their warm-up
ends at the env step where our script's burn-in ended in the same round, they run with WANDB_MODE=disabled and without
the flags their Args lack. The table adds the ratio of the last --side to the peer.

--peer-sb3 VENV and --peer-torchrl VENV add the peers most PyTorch users run instead, each a side after ours in each
round, run by VENV/bin/python (benchmarks/peers/install.sh VENV: stable-baselines3 and torchrl pinned, the same torch):
SB3 through a driver per algorithm (benchmarks/peers/sb3_<algo>.py), TorchRL through its own sota-implementations
(VENV/torchrl-sota/<algo>/, hydra overrides), for the pairs they share (SAC, TD3, PPO continuous, DQN CartPole, PPO
and DQN on Atari: gymnasium's ALE/<game> beside our envpool <game>); the work per env step (batch, updates per step,
network sizes) set equal to our script's flags and defaults (peer_argv_for: the table names the flags a peer cannot
follow). TorchRL runs in each row with its compile option as ours (our eager
script: compile.compile=False, a twin --compile: True); SB3 has none, so a twin's row takes its ratio to SB3 from the
eager script's SB3 run of the same round. Both step a progress bar by hand (SB3's drivers once a rollout, TorchRL once
a collected batch, before training on it): the recorder stamps every update of the first bar (harness.stamp_first_bar),
and the warm-up ends one stamp after the LeanRL peer's would, after the update of the batch where our burn-in ended
(TorchRL compiles in PPO's first update); a stamp's CPU time adds the live child processes' (TorchRL's ParallelEnv
workers). The table adds the ratio of the last --side to each peer.

Output in --out: steady.md (the table, also printed) for this invocation, steady.jsonl (every measurement, with the
machine and the commit of each side; appended) and steady_runs/ (each run's log, ticks.csv and results line).
This file is also loaded inside the measured process (record_ticks): keep its top-level imports to the stdlib.
"""

import argparse
import ast
import contextlib
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ITER_KEYS = ("iter_s_median", "iter_s_p10", "iter_s_p90")
TICKS_FILE = "LEANRL_TICKS_FILE"  # where the measured process writes its ticks
TICKS_FROM = "LEANRL_TICKS_FROM"  # "tqdm": a peer's script, stamped through its progress loop
BAR_TOTAL = "LEANRL_BAR_TOTAL"  # "bar": the total of the bar to stamp, the run's env steps
PEER = "peer"  # the peer's side
PEER_STAMP = "LeanRL (patched, see docs/cpu-speed.md)"  # what the table calls the peer: no local path
PEER_FOLDER = "<patched LeanRL>"  # and its folder in the command that measured it
SB3, TORCHRL = "sb3", "torchrl"  # the sides of --peer-sb3 and --peer-torchrl
VENV_FOLDER = "<peers venv>"  # their venv in the command that measured them
PACKAGES = {SB3: ("stable-baselines3",), TORCHRL: ("torchrl", "tensordict")}  # stamped by their installed versions
TORCHRL_FRAMES = 200  # frames per collected batch of TorchRL's off-policy scripts (their default 1,000): see below
TORCHRL_FRAME_SKIP = 4  # TorchRL's Atari scripts take frame counts in emulator frames and divide them by 4

# ---------------------------------------------------------------- inside the measured process


def record_ticks(harness):
    """Wrap leanrl.bookkeeping's Run as soon as the script imports it (whichever checkout it comes from); a peer's
    script: stamp its progress loop (harness.stamp_first_loop). Called by harness.hook_env's sitecustomize."""
    import importlib.machinery

    ticks_file = os.environ.pop(TICKS_FILE, None)
    if ticks_file is None:
        return
    source = os.environ.pop(TICKS_FROM, None)
    if source == "tqdm":
        stamp_tqdm(harness, ticks_file)
        return
    if source == "bar":
        stamp_bar(harness, ticks_file)
        return

    class Finder:
        def find_spec(self, name, path, target=None):
            if name != "leanrl.bookkeeping":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                exec_module = spec.loader.exec_module

                def exec_and_wrap(module):
                    exec_module(module)
                    wrap_run(module, ticks_file)

                spec.loader.exec_module = exec_and_wrap
            return spec

    sys.meta_path.insert(0, Finder())


def wrap_run(bookkeeping, ticks_file):
    run = getattr(bookkeeping, "Run", None)
    if run is None or not hasattr(run, "tick"):
        return  # an older bookkeeping: the harness falls back to the results line
    tick, leave = run.tick, run.__exit__

    def tick_noted(self, step):
        tick(self, step)
        self.__dict__.setdefault("noted_ticks", []).append((step, time.time(), cpu_time()))

    def exit_noted(self, *exc):
        try:
            return leave(self, *exc)  # may exit the process: the ticks are written in `finally`
        finally:
            if getattr(self, "record", True):  # not the other ranks of a distributed run
                header = {"burnin": getattr(self, "burnin", 0), "bookkeeping": bookkeeping.__file__}
                write_ticks(ticks_file, header, self.__dict__.get("noted_ticks", []))

    run.tick, run.__exit__ = tick_noted, exit_noted


def stamp_tqdm(harness, ticks_file):
    """A peer's script: note (env steps so far, wall time, CPU time) at the end of every iteration of its training
    loop (the first tqdm loop it iterates over), and write them when the process exits."""
    import atexit

    header, rows = {"source": "tqdm", "steps_per_item": None}, []

    def stamp(done, now):  # the start of item done + 1 is the end of item done
        if header["steps_per_item"] is None:
            header["steps_per_item"] = steps_per_item(vars(sys.modules["__main__"]).get("args"))
        if done:
            rows.append((done * header["steps_per_item"], now, cpu_time()))

    harness.stamp_first_loop(stamp, on_end=stamp)
    atexit.register(lambda: write_ticks(ticks_file, header, rows))


def stamp_bar(harness, ticks_file):
    """SB3's and TorchRL's side: note (env steps so far, wall time, CPU time) after every update of the first progress
    bar (its count is env steps), and write them when the process exits."""
    import atexit

    header, rows = {"source": "bar", "steps_per_item": 1}, []
    total = int(os.environ.pop(BAR_TOTAL)) if os.environ.get(BAR_TOTAL) else None  # the bar of the run's frames
    harness.stamp_first_bar(lambda done, now: rows.append((done, now, cpu_time() + descendants_cpu_time())), total)
    atexit.register(lambda: write_ticks(ticks_file, header, rows))


def descendants_cpu_time():
    """CPU seconds of this process's live descendants (TorchRL's ParallelEnv workers step the envs in processes of
    their own): getrusage counts a child only once it has been waited for, mostly at the end of the run."""
    tick, total, todo = os.sysconf("SC_CLK_TCK"), 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
            if pid != os.getpid():  # utime, stime, and those of its children it waited for: fields 14 to 17
                total += sum(map(int, Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[11:15])) / tick
        except (OSError, ValueError):  # gone meanwhile (then counted by getrusage once waited for), or no /proc
            continue
    return total


def steps_per_item(args):
    """Env steps in one item of a CleanRL-style training loop, from the script's parsed `args`: a PPO iteration
    (it has num_steps) steps num_envs envs num_steps times, an off-policy iteration steps them once; one step an
    item where the script has no module-level `args`."""
    return getattr(args, "num_envs", 1) * getattr(args, "num_steps", 1)


def cpu_time():
    """CPU seconds of this process and of the children it waited for (the C++ compiler that inductor runs)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def write_ticks(path, header, rows):
    with open(path, "w") as f:
        f.write(f"# {json.dumps(header)}\nstep,wall,cpu\n")
        f.writelines(f"{s},{w:.6f},{c:.6f}\n" for s, w, c in rows)


# ---------------------------------------------------------------- the arithmetic


def read_ticks(path):
    """(header, [(step, wall time, process CPU time), ...]) from a ticks.csv."""
    lines = Path(path).read_text().splitlines()
    header = json.loads(lines[0].removeprefix("# "))
    return header, [(int(s), float(w), float(c)) for s, w, c in (line.split(",") for line in lines[2:])]


def quantile(values, q):
    """The q-quantile, linear between the nearest values (numpy's default)."""
    values = sorted(values)
    k = q * (len(values) - 1)
    lo = int(k)
    return values[lo] + (values[min(lo + 1, len(values) - 1)] - values[lo]) * (k - lo)


def steady_state(ticks, start, burnin, warmup_s=0.0):
    """The figures of one run from its ticks; `start` is the wall time the process was started. None if no iteration
    came after the warm-up. The warm-up ends at tick max(burnin, 1), or at the first later tick at least
    `warmup_s` seconds after the start."""
    end = max(burnin, 1) - 1
    while end < len(ticks) - 1 and ticks[end][1] - start < warmup_s:
        end += 1
    if end >= len(ticks) - 1:
        return None
    (step0, wall0, cpu0), (step1, wall1, cpu1) = ticks[end], ticks[-1]
    gaps = [b[1] - a[1] for a, b in zip(ticks[end:], ticks[end + 1 :])]
    steps = step1 - step0
    return dict(
        warmup_s=wall0 - start,
        warmup_cpu_s=cpu0,  # CPU time of the process (and its children) from its start
        steady_iterations=len(gaps),
        steady_steps=steps,
        steady_s=wall1 - wall0,
        sps_wall=steps / (wall1 - wall0) if wall1 > wall0 else None,
        sps_cpu=steps / (cpu1 - cpu0) if cpu1 > cpu0 else None,
        iter_s_median=statistics.median(gaps),
        iter_s_p10=quantile(gaps, 0.1),
        iter_s_p90=quantile(gaps, 0.9),
    )


def steps_burnin(ticks, burnin):
    """The env steps done when a run's burn-in (`burnin` ticks, at least one) ended; None if it ended in it."""
    end = max(burnin, 1)
    return ticks[end - 1][0] if end <= len(ticks) else None


def peer_burnin(ticks, steps, before_update=False):
    """The peer's burn-in in ticks: up to the first tick at or past `steps` env steps, where our script's burn-in
    ended (after its update); one tick more where the peer's tick comes `before_update` of the batch it ends (an SB3 or
    TorchRL bar: TorchRL compiles in PPO's first update); all the ticks and one more (no steady state) if none is."""
    reached = next((k for k, (step, _, _) in enumerate(ticks, 1) if step >= steps), len(ticks) + 1)
    return min(reached + before_update, len(ticks) + 1)


def schedule(labels, sides, rounds, absent=()):
    """The order of the runs: each round runs every label on every side in turn (A, B, A, B, ... per label), but
    not the (label, side) pairs in `absent` (a script the peer lacks)."""
    return [(r, label, side) for r in range(1, rounds + 1) for label in labels for side in sides
            if (label, side) not in absent]  # fmt: skip


def peer_argv(argv, script):
    """`argv` less the flags that the Args dataclass of the peer's `script` lacks, each with its values (tyro's
    names: --field-name, and --no-field-name for a boolean); and the flags left out."""
    tree = ast.parse(Path(script).read_text())
    args = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"), None)
    fields = {node.target.id for node in getattr(args, "body", []) if isinstance(node, ast.AnnAssign)}
    kept, left_out, keep = [argv[0]], [], True
    for word in argv[1:]:
        if word.startswith("--"):
            name = word[2:].split("=")[0].replace("-", "_")
            keep = name in fields or (name.startswith("no_") and name[3:] in fields)
            if not keep:
                left_out.append(word)
        if keep:
            kept.append(word)
    return kept, left_out


def script_values(argv, script):
    """Our run's hyper-parameters: the defaults of `script`'s Args, replaced by the flags of `argv` (tyro's names)."""
    tree = ast.parse(Path(script).read_text())
    args = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"), None)
    values = {}
    for node in getattr(args, "body", []):
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            value, cast = node.value, None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("int", "float") and value.args:
                value, cast = value.args[0], {"int": int, "float": float}[value.func.id]  # int(1e6)
            with contextlib.suppress(ValueError, TypeError, SyntaxError):  # not a literal (a Path, a call): left out
                values[node.target.id] = (cast or (lambda x: x))(ast.literal_eval(value))
    for k, word in enumerate(argv[1:], 1):
        if not word.startswith("--"):
            continue
        name, _, value = word[2:].partition("=")
        name = name.replace("-", "_")
        if name.startswith("no_"):
            values[name[3:]] = False
            continue
        if not value:
            value = argv[k + 1] if k + 1 < len(argv) and not argv[k + 1].startswith("--") else "True"
        try:
            values[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            values[name] = value
    return values


# flags that change no work per env step (or that the harness sets): a peer need not follow them
NEUTRAL = {"seed", "measure_burnin", "cuda", "compile", "cudagraphs", "torch_deterministic", "track", "capture_video"}
SB3_DRIVERS = {  # our pair: the SB3 driver, and our flags it follows
    "sac_continuous_action": ("sb3_sac.py", {"env_id", "total_timesteps", "learning_starts"}),
    "td3_continuous_action": ("sb3_td3.py", {"env_id", "total_timesteps", "learning_starts"}),
    "ppo_continuous_action": (
        "sb3_ppo.py",
        {"env_id", "total_timesteps", "num_steps", "num_minibatches", "update_epochs"},
    ),
    "dqn": ("sb3_dqn.py", {"env_id", "total_timesteps", "learning_starts"}),
    "ppo_atari_envpool": (
        "sb3_ppo_atari.py",
        {"env_id", "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"},
    ),
    "dqn_atari_envpool": (
        "sb3_dqn_atari.py",
        {
            "env_id",
            "total_timesteps",
            "learning_starts",
            "num_envs",
            "buffer_size",
            "batch_size",
            "train_frequency",
            "target_network_frequency",
        },
    ),
}
ALE_PAIRS = ("ppo_atari_envpool", "dqn_atari_envpool")  # our envpool game Breakout-v5 is gymnasium's ALE/Breakout-v5


def peer_argv_for(peer, argv, script):
    """The command of an SB3 or TorchRL peer for our run `argv` of `script` (our pair's file, eager or twin): (a script
    relative to the peer's folder and its flags, our flags it cannot follow), or None where it has no such
    algorithm. Every value that sets the work per env step comes from our run: SB3's drivers hold our defaults
    (benchmarks/peers/), TorchRL's scripts get theirs as hydra overrides. TorchRL's off-policy scripts collect
    TORCHRL_FRAMES frames, then run that many updates (utd_ratio 1: one update of a 256 batch per env step, as ours),
    so that our budgets give them a dozen stamps after our burn-in (their 1,000 would give two); their Atari scripts
    take frame counts in emulator frames (TORCHRL_FRAME_SKIP a step), and their DQN the same batches."""
    pair = Path(script).stem.removesuffix("_torchcompile")
    values = script_values(argv, script)
    if pair in ALE_PAIRS:
        values["env_id"] = f"ALE/{values['env_id']}"
    given = {word[2:].partition("=")[0].replace("-", "_") for word in argv[1:] if word.startswith("--")}
    given = {name[3:] if name.startswith("no_") and name[3:] in values else name for name in given} - NEUTRAL
    if peer == SB3:
        if pair not in SB3_DRIVERS:
            return None
        driver, follows = SB3_DRIVERS[pair]
        words = [f"benchmarks/peers/{driver}", "--env-id", values["env_id"], "--total-timesteps"]
        words += [str(values["total_timesteps"]), "--seed", str(values.get("seed", 1))]
        if "learning_starts" in follows:
            words += ["--learning-starts", str(values["learning_starts"])]
        for name in sorted(follows & given - {"env_id", "total_timesteps", "learning_starts"}):  # the rest if given
            words += [f"--{name.replace('_', '-')}", str(values[name])]
        return words, sorted(given - follows)
    total, env = values["total_timesteps"], values["env_id"]
    common = ["logger.backend=", f"compile.compile={'--compile' in argv}"]  # no wandb; its compile option as ours
    common += ["compile.cudagraphs=True"] if "--cudagraphs" in argv else []  # and its CUDA graphs (a GPU's runs)
    if pair in ("sac_continuous_action", "td3_continuous_action"):
        algo = pair[:3]
        follows = {"env_id", "total_timesteps", "learning_starts", "batch_size", "buffer_size"}
        words = [f"{algo}/{algo}.py", f"env.name={env}", f"collector.total_frames={total}",
                 f"collector.init_random_frames={values['learning_starts']}",
                 f"collector.frames_per_batch={TORCHRL_FRAMES}", "collector.env_per_collector=1", "optim.utd_ratio=1.0",
                 f"optim.batch_size={values['batch_size']}",
                 f"replay_buffer.size={values['buffer_size']}", "network.hidden_sizes=[256,256]"]  # fmt: skip
        if algo == "td3":
            follows.add("policy_frequency")
            words.append(f"optim.policy_update_delay={values['policy_frequency']}")
        return words + common, sorted(given - follows)
    if pair == "ppo_continuous_action":
        follows = {"env_id", "total_timesteps", "num_steps", "num_minibatches", "update_epochs"}
        frames = values["num_steps"] * values["num_envs"]
        words = ["ppo/ppo_mujoco.py", f"env.env_name={env}", f"collector.total_frames={total}",
                 f"collector.frames_per_batch={frames}", f"loss.mini_batch_size={frames // values['num_minibatches']}",
                 f"loss.ppo_epochs={values['update_epochs']}", f"logger.test_interval={2 * total}"]  # fmt: skip
        return words + common, sorted(given - follows)
    if pair == "dqn":  # batches of 1,000 frames (theirs), train_frequency's share of updates each
        freq = values["train_frequency"]
        follows = {"env_id", "total_timesteps", "learning_starts", "batch_size", "buffer_size", "train_frequency",
                   "target_network_frequency", "exploration_fraction"}  # fmt: skip
        words = ["dqn/dqn_cartpole.py", f"env.env_name={env}", f"collector.total_frames={total}",
                 f"collector.init_random_frames={values['learning_starts']}", "collector.frames_per_batch=1000",
                 f"loss.num_updates={1000 // freq}",
                 f"loss.hard_update_freq={values['target_network_frequency'] // freq}",
                 f"buffer.batch_size={values['batch_size']}", f"buffer.buffer_size={values['buffer_size']}",
                 f"collector.annealing_frames={int(values['exploration_fraction'] * total)}",
                 f"logger.test_interval={2 * total}"]  # fmt: skip
        return words + common, sorted(given - follows)
    skip = TORCHRL_FRAME_SKIP
    if pair == "ppo_atari_envpool":  # a negative test_interval: no evaluation (a positive one evaluates at batch 0)
        follows = {"env_id", "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"}
        frames = values["num_steps"] * values["num_envs"]
        words = ["ppo/ppo_atari.py", f"env.env_name={env}", f"env.num_envs={values['num_envs']}",
                 f"collector.total_frames={skip * total}", f"collector.frames_per_batch={skip * frames}",
                 f"loss.mini_batch_size={skip * frames // values['num_minibatches']}",
                 f"loss.ppo_epochs={values['update_epochs']}", f"logger.test_interval=-{skip}"]  # fmt: skip
        return words + common, sorted(given - follows)
    # DQN: batches of TORCHRL_FRAMES steps, train_frequency's share of updates each; random actions for our learning
    # starts, but updates from a quarter of them (it compares the emulator frames collected with init_random_frames /
    # 4), which our burn-in covers
    if pair == "dqn_atari_envpool":
        freq = values["train_frequency"]
        follows = {"env_id", "total_timesteps", "learning_starts", "batch_size", "buffer_size", "train_frequency",
                   "target_network_frequency", "exploration_fraction"}  # fmt: skip
        words = ["dqn/dqn_atari.py", f"env.env_name={env}", f"collector.total_frames={skip * total}",
                 f"collector.init_random_frames={skip * values['learning_starts']}",
                 f"collector.frames_per_batch={skip * TORCHRL_FRAMES}", f"loss.num_updates={TORCHRL_FRAMES // freq}",
                 f"loss.hard_update_freq={values['target_network_frequency'] // freq}",
                 f"buffer.batch_size={values['batch_size']}", f"buffer.buffer_size={values['buffer_size']}",
                 f"collector.annealing_frames={skip * int(values['exploration_fraction'] * total)}",
                 f"logger.test_interval={2 * skip * total}"]  # fmt: skip
        return words + common, sorted(given - follows)
    return None


def bar_total(argv):
    """The total of the bar to stamp in an SB3 or TorchRL peer's command: the one counting the run's env steps (SB3's
    --total-timesteps, TorchRL's collector.total_frames override, in emulator frames for Atari); None where the
    command names neither."""
    if "--total-timesteps" in argv:
        return int(argv[argv.index("--total-timesteps") + 1])
    frames = next((int(w.split("=")[1]) for w in argv if w.startswith("collector.total_frames=")), None)
    return frames // TORCHRL_FRAME_SKIP if frames is not None and argv[0].endswith("_atari.py") else frames


def peer_versions(venv):
    """The installed versions of the peers' packages (and torch) in `venv`: {name: version}."""
    names = sorted({name for names in PACKAGES.values() for name in names} | {"torch"})
    code = """import importlib.metadata as m, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(found))"""
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, *names], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


# ---------------------------------------------------------------- one run


def recording_env(folder):
    """The environment of a measured process: its sitecustomize in `folder` calls record_ticks (harness.hook_env)."""
    from benchmarks.harness import hook_env  # not at the top: the measured process loads this file alone

    env = hook_env(folder, os.environ, __file__, "record_ticks")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def measure(
    argv, root, folder, start_env, cpu=None, cold=False, warmup_s=0.0, peer=None, burnin_steps=None, python=None
):
    """Run `argv` (a script relative to `root`, and its flags) once in `folder`; its figures as a dict. A `peer`
    script is stamped through its tqdm loop ("tqdm": LeanRL's) or its progress bar's updates ("bar": SB3's drivers,
    TorchRL's scripts, run by `python`, their venv's), its warm-up ending at `burnin_steps` env steps."""
    folder.mkdir(parents=True)
    results, ticks = folder / "results.jsonl", folder / "ticks.csv"
    cmd = [python or sys.executable, str(root / argv[0]), *argv[1:]]
    cmd += [] if peer else ["--results-file", str(results)]
    env = dict(start_env, **{TICKS_FILE: str(ticks)})
    if peer:  # LeanRL's scripts call wandb.init unless it is disabled
        env.update({TICKS_FROM: peer, "WANDB_MODE": "disabled"})
    if peer == "bar":  # the bar to stamp: the one counting the run's env steps
        env[BAR_TOTAL] = str(bar_total(argv) or "")
    if python:  # its venv's packages alone: on its path only the hook's folder (hook_env put it first)
        env["PYTHONPATH"] = env["PYTHONPATH"].split(os.pathsep)[0]
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env["PYTHONPATH"]]))  # this side's leanrl first
    if cpu is not None:
        cmd, env["OMP_NUM_THREADS"] = ["taskset", "-c", str(cpu), *cmd], "1"
    cache = Path(tempfile.mkdtemp(prefix="steady-inductor-")) if cold else None
    if cache:
        env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"] = str(cache), str(cache / "triton")
    with (folder / "log.txt").open("w") as log:
        start = time.time()
        code = subprocess.run(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    if peer:
        return measure_peer(code, ticks, start, burnin_steps, warmup_s, log=str(folder / "log.txt"))
    line = json.loads(results.read_text().splitlines()[-1]) if results.exists() else {}
    record = dict(
        exit_code=code,
        status=line.get("status", "no results line"),
        device=line.get("device"),
        steps=line.get("steps"),
        results_sps=line.get("sps"),
        results_wall_s=line.get("wall_s"),
        log=str(folder / "log.txt"),
    )
    if ticks.exists():
        header, rows = read_ticks(ticks)
        if not Path(header["bookkeeping"]).resolve().is_relative_to(root):  # it measured another checkout
            record["status"] = f"error: imported {header['bookkeeping']}, not this side's leanrl"
            return record
        figures = steady_state(rows, start, header["burnin"], warmup_s)
        record.update(source="ticks", ticks=str(ticks), burnin=header["burnin"], **(figures or {}))
        record["burnin_steps"] = steps_burnin(rows, header["burnin"])
        if figures is None:
            record["status"] += ", but no iteration after the warm-up"
    elif line.get("sps"):
        record.update(source="results line", sps_wall=line["sps"])
    return record


def measure_peer(code, ticks, start, burnin_steps, warmup_s, log):
    """The figures of a peer's run from its stamps: no results line, so its status is its exit code's."""
    record = dict(exit_code=code, status="ok" if code == 0 else f"error: exit code {code}", device=None, log=log)
    if not ticks.exists():
        record["status"] += ", no progress loop stamped"
        return record
    header, rows = read_ticks(ticks)
    record.update(source=header["source"], ticks=str(ticks), steps_per_item=header["steps_per_item"])
    record["burnin_steps"] = burnin_steps
    record["steps"] = rows[-1][0] if rows else 0
    if burnin_steps is None:
        record["status"] += ", but no burn-in to match: no run of our script with ticks in this round"
        return record
    record["burnin"] = peer_burnin(rows, burnin_steps, before_update=header["source"] == "bar")
    figures = steady_state(rows, start, record["burnin"], warmup_s)
    record.update(figures or {})
    if figures is None:
        record["status"] += ", but no iteration after the warm-up"
    return record


# ---------------------------------------------------------------- the table


def fmt(x):
    return "—" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:#.3g}"


def ratio(x):
    return f"{x:.2f}x"


def spread(values, form=fmt):
    """The median, and the range over the rounds when there are several."""
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    middle = form(statistics.median(values))
    return middle if len(values) == 1 else f"{middle} ({form(min(values))}–{form(max(values))})"


def ok_runs(records):
    return [r for r in records if r["status"] == "ok" and r.get("sps_wall")]


def iteration_times(runs):
    """Milliseconds per steady iteration: the median over the runs of each run's median, p10 and p90."""
    median, p10, p90 = (fmt(statistics.median(1000 * r[key] for r in runs)) for key in ITER_KEYS)
    return f"{median} ({p10}–{p90})"


def table(records, sides, ratios=None, absent=(), shared=None):
    """One row per run and side; each (side, base) of `ratios` (default: every side after the first, to the first)
    gets the side's ratio to the base, per round, for both speeds, in the side's row. A (label, side) in `absent` is
    a script that side lacks; one in `shared` ((label, side): other label) is that side's run of the other label
    (SB3, which has no compile option, in a twin's row), its ratios paired with those runs."""
    ratios = [(s, sides[0]) for s in sides[1:]] if ratios is None else ratios
    shared = shared or {}
    labels = list(dict.fromkeys([r["label"] for r in records] + [label for label, _ in [*absent, *shared]]))
    head = "| run | side | rounds ok | steps/CPU-s | steps/s | warm-up s | CPU-s in warm-up | ms/iteration (p10–p90) |"
    lines = [head + "".join(f" {s}/{b}, CPU-s | {s}/{b}, wall |" for s, b in ratios)]
    lines.append("|---" * (8 + 2 * len(ratios)) + "|")
    for label in labels:
        by_side = {side: [r for r in records if r["label"] == shared.get((label, side), label) and r["side"] == side]
                   for side in sides}  # fmt: skip
        for side in sides:
            if (label, side) in shared:
                same = [f"`{label}`", side, f"its `{shared[label, side]}` run"] + ["—"] * 5 + [""] * (2 * len(ratios))
                lines.append("| " + " | ".join(same) + " |")
                continue
            if (label, side) in absent:
                no_script = [f"`{label}`", side, "no such script"] + ["—"] * 5 + [""] * (2 * len(ratios))
                lines.append("| " + " | ".join(no_script) + " |")
                continue
            runs = by_side[side]
            ok = ok_runs(runs)
            cells = [
                f"`{label}`",
                side,
                f"{len(ok)}/{len(runs)}",
                spread([r.get("sps_cpu") for r in ok]),
                spread([r["sps_wall"] for r in ok]),
                spread([r.get("warmup_s") for r in ok]),
                spread([r.get("warmup_cpu_s") for r in ok]),
                iteration_times(ticked) if (ticked := [r for r in ok if "iter_s_median" in r]) else "—",
            ]
            for other, base_side in ratios:
                for key in ("sps_cpu", "sps_wall"):  # paired by round: the two runs nearest in time
                    base = {r["round"]: r.get(key) for r in ok_runs(by_side[base_side])}
                    paired = [r.get(key) / base[r["round"]] for r in ok if r.get(key) and base.get(r["round"])]
                    cells.append(spread(paired, ratio) if side == other else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the command


def label_of(argv):
    """The script and the variant flags that name a row: `dqn_torchcompile.py --compile`."""
    return " ".join([Path(argv[0]).name, *(a for a in argv[1:] if a in ("--compile", "--cudagraphs"))])


def retime(folder):
    """Re-derive the SB3 and TorchRL runs' figures of a finished invocation (--out FOLDER) from their stamps with this
    file's rules, and rewrite its steady.md table and steady.jsonl: for a table measured before a rule changed. Our
    runs and LeanRL's keep their figures (their windows are their burn-ins). Returns the records."""
    records = [json.loads(line) for line in (folder / "steady.jsonl").read_text().splitlines() if line.strip()]
    for record in records:
        if record["side"] not in (SB3, TORCHRL) or not record.get("ticks") or record.get("warmup_s") is None:
            continue  # not a bar peer's, or no window to move (its figures are none either way)
        ticks = Path(record["ticks"])
        if not ticks.exists():  # the folder moved: its own copy
            ticks = folder / "steady_runs" / ticks.as_posix().split("/steady_runs/", 1)[1]
        _, rows = read_ticks(ticks)
        start = rows[record["burnin"] - 1][1] - record["warmup_s"]  # the process start, as the run measured it
        record["burnin"] = peer_burnin(rows, record["burnin_steps"], before_update=record.get("source") == "bar")
        record.update(steady_state(rows, start, record["burnin"], record.get("warmup_floor_s") or 0.0) or {})
        record["retimed"] = True
    sides = list(dict.fromkeys(record["side"] for record in records))
    ours, peers = [s for s in sides if s not in (PEER, SB3, TORCHRL)], [s for s in (PEER, SB3, TORCHRL) if s in sides]
    ratios = [(s, ours[0]) for s in ours[1:]] + [(ours[-1], peer) for peer in peers]
    labels = list(dict.fromkeys(record["label"] for record in records))
    ran = {(record["label"], record["side"]) for record in records}
    pair = lambda label: Path(label.split()[0]).stem.removesuffix("_torchcompile")
    shared, absent = {}, set()
    for label in labels:
        for side in peers:
            if (label, side) in ran:
                continue
            other = [x for x in labels if (x, side) in ran and pair(x) == pair(label)] if side == SB3 else []
            if other:
                shared[label, side] = other[0]
            else:
                absent.add((label, side))
    text = (folder / "steady.md").read_text()
    head, rest = text.split("\n| run | side |", 1)
    tail = rest.split("\n\n", 1)[1] if "\n\n" in rest else ""
    note = ("The peers' windows (SB3, TorchRL) re-timed from their stamps by `benchmarks/steady.py --retime`: "
            "they start one stamp after our burn-in's env step, after the update of that batch.")  # fmt: skip
    head = "\n".join(line for line in head.splitlines() if line != note).rstrip("\n")  # once, however often re-timed
    table_text = table(records, sides, ratios, absent, shared)
    (folder / "steady.md").write_text(f"{head}\n\n{note}\n\n{table_text}\n" + (f"\n{tail}" if tail.strip() else ""))
    (folder / "steady.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return records


def parse(argv, fail):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.error = fail  # one line, exit code 2
    parser.add_argument(
        "--retime",
        type=Path,
        metavar="FOLDER",
        help="instead of measuring: re-derive the SB3 and TorchRL figures of FOLDER (a finished --out) from their "
        "stamps with this file's rules, and rewrite its steady.md and steady.jsonl",
    )
    parser.add_argument(
        "--run",
        action="append",
        metavar="'SCRIPT FLAGS'",
        help="a script relative to each side's root, and its flags, as one string (repeatable)",
    )
    parser.add_argument("--side", action="append", metavar="NAME=PATH",
                        help="a checkout to measure (repeatable; the first is the base of the ratios); "
                        "default: this one, named new")  # fmt: skip
    parser.add_argument("--peer", metavar="DIR",
                        help="LeanRL's scripts (DIR/leanrl/<script>.py, patched to run: see docs/cpu-speed.md), "
                        "measured after ours in each round as the side named peer; the table adds the ratio of the "
                        "last --side to it")  # fmt: skip
    parser.add_argument("--peer-sb3", metavar="VENV", type=Path,
                        help="stable-baselines3 in VENV (benchmarks/peers/install.sh), through benchmarks/peers/"
                        "sb3_<algo>.py, measured after ours in each round as the side named sb3")  # fmt: skip
    parser.add_argument("--peer-torchrl", metavar="VENV", type=Path,
                        help="TorchRL's sota-implementations in VENV/torchrl-sota (benchmarks/peers/install.sh), "
                        "with its compile option as ours, measured after ours in each round as the side named "
                        "torchrl")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="runs of each script on each side (default 3)")
    parser.add_argument("--cpu", type=int, help="pin each run to this core (taskset -c); one torch thread")
    parser.add_argument("--cold", action="store_true", help="an empty inductor cache for each run")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="the warm-up lasts at least this long from the process start (default 0: burn-in only)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "steady", help="default runs/steady")
    parser.add_argument("--command", help=argparse.SUPPRESS)  # what the table says measured it (run.sh's line)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # each run's working directory is its own folder: no path may stay relative
    return args


def main(argv=None):
    sys.path.insert(0, str(ROOT))
    from benchmarks.harness import machine_info  # not at the top: the measured process loads this file alone
    from leanrl import bookkeeping as bk

    fail = lambda message: bk.fail(__file__, message)
    args = parse(argv, fail)
    if args.retime is not None:
        if not (args.retime / "steady.jsonl").is_file() or not (args.retime / "steady.md").is_file():
            fail(f"--retime {args.retime}: no steady.jsonl and steady.md there (a finished --out folder)")
        retime(args.retime.resolve())
        print((args.retime / "steady.md").read_text())
        return 0
    if not args.run:
        fail("the following arguments are required: --run")
    if args.rounds < 1:
        fail(f"--rounds must be positive, got {args.rounds}")
    if args.warmup_s < 0:
        fail(f"--warmup-s must not be negative, got {args.warmup_s}")
    if args.cpu is not None and (args.cpu not in os.sched_getaffinity(0) or not shutil.which("taskset")):
        cores = sorted(os.sched_getaffinity(0))
        fail(f"--cpu {args.cpu}: not a core this process may use ({cores}), or no taskset to pin it")
    sides = {}
    for side in args.side or [f"new={ROOT}"]:
        name, _, path = side.partition("=")
        if not name or not path or name in sides:
            fail(f"--side {side!r}: give NAME=PATH, each NAME once")
        sides[name] = Path(path).resolve()
        if not (sides[name] / "leanrl").is_dir():
            fail(f"--side {side}: {sides[name]} is not a leanrl checkout (no leanrl/ folder)")
    ours = list(sides)
    if args.peer is not None:
        if PEER in sides or not (Path(args.peer) / "leanrl").is_dir():
            fail(f"--peer {args.peer}: give a folder with leanrl/<script>.py, and no --side named {PEER}")
        sides[PEER] = Path(args.peer).resolve()
    venvs = {SB3: args.peer_sb3, TORCHRL: args.peer_torchrl}
    venvs = {name: venv.resolve() for name, venv in venvs.items() if venv is not None}
    for name, venv in venvs.items():
        need = venv / "torchrl-sota" if name == TORCHRL else venv / "bin" / "python"
        if name in sides or not (venv / "bin" / "python").is_file() or not need.exists():
            fail(f"--peer-{name} {venv}: give a venv made by benchmarks/peers/install.sh (no {need}), "
                 f"and no --side named {name}")  # fmt: skip
        sides[name] = venv / "torchrl-sota" if name == TORCHRL else ROOT
    jobs = {}
    for run in args.run:
        words = shlex.split(run)
        if not words or "--results-file" in words:
            fail(f"--run {run!r}: give a script and its flags (the harness sets --results-file)")
        for name in ours:
            if not (sides[name] / words[0]).is_file():
                fail(f"--run {run!r}: side {name} has no {sides[name] / words[0]}")
        jobs[label_of(words)] = words
    if len(jobs) < len(args.run):  # two runs of one script and variant: name them by all their flags
        jobs = {" ".join(words): words for words in map(shlex.split, args.run)}
    # the peer runs the same script with the same flags, less those it lacks; a script it lacks is left out
    peer_jobs, absent, left_out, shared = {}, set(), {}, {}  # keyed by (label, peer side)
    for label, words in jobs.items() if args.peer is not None else ():
        if (sides[PEER] / words[0]).is_file():
            peer_jobs[label, PEER], left_out[label, PEER] = peer_argv(words, sides[PEER] / words[0])
        else:
            absent.add((label, PEER))
    # SB3 and TorchRL: their script for our pair, with our work per env step; SB3 once a pair (no compile option)
    for name in venvs:
        for label, words in jobs.items():
            pair = Path(words[0]).stem.removesuffix("_torchcompile")
            ran = [other for other in peer_jobs if other[1] == name and Path(jobs[other[0]][0]).stem.removesuffix(
                "_torchcompile") == pair]  # fmt: skip
            command = peer_argv_for(name, words, sides[ours[-1]] / words[0])
            if command is None:
                absent.add((label, name))
            elif name == SB3 and ran:
                shared[label, name] = ran[0][0]
            else:
                peer_jobs[label, name], left_out[label, name] = command

    session = datetime.now(UTC)
    if len(sides) > 1:  # $LEANRL_COMMIT names one checkout's commit: each side is stamped by its own git
        os.environ.pop("LEANRL_COMMIT", None)
    peers = [name for name in (PEER, SB3, TORCHRL) if name in sides]
    commits = {name: bk.source_commit(root) for name, root in sides.items() if name not in peers}
    versions = {name: peer_versions(venv) for name, venv in venvs.items()}
    stamp = machine_info()
    machine = dict(pinned=args.cpu, load_avg=stamp["load_average_at_start"])
    machine.update({k: stamp[k] for k in ("cpu", "cpu_count", "torch", "python")})
    hook = Path(tempfile.mkdtemp(prefix="steady-hook-"))
    start_env = recording_env(hook)
    runs_dir = args.out / "steady_runs" / session.strftime("%Y%m%d-%H%M%S")
    order = schedule(list(jobs), list(sides), args.rounds, absent | set(shared))
    records = []
    for n, (r, label, side) in enumerate(order, 1):
        folder = runs_dir / re.sub(r"[^\w.-]+", "_", f"{n:03d}_{side}_{label}")
        words, peer = (peer_jobs[label, side], dict(peer="tqdm")) if side in peers else (jobs[label], {})
        if side in venvs:
            peer.update(peer="bar", python=str(venvs[side] / "bin" / "python"))
        if peer:  # its warm-up ends where our script's (the last side's, this round) ended its burn-in
            ran = [x for x in ok_runs(records) if (x["round"], x["label"], x["side"]) == (r, label, ours[-1])]
            peer["burnin_steps"] = ran[0].get("burnin_steps") if ran else None
        record = measure(words, sides[side], folder, start_env, args.cpu, args.cold, args.warmup_s, **peer)
        commit, dirty = (commits.get(side) or "").partition(" + ")[::2]
        record = dict(
            machine, session=session.isoformat(timespec="seconds"), round=r, label=label, side=side,
            root=str(sides[side]), commit=commit or None, uncommitted_changes=bool(dirty) if commit else None,
            argv=words, cold=args.cold,
            warmup_floor_s=args.warmup_s, **record,
        )  # fmt: skip
        records.append(record)
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "steady.jsonl").open("a") as f:
            f.write(json.dumps(bk.finite_or_none(record), allow_nan=False) + "\n")
        print(f"[{n}/{len(order)}] round {r} {side} {label}: {record['status']}, {fmt(record.get('sps_cpu'))} "
              f"steps/CPU-s, {fmt(record.get('sps_wall'))} steps/s, warm-up {fmt(record.get('warmup_s'))} s",
              file=sys.stderr)  # fmt: skip
    shutil.rmtree(hook, ignore_errors=True)

    # each side by its commit, not its folder: the table is committed, a local path means nothing elsewhere
    named = ", ".join(f"{name} = {commit or 'no git'}" for name, commit in commits.items())
    if args.peer is not None:  # not its folder, a local path: where it comes from is in the docs
        named += f", {PEER} = {PEER_STAMP}"
    for name, found in versions.items():  # by the versions its venv has: no local path
        named += f", {name} = " + " ".join(f"{package} {found.get(package, '?')}" for package in PACKAGES[name])
        named += f" (torch {found.get('torch', '?')})"
    ratios = [(s, ours[0]) for s in ours[1:]] + [(ours[-1], peer) for peer in peers]
    by = args.command or shlex.join(["python3", "benchmarks/steady.py", *(argv or sys.argv[1:])])
    typed_folders = [(str(args.peer), PEER_FOLDER)] if args.peer is not None else []
    typed_folders += [(str(typed), VENV_FOLDER) for typed in (args.peer_sb3, args.peer_torchrl) if typed is not None]
    for folder, stand_in in typed_folders:  # local paths too, as typed, shlex- or bash-quoted (run.sh)
        quoted = {shlex.quote(folder), re.sub(r"([^\w@%+=:,./-])", r"\\\1", folder)}
        for typed in sorted(quoted, key=len, reverse=True):
            by = by.replace(typed, stand_in)
    pin = f"pinned to core {args.cpu}" if args.cpu is not None else "not pinned"
    devices = ", ".join(sorted({r["device"] for r in records if r["device"]})) or "no device reported"
    text = (
        f"Measured on {devices}; CPU {machine['cpu']} ({machine['cpu_count']} cores, {pin}, load average "
        f"{machine['load_avg']:.2f} at start); torch {machine['torch']}; {session:%Y-%m-%d %H:%M} UTC; "
        f"{'an empty compile cache for each run' if args.cold else 'the compile cache as it was'}; "
        f"{args.rounds} interleaved round(s); by `{by}`.\n"
        f"Sides: {named}.\n\n"
        "Steady state: after the script's burn-in"
        + (f" and at least {args.warmup_s:g} s" if args.warmup_s else "")
        + "; medians over the rounds (min–max); warm-up: process start to the end of the burn-in; "
        "ratios paired by round."
        + (
            f" The peers' runs ({', '.join(peers)}) are timed by their progress (no results line) from the env step "
            "where ours ended its burn-in in the same round; a peer's ms/iteration is the time between its stamps "
            f"(SB3: a rollout; TorchRL: a collected batch, {TORCHRL_FRAMES} frames off-policy)."
            if peers
            else ""
        )
        + "\n\n"
        + table(records, list(sides), ratios, absent, shared)
        + "\n"
    )
    text += "".join(f"\nFlags the {side} lacks, left out of its `{label}` runs: {' '.join(flags)}"
                    for (label, side), flags in left_out.items() if flags)  # fmt: skip
    failed = [r for r in records if r not in ok_runs(records)]
    text += "".join(f"\nFailed: round {r['round']} {r['side']} `{r['label']}`: {r['status']}, see {r['log']}"
                    for r in failed)  # fmt: skip
    (args.out / "steady.md").write_text(text + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
