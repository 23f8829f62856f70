"""Env count on a CPU: envpool Breakout-v5 alone and the PQN and PPO Atari twins' rollouts, steps/s against --num-envs,
and where a rollout's host time goes beside the env's (docs/cpu-speed.md).

    python benchmarks/env_scaling.py [--quick] [--twins pqn ppo] [--num-envs 8 16 32 64 128 256] [--out DIR]
    taskset -c 1 python benchmarks/env_scaling.py      # one core

The env alone: each twin's own make_env (the first twin's), envpool's threads = the cores this process may use
(os.sched_getaffinity), stepped with pre-drawn random actions; after a warm-up, harness.time_call's median
step over a window. Each twin: its own main() run in this process on the CPU, in its fast configuration (its FAST_FLAGS,
read by tyro into its Args) with --num-envs set and a budget of a few iterations (the first left out as a warm-up), no
--compile unless asked. Nothing of the twin is copied: its module is loaded as the tests load it and, before main()
runs, wrapped where the time is read:

- the env that make_env returns: the time inside its step, send, recv, reset and async_reset (whichever it has), and
  the actions it was given;
- the policy step (module.policy_step) and the bootstrap / targets function (q_lambda_targets in PQN,
  advantages_and_returns in PPO): main binds them through partial, so the wrapped module attribute is what it calls
  (with --compile, torch.compile is asked to compile the original and the wrapper goes around the compiled function);
- the iterations: bookkeeping's Run.progress, whose items are the training loop's iterations.

An iteration's rollout runs from its start to the targets call, its update from there to its end (bootstrap value and
returns, the epochs of minibatch updates, the log point). The rollout splits into env (inside the env's methods),
policy (inside the policy step) and other host time (the rest: action to numpy, the observation and reward uploads,
episode bookkeeping). Output: env_scaling_<tag>.md and .json (default tag cpu) in --out (default benchmarks/results;
--quick: runs/benchmarks), stamped with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
import math
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from functools import partial, wraps
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import tyro

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (  # noqa: E402  (the project's timer, machine stamp and report policy)
    FULL_OUT,
    QUICK_OUT,
    ROOT,
    load_script,
    machine_info,
    machine_line,
    time_call,
    write_or_refuse,
)
from leanrl.bookkeeping import source_commit  # noqa: E402

CPU = torch.device("cpu")
ENV_ID = "Breakout-v5"
ENV_COUNTS = [8, 16, 32, 64, 128, 256]
QUICK_ENV_COUNTS, QUICK_NUM_STEPS = [4, 8], 8
ENV_METHODS = ("step", "send", "recv", "reset", "async_reset")  # the env's methods timed, whichever it has
ACTION_METHODS = ("step", "send")  # those that take the actions
TWINS = {  # name: (script, its bootstrap / targets function, called once an iteration between rollout and update)
    "pqn": ("pqn_atari_envpool_torchcompile", "q_lambda_targets"),
    "ppo": ("ppo_atari_envpool_torchcompile", "advantages_and_returns"),
}


def cores():
    """The cores this process may use (taskset narrows them)."""
    return len(os.sched_getaffinity(0))


# ---------------------------------------------------------------------------------------------------
# The ledger: stamps from the wrapped calls, summed per iteration and phase
# ---------------------------------------------------------------------------------------------------


class Ledger:
    """Where a run's time goes. begin() and end() bound an iteration, targets() ends its rollout; env() and policy()
    add the seconds of one call to the current iteration's phase (calls outside an iteration, the first reset, are
    kept apart). cpu_clock: the process's CPU time (every thread's: envpool's workers run in this process), read at
    the same points, to say how much of the wall time the process had the cores (other jobs on the machine lower it)."""

    def __init__(self, clock=time.perf_counter, cpu_clock=time.process_time):
        self.clock, self.cpu_clock = clock, cpu_clock
        self.iterations = []
        self.outside = Counter()  # env seconds outside any iteration
        self.current = None

    def begin(self):
        self.current = {"start": self.clock(), "targets": None, "end": None, "phase": "rollout"}
        self.current["cpu_start"] = self.cpu_clock()
        self.current.update(env_s=0.0, policy_s=0.0, update_env_s=0.0, actions=0, calls=Counter(), actions_per_call=[])
        self.iterations.append(self.current)

    def targets(self):
        if self.current is not None and self.current["targets"] is None:
            self.current["targets"], self.current["phase"] = self.clock(), "update"
            self.current["cpu_targets"] = self.cpu_clock()

    def end(self):
        if self.current is not None:
            self.current["end"], self.current["cpu_end"] = self.clock(), self.cpu_clock()
            self.current = None

    def env(self, name, seconds, actions=None):
        it = self.current
        if it is None:
            self.outside[name] += seconds
            return
        it["calls"][name] += 1
        if it["phase"] == "update":
            it["update_env_s"] += seconds
            return
        it["env_s"] += seconds
        if actions is not None:
            it["actions"] += actions
            it["actions_per_call"].append(actions)

    def policy(self, seconds):
        if self.current is not None and self.current["phase"] == "rollout":
            self.current["policy_s"] += seconds

    def summary(self, warmup):
        """Totals over the whole iterations after the first `warmup` (each with a targets call); shares of the
        rollout; the update's seconds per iteration."""
        done = [it for it in self.iterations[warmup:] if it["end"] is not None and it["targets"] is not None]
        if not done:
            raise ValueError(f"no whole iteration after the {warmup} warm-up iteration(s)")
        rollout = sum(it["targets"] - it["start"] for it in done)
        update = sum(it["end"] - it["targets"] for it in done)
        env, policy = sum(it["env_s"] for it in done), sum(it["policy_s"] for it in done)
        actions = sum(it["actions"] for it in done)
        calls = sum((it["calls"] for it in done), Counter())
        cpu = sum(it["cpu_end"] - it["cpu_start"] for it in done)
        rollout_cpu = sum(it["cpu_targets"] - it["cpu_start"] for it in done)
        return {
            "iterations": len(done),
            "actions": actions,
            "rollout_s": rollout,
            "env_s": env,
            "policy_s": policy,
            "other_s": rollout - env - policy,
            "update_s": update,
            "update_env_s": sum(it["update_env_s"] for it in done),
            "update_s_per_iteration": update / len(done),
            "env_calls": dict(calls),
            "rollout_sps": actions / rollout,
            "iteration_sps": actions / (rollout + update),
            "env_share": env / rollout,
            "policy_share": policy / rollout,
            "other_share": (rollout - env - policy) / rollout,
            "cpu_s": cpu,
            "cpu_per_wall": cpu / (rollout + update),
            "rollout_cpu_s": rollout_cpu,
            "rollout_steps_per_cpu_s": actions / rollout_cpu if rollout_cpu > 0 else None,
        }


class TimedEnv:
    """The env object make_env returns, its ENV_METHODS timed into the ledger; everything else passes through."""

    def __init__(self, env, ledger):
        self._env, self._ledger = env, ledger

    def __getattr__(self, name):
        attr = getattr(self._env, name)
        if name in ENV_METHODS and callable(attr):
            return partial(self._timed, name, attr)
        return attr

    def _timed(self, name, method, *args, **kwargs):
        actions = None
        if name in ACTION_METHODS:
            given = args[0] if args else kwargs.get("action")
            actions = None if given is None else len(np.asarray(given).reshape(-1))
        t0 = self._ledger.clock()
        out = method(*args, **kwargs)
        self._ledger.env(name, self._ledger.clock() - t0, actions)
        return out


# ---------------------------------------------------------------------------------------------------
# envpool's threads, and the wrapped twin
# ---------------------------------------------------------------------------------------------------


def takes_num_threads(module):
    """Whether the twin's make_env has a 4th parameter (num_threads: 0 = envpool's default)."""
    return len(inspect.signature(module.make_env).parameters) >= 4


@contextlib.contextmanager
def envpool_threads(module, threads):
    """A make_env whose envs run `threads` envpool threads: its own num_threads where it has one, else (a make_env
    from before that flag) its envpool.make given num_threads while it runs."""
    if takes_num_threads(module):
        yield lambda env_id, num_envs, seed: module.make_env(env_id, num_envs, seed, threads)
        return
    real = module.envpool
    module.envpool = SimpleNamespace(make=partial(real.make, num_threads=threads))
    try:
        yield module.make_env
    finally:
        module.envpool = real


def env_alone(module, num_envs, threads, warmup_s, window_s, seed=1):
    """envpool Breakout-v5 made by the twin's make_env, stepped with random actions (drawn beforehand)."""
    with envpool_threads(module, threads) as make:
        envs = make(ENV_ID, num_envs, seed)
    envs.reset()
    rng = np.random.default_rng(seed)
    actions = [rng.integers(envs.action_space.n, size=num_envs) for _ in range(64)]
    turn = itertools.count()

    def step():
        envs.step(actions[next(turn) % len(actions)])

    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        step()
    first = next(turn)
    start, cpu_start = time.perf_counter(), time.process_time()
    median_us, reps = time_call(step, CPU, budget_s=window_s, max_reps=10**7, min_reps=3)
    wall, calls = time.perf_counter() - start, next(turn) - first - 1
    cpu = time.process_time() - cpu_start
    envs.close()
    return {
        "num_envs": num_envs,
        "threads": threads,
        "median_step_us": median_us,
        "steps_per_s": num_envs * 1e6 / median_us,
        "mean_steps_per_s": num_envs * calls / wall,  # the window's calls and time_call's warm-up calls, all counted
        "timed_calls": reps,
        "cpu_per_wall": cpu / wall,  # envpool's threads and this one, over the window
        "steps_per_cpu_s": num_envs * calls / cpu if cpu > 0 else None,
    }


@contextlib.contextmanager
def instrumented(module, targets_name, ledger, threads=None):
    """The twin's module (and bookkeeping's Run.progress, torch.compile) wrapped to stamp the ledger while main runs;
    everything restored after. threads: envpool's threads forced through envpool.make, for a make_env from before
    its num_threads (else None: the twin's own flags say)."""
    bk = module.bk
    saved = [
        (module, "make_env", module.make_env),
        (module, targets_name, getattr(module, targets_name)),
        (module, "policy_step", module.policy_step),
        (bk.Run, "progress", bk.Run.progress),
        (torch, "compile", torch.compile),
    ]
    make_env, targets, policy, progress, compile_ = (value for _, _, value in saved)

    def make_env_wrapped(*args, **kwargs):
        return TimedEnv(make_env(*args, **kwargs), ledger)

    def stamped(fn):
        @wraps(fn)
        def targets_stamped(*args, **kwargs):
            ledger.targets()
            return fn(*args, **kwargs)

        return targets_stamped

    def timed(fn):
        @wraps(fn)
        def policy_timed(*args, **kwargs):
            t0 = ledger.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                ledger.policy(ledger.clock() - t0)

        return policy_timed

    targets_wrapped, policy_wrapped = stamped(targets), timed(policy)

    def compile_then_wrap(fn=None, *args, **kwargs):  # --compile: compile the twin's own function, wrap the result
        if fn is targets_wrapped:
            return stamped(compile_(targets, *args, **kwargs))
        if fn is policy_wrapped:
            return timed(compile_(policy, *args, **kwargs))
        return compile_(fn, *args, **kwargs)

    def progress_stamped(run, iterable):
        for item in progress(run, iterable):
            ledger.begin()
            yield item
            ledger.end()

    module.make_env = make_env_wrapped
    setattr(module, targets_name, targets_wrapped)
    module.policy_step = policy_wrapped
    bk.Run.progress = progress_stamped
    torch.compile = compile_then_wrap
    real_envpool = module.envpool
    if threads is not None:
        module.envpool = SimpleNamespace(make=partial(real_envpool.make, num_threads=threads))
    try:
        yield
    finally:
        module.envpool = real_envpool
        for owner, name, value in saved:
            setattr(owner, name, value)


def twin_args(module, num_envs, iterations, num_steps=None, compile=False, results_file=None, async_envs=None):
    """The twin's Args in its fast configuration (FAST_FLAGS through tyro), at num_envs and `iterations` iterations,
    on the CPU; envpool's threads = the cores this process may use where the twin has --env-threads; --async-envs as
    FAST_FLAGS says unless async_envs is given."""
    args = tyro.cli(module.Args, args=shlex.split(module.FAST_FLAGS))
    args.num_envs = num_envs
    if num_steps is not None:
        args.num_steps = num_steps
    args.total_timesteps = num_envs * args.num_steps * iterations
    args.cuda, args.compile, args.cudagraphs = False, compile, False
    args.results_file = results_file or args.results_file
    if hasattr(args, "env_threads"):
        args.env_threads = -1
    if async_envs is not None and hasattr(args, "async_envs"):
        args.async_envs = async_envs
    if getattr(args, "anneal_lr", True) is False and rejected(module, args):
        # bookkeeping.check_flags reads a flag ending in _lr as a learning rate and rejects --no-anneal-lr; the lr
        # schedule is one in-place fill an iteration, the same work either way
        args.anneal_lr = True
    return args


def rejected(module, args):
    """Whether the twin's own checks reject these Args (they exit with code 2)."""
    try:
        with contextlib.redirect_stderr(open(os.devnull, "w")):
            module.check_args(args)
    except SystemExit:
        return True
    return False


def fast_args(twin):
    """The twin's Args in its fast configuration, as FAST_FLAGS gives them."""
    module = load_script(TWINS[twin][0])
    return tyro.cli(module.Args, args=shlex.split(module.FAST_FLAGS))


def twin_rollout(
    twin, num_envs, iterations, warmup, num_steps=None, compile=False, async_envs=None, min_steps=0, module=None
):
    """Run the twin's main() for `iterations` iterations (more where those after `warmup` would take fewer than
    min_steps env steps), wrapped; the summary of those after `warmup`. module: the twin's module as loaded (a fresh
    load by default)."""
    script, targets_name = TWINS[twin]
    module = module or load_script(script)
    ledger = Ledger()
    with tempfile.TemporaryDirectory(prefix="env_scaling-") as tmp:
        results = str(Path(tmp) / "results.jsonl")
        args = twin_args(module, num_envs, iterations, num_steps, compile, results, async_envs)
        batch = num_envs * args.num_steps
        args.total_timesteps = batch * max(iterations, warmup + math.ceil(min_steps / batch))
        flags_threads = hasattr(args, "env_threads")
        threads = None if flags_threads or takes_num_threads(module) else cores()
        with instrumented(module, targets_name, ledger, threads), contextlib.redirect_stdout(sys.stderr):
            module.main(args)
    row = ledger.summary(warmup)
    row.update(twin=twin, script=script, num_envs=num_envs, num_steps=args.num_steps, compile=compile)
    row["expected_actions"] = num_envs * args.num_steps * row["iterations"]
    row["flags"] = module.FAST_FLAGS
    row["env_threads"] = (
        "--env-threads -1" if flags_threads else f"envpool.make(num_threads={threads})" if threads else "default"
    )
    row["async_envs"] = bool(getattr(args, "async_envs", False))
    row["anneal_lr_forced"] = "--no-anneal-lr" in module.FAST_FLAGS and args.anneal_lr
    return row


# ---------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------


def _n(x):
    return f"{x:,.0f}"


def to_markdown(report):
    env = {r["num_envs"]: r for r in report["env_alone"]}
    lines = [
        machine_line(report["machine"]),
        f"Cores this process could use: {report['cores']}; envpool threads: that many; commit {report['commit']}.",
        "",
        "| num-envs | env alone steps/s (per CPU-s) | twin | rollout steps/s (per CPU-s) | × env alone (per CPU-s) "
        "| env % | policy % | other host % | other host ms/step | update s/iter | CPU/wall: env alone, twin |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def rate(wall, cpu):
        return f"{_n(wall)} ({_n(cpu)})" if cpu else _n(wall)

    for r in report["env_alone"]:
        if not any(t["num_envs"] == r["num_envs"] for t in report["twins"]):
            alone = rate(r["steps_per_s"], r.get("steps_per_cpu_s"))
            lines.append(f"| {r['num_envs']} | {alone} | — | | | | | | | | {r['cpu_per_wall']:.2f} |")
    order = list(TWINS)
    for t in sorted(report["twins"], key=lambda t: (t["num_envs"], order.index(t["twin"]))):
        alone = env.get(t["num_envs"])
        steps = t["iterations"] * t["num_steps"]
        ratio, use, alone_rate = "—", "—, ", "—"
        if alone:
            ratio = f"{t['rollout_sps'] / alone['steps_per_s']:.2f}"
            if alone.get("steps_per_cpu_s") and t.get("rollout_steps_per_cpu_s"):
                ratio += f" ({t['rollout_steps_per_cpu_s'] / alone['steps_per_cpu_s']:.2f})"
            use, alone_rate = f"{alone['cpu_per_wall']:.2f}, ", rate(alone["steps_per_s"], alone.get("steps_per_cpu_s"))
        twin_rate = rate(t["rollout_sps"], t.get("rollout_steps_per_cpu_s"))
        lines.append(
            f"| {t['num_envs']} | {alone_rate} | {t['twin']} | {twin_rate} "
            f"| {ratio} | {100 * t['env_share']:.0f} | {100 * t['policy_share']:.0f} | {100 * t['other_share']:.0f} "
            f"| {1e3 * t['other_s'] / steps:.2f} | {t['update_s_per_iteration']:.2f} | {use}{t['cpu_per_wall']:.2f} |"
        )
    twins = {t["twin"]: t for t in report["twins"]}
    flags = "; ".join(
        f"{name}: `{t['script']}.py {t['flags']}` at --num-steps {t['num_steps']}"
        + (" --compile" if t["compile"] else "")
        + (" --async-envs" if t["async_envs"] else "")
        + f", envpool threads by {t['env_threads']}"
        + (
            " (--no-anneal-lr dropped: the twin's checks reject it; the lr is one in-place fill either way)"
            if t.get("anneal_lr_forced")
            else ""
        )
        for name, t in twins.items()
    )
    lines += [
        "",
        "Env alone: the twin's make_env, random actions, median step after a warm-up (time_call; per CPU-s: the "
        "window's steps over the process's CPU seconds). Twins: their main() "
        f"on the CPU in the fast configuration ({flags}), {report['iterations']} iteration(s) or more (at "
        f"least {report['min_steps']:,} env steps after the warm-up), "
        + (f"the first {report['warmup']} left out as a warm-up. " if report["warmup"] else "none left out. ")
        + "Rollout: an iteration's start to its targets call; env % = inside the env's "
        "step/send/recv/reset; policy % = inside policy_step; other host = the rest of the rollout (actions to numpy, "
        "uploads, episode bookkeeping), also per vector step; update = the targets call to the iteration's end "
        "(bootstrap and returns, the epochs, the log point); rollout per CPU-s: its steps over the process's CPU "
        "seconds in the rollouts; "
        "CPU/wall = the process's CPU seconds (all its threads) over wall seconds, in the env alone's window and the "
        "twin's measured iterations: at most the cores it may use, lower where it waited or other jobs had the cores.",
        "",
        *(
            [
                f"Not run (--max-batch {report['max_batch']:,}): "
                + ", ".join(
                    f"{k['twin']} at {k['num_envs']} envs ({k['batch']:,} steps an iteration)"
                    for k in report["skipped"]
                )
                + "."
            ]
            if report.get("skipped")
            else []
        ),
        *([] if report.get("complete", True) else ["Partial: the run stopped before its last row."]),
        f"Command: `{report['command']}`; total {report['wall_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"tiny (CI): --num-envs {QUICK_ENV_COUNTS}, num_steps 8")
    p.add_argument("--twins", nargs="+", default=list(TWINS), choices=list(TWINS))
    p.add_argument("--num-envs", nargs="+", type=int, default=None, help=f"(default {ENV_COUNTS})")
    p.add_argument("--num-steps", type=int, default=None, help="override the fast configuration's num_steps")
    p.add_argument("--iterations", type=int, default=2, help="iterations a twin runs, the warm-up ones included")
    p.add_argument("--warmup", type=int, default=1, help="iterations left out")
    p.add_argument(
        "--min-steps", type=int, default=2048, help="more iterations where the measured ones would step fewer envs"
    )
    p.add_argument("--window", type=float, default=3.0, help="seconds the env alone is timed (after --env-warmup)")
    p.add_argument("--env-warmup", type=float, default=1.0, help="seconds the env alone steps first")
    p.add_argument("--no-env", action="store_true", help="skip the env alone")
    p.add_argument(
        "--max-batch", type=int, default=None, help="skip a twin where num_envs x num_steps is larger (time on a CPU)"
    )
    p.add_argument("--compile", action="store_true", help="the twins with --compile")
    p.add_argument(
        "--async-envs",
        choices=["flags", "on", "off"],
        default="flags",
        help="the twins' --async-envs: as FAST_FLAGS says (default), or on, or off (where a twin has the flag)",
    )
    p.add_argument("--out", default=None, help=f"folder (default {FULL_OUT}; --quick: {QUICK_OUT})")
    p.add_argument("--tag", default=None, help="file suffix (default cpu; cpu_quick with --quick)")
    args = p.parse_args(argv)
    if args.quick:
        args.num_envs = args.num_envs or QUICK_ENV_COUNTS
        args.num_steps = args.num_steps or QUICK_NUM_STEPS
        args.window, args.env_warmup = min(args.window, 0.3), min(args.env_warmup, 0.2)
        args.min_steps = 0
    args.num_envs = args.num_envs or ENV_COUNTS
    if args.out is None:
        args.out = str(ROOT / (QUICK_OUT if args.quick else FULL_OUT))
    if args.iterations <= args.warmup or args.warmup < 0 or min(args.num_envs) < 1:
        p.error("--iterations must exceed --warmup (>= 0), and --num-envs be positive")
    return args


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    info = machine_info(CPU)
    print(machine_line(info), file=sys.stderr)
    report = {
        "machine": info,
        "quick": args.quick,
        "command": "python benchmarks/env_scaling.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": source_commit(ROOT),
        "cores": cores(),
        "iterations": args.iterations,
        "warmup": args.warmup,
        "min_steps": args.min_steps,
        "max_batch": args.max_batch,
        "env_alone": [],
        "twins": [],
        "skipped": [],
        "complete": False,  # written after each twin's row; true once every row is in
    }
    first = load_script(TWINS[args.twins[0]][0])
    tag = args.tag or ("cpu_quick" if args.quick else "cpu")
    async_envs = {"flags": None, "on": True, "off": False}[args.async_envs]
    for num_envs in args.num_envs:
        if not args.no_env:
            row = env_alone(first, num_envs, cores(), args.env_warmup, args.window)
            report["env_alone"].append(row)
            print(f"env alone {num_envs:4d} envs: {row['steps_per_s']:9,.0f} steps/s", file=sys.stderr, flush=True)
        for twin in args.twins:
            batch = num_envs * (args.num_steps or fast_args(twin).num_steps)
            if args.max_batch and batch > args.max_batch:
                report["skipped"].append({"twin": twin, "num_envs": num_envs, "batch": batch})
                continue
            t0 = time.perf_counter()
            row = twin_rollout(
                twin, num_envs, args.iterations, args.warmup, args.num_steps, args.compile, async_envs, args.min_steps
            )
            report["twins"].append(row)
            print(
                f"{twin} {num_envs:4d} envs: rollout {row['rollout_sps']:9,.0f} steps/s, env "
                f"{100 * row['env_share']:.0f}%, policy {100 * row['policy_share']:.0f}%, update "
                f"{row['update_s_per_iteration']:.2f} s/iter ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            if write_or_refuse(
                {**report, "wall_s": time.perf_counter() - start},
                args.out,
                tag,
                prefix="env_scaling",
                render=to_markdown,
            ):
                return 2  # a quick run where a full report is: refused before the work, not after
    report["complete"] = True
    report["wall_s"] = time.perf_counter() - start
    report["machine"]["load_average_at_end"] = os.getloadavg()[0]
    print(to_markdown(report))
    return write_or_refuse(report, args.out, tag, prefix="env_scaling", render=to_markdown)


if __name__ == "__main__":
    sys.exit(main())
