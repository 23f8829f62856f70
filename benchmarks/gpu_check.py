"""The GPU check: captured graphs draw fresh random numbers, and every twin learns with --compile --cudagraphs.

    python benchmarks/gpu_check.py [--dry-run] [--only NAME,...] OUT      (benchmarks/gpu_check.sh OUT on a GPU)

For each entry of TWINS, one process runs the script's own main() with `--compile --cudagraphs` (on CUDA: inductor's
kernels, tensordict's CudaGraphModule) and keeps every CudaGraphModule the script made. Then:

(a) draws. At each captured function's first replay (early in the run: epsilon still high), before that replay
    runs, the function is called again and again from that one state: the run's inputs of that call, and every
    tensor it writes (networks, optimizer, buffers, env) put back to its values before each call. Its outputs, and
    a sum of each tensor it wrote, then vary with nothing but its draws. The same is done with the function run
    eagerly (torch.compiler.set_stance("force_eager"): the script's function, aten's random ops). The replays pass
    when (1) consecutive replays differ as often as eager calls do (a frozen draw repeats every time) and (2) every
    value that eager's draws move (floats rounded to 1e-4 of their scale, moved by 3 such quanta or more: a
    kernel's last bits are no draw) is distributed as eager's: a two-sample Kolmogorov-Smirnov test for floats, a
    chi-square test for integers (actions), p >= 1e-4. An entry names the functions that must draw (one that
    draws nothing there fails); any other is screened with 10 eager calls and checked too if it draws. Nothing
    of the scripts' math is changed: the check wraps the CudaGraphModule the script makes.
(b) learning. The same run is the learning check of the script's CPU tests, at that check's budget: the bar (a
    mean of the last episodic returns) is judged on its returns.csv.

Entries without a CPU learning check (the Atari twins) run a short budget for (a) only. A new script is one line
of TWINS (its flags, budget and bars). OUT gets one folder per
entry (results line, run folder, report.json), gpu_check.jsonl (one line per entry) and gpu_check.md.

--dry-run: the same code on the CPU through the capture stand-in of tests/gpu_standin.py (tiny budgets, --compile on
the aot_eager backend; bars not judged). --freeze-draws (with --dry-run): the stand-in replays every random op with
the values drawn at the capture, a planted fault that (a) must fail (tests/test_gpu_check.py).
"""

import argparse
import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Twin:
    """One script in the check: a line each (the learning check's flags, budget and bars are its CPU test's)."""

    script: str  # leanrl/<script>.py, run with --compile --cudagraphs
    draws: tuple  # the captured functions (by name) that must draw: each one is checked
    learn: tuple = ()  # the flags of the CPU learning check (budget included); () for no learning check
    bars: tuple = ()  # ((window, minimum), ...): the mean of the last `window` episodic returns >= minimum
    check: str = ""  # the CPU test that holds these flags and bars
    short: tuple = ()  # without a learning check: the flags of a short run on the GPU
    dry: tuple | None = None  # the CPU dry run's flags; None: tests/regression.py's flags for the pair
    env: dict = field(default_factory=dict)  # more environment variables for its process
    # its draws are a counter-based RNG's, the counter (an int64 tensor of one element) in the state the function
    # writes (the device-env files): the probe lets it move on between calls, as the graph's replays do
    counter: bool = False


INV = ("--env-id", "InvertedPendulum-v4")  # with the scripts' default seed, 1, as the tests run it
R2D2_CARTPOLE = ("--env-id", "CartPole-v1", "--mask-velocity", "--num-envs", "8", "--hidden-size", "64")
R2D2_CARTPOLE += ("--burn-in", "8", "--seq-len", "16", "--overlap", "8", "--batch-size", "32")
R2D2_CARTPOLE += ("--train-frequency", "16")
R2D2_CARTPOLE += ("--learning-rate", "1e-3", "--gamma", "0.99", "--target-network-frequency", "200")
R2D2_CARTPOLE += ("--buffer-size", "40000", "--learning-starts", "2000", "--measure-burnin", "1")
ATARI_SHORT = ("--total-timesteps", "2048", "--measure-burnin", "1")
DEVICE_ENV_DRY = ("--num-envs", "64", "--num-steps", "16", "--total-timesteps", "4096", "--update-epochs", "2")
DEVICE_ENV_DRY += ("--num-minibatches", "4")

# fmt: off
TWINS = [  # the slowest to compile first (R2D2's unrolled LSTM)
    Twin("r2d2_atari_envpool_torchcompile", ("act", "sample_and_update"),
         (*R2D2_CARTPOLE, "--total-timesteps", "30000"), ((20, 100),),
         "tests/test_r2d2_atari_envpool.py::test_learns_velocity_masked_cartpole_short"),
    Twin("sac_continuous_action_torchcompile", ("act", "train_step"),
         (*INV, "--learning-starts", "500", "--total-timesteps", "4000", "--batch-size", "64"), ((10, 40),),
         "tests/test_sac_continuous_action.py::test_learns_inverted_pendulum_in_4k_steps"),
    Twin("td3_continuous_action_torchcompile", ("act", "train_step"),
         (*INV, "--learning-starts", "500", "--total-timesteps", "4000", "--batch-size", "64"), ((10, 40),),
         "tests/test_td3_continuous_action.py::test_learns_inverted_pendulum_in_4k_steps"),
    Twin("ppo_continuous_action_torchcompile", ("policy_step",),
         (*INV, "--seed", "1", "--total-timesteps", "20480", "--num-steps", "512", "--num-minibatches", "8"),
         ((100, 100), (10, 200)),
         "tests/test_ppo_continuous_action.py::test_learns_inverted_pendulum_in_20k_steps"),
    Twin("ppo_torchcompile", ("policy_step",), ("--total-timesteps", "50000", "--seed", "1"), ((100, 120),),
         "tests/test_ppo.py::test_learns_cartpole_in_50k_steps"),
    Twin("dqn_torchcompile", ("device_epsilon_greedy", "train_step"),
         ("--total-timesteps", "20000", "--seed", "1", "--learning-starts", "1000"), ((100, 60),),
         "tests/test_dqn.py::test_learns_cartpole_in_20k_steps"),
    Twin("pqn_torchcompile", ("policy_step",), ("--total-timesteps", "51200", "--seed", "1"), ((100, 35),),
         "tests/test_pqn.py::test_learns_cartpole_in_51k_steps"),
    Twin("pqn_device_env", ("iteration",), ("--total-timesteps", "65536", "--seed", "1"), ((100, 60),),
         "tests/test_pqn_device_env.py::test_learns_cartpole_in_65k_steps", dry=DEVICE_ENV_DRY, counter=True),
    Twin("ppo_device_env", ("iteration",),
         ("--num-envs", "32", "--num-steps", "32", "--total-timesteps", "81920", "--num-seeds", "2"), ((100, 100),),
         "tests/test_ppo_device_env.py::test_learns_cartpole_in_two_seeds_at_once", dry=DEVICE_ENV_DRY,
         counter=True),
    Twin("ppo_atari_envpool_torchcompile", ("policy_step",), short=ATARI_SHORT),
    Twin("dqn_atari_envpool_torchcompile", ("epsilon_greedy", "train_step"),
         short=("--buffer-size", "4000", "--learning-starts", "1000", "--total-timesteps", "2048")),
    Twin("pqn_atari_envpool_torchcompile", ("policy_step",), short=ATARI_SHORT),
]
# fmt: on
BY_NAME = {twin.script: twin for twin in TWINS}

P_MIN = 1e-4  # a distribution test below this p fails (many outputs are tested; a true one fails 1e-4 of the time)


def load_script(name):
    """Import leanrl/<name>.py as its own module, without running it (torch.compile looks globals up through it)."""
    path = ROOT / "leanrl" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- (a) the draws of a captured function


class Watched:
    """A script's CudaGraphModule, as the script uses it; at its first replay, before running it, its draws are
    checked (check_draws) from that state: the run's own inputs and state, early in the run (epsilon still high)."""

    def __init__(self, cgm, replays, named, counter=False):
        self.cgm, self.replays, self.calls, self.inputs, self.verdict, self.seconds = cgm, replays, 0, None, None, 0.0
        self.counter = counter  # Twin.counter
        self.named = named  # the functions that must draw (the others: 10 eager calls first, to see whether they do)
        fn = cgm.module
        for attribute in ("_torchdynamo_orig_callable", "__wrapped__", "func") * 3:  # a compiled one's, a partial's
            fn = getattr(fn, attribute, fn)
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args, **kwargs):
        import torch

        self.calls += 1
        if self.calls == self.cgm._warmup + 1:  # captured at the call before: this one is its first replay
            start = time.time()
            self.inputs = torch.utils._pytree.tree_map(_clone, (args, kwargs))
            self.verdict = None if self.name in self.named else judge(*[sample(self, 10, captured=False)] * 2)
            if self.verdict is None or self.verdict["draws"]:
                self.verdict = judge(sample(self, self.replays, False), sample(self, self.replays, captured=True))
            self.seconds = time.time() - start
        return self.cgm(*args, **kwargs)


def _clone(x):
    import torch

    return x.clone() if isinstance(x, torch.Tensor) else x


def watching(module, replays, named, counter=False):
    """Patches module.CudaGraphModule: every one the script makes is kept (returned list) and works as before."""
    from unittest import mock

    made, cls = [], module.CudaGraphModule

    def make(*args, **kwargs):
        made.append(Watched(cls(*args, **kwargs), replays, named, counter))
        return made[-1]

    return mock.patch.object(module, "CudaGraphModule", make), made


def _writes_mode():
    """A dispatch mode that saves, at its first write, the bytes of every tensor older than the call (the state a
    function writes), with the tensor written (for its digest)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Writes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.saved, self.new = {}, set()  # storage -> (whole storage, its bytes, the tensor written)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            import torch

            kwargs = kwargs or {}
            for index, argument in enumerate(func._schema.arguments):
                if argument.alias_info is None or not argument.alias_info.is_write:
                    continue
                value = kwargs.get(argument.name) if argument.kwarg_only or index >= len(args) else args[index]
                for t in value if isinstance(value, list | tuple) else [value]:
                    if not isinstance(t, torch.Tensor) or (key := t.untyped_storage().data_ptr()) in self.new:
                        continue
                    if key not in self.saved:
                        whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
                        self.saved[key] = (whole, whole.clone(), t)
            ins = {
                t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
            }
            out = func(*args, **kwargs)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in ins:
                    self.new.add(t.untyped_storage().data_ptr())
            return out

    return Writes()


def _columns(out, written, width=8):
    """One call's observed values: up to `width` elements of every output tensor and one sum of every tensor the
    function wrote; [(name, float64 values, discrete)]."""
    import torch
    from torch.utils._pytree import tree_flatten

    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    cols = []
    for i, t in enumerate(leaves):
        flat = t.detach().reshape(-1)[:width]
        cols.append((f"out{i}", flat.double().cpu().numpy(), not (t.is_floating_point() or t.is_complex())))
    for i, t in enumerate(written):
        if t.is_floating_point():
            cols.append((f"wrote{i}", t.detach().double().sum().reshape(1).cpu().numpy(), False))
    return cols


def sample(watched, replays, captured):
    """`replays` calls of a captured function (captured=True) or of its function run eagerly, each from the same
    state; returns {column: (array calls x elements, discrete)}."""
    import numpy as np
    import torch

    args, kwargs = watched.inputs
    rows = {}
    with torch.compiler.set_stance("force_eager"), _writes_mode() as writes:  # what the function writes
        watched.cgm.module(*args, **kwargs)
    saved = list(writes.saved.values())
    for whole, old, _ in saved:
        whole.copy_(old)
    written = [t for _, _, t in saved]
    for _ in range(replays):
        inputs = torch.utils._pytree.tree_map(_clone, (args, kwargs))
        with contextlib.nullcontext() if captured else torch.compiler.set_stance("force_eager"):
            out = watched.cgm(*inputs[0], **inputs[1]) if captured else watched.cgm.module(*inputs[0], **inputs[1])
        for name, values, discrete in _columns(out, written):
            rows.setdefault(name, ([], discrete))[0].append(values)
        for whole, old, t in saved:
            if not (watched.counter and t.dtype == torch.int64 and t.numel() == 1):  # (Twin.counter: it moves on)
                whole.copy_(old)
    return {name: (np.stack(values), discrete) for name, (values, discrete) in rows.items()}


def ks_p(a, b):
    """Two-sample Kolmogorov-Smirnov test: p-value (asymptotic, Numerical Recipes' kstwo) of samples a and b."""
    import numpy as np

    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    d = np.max(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)))
    en = math.sqrt(len(a) * len(b) / (len(a) + len(b)))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 0.2:
        return 1.0
    return float(min(1.0, max(0.0, 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * lam * lam) for j in range(1, 101)))))


def chi2_p(a, b):
    """Chi-square test that two samples of integers come from one distribution (cells under 5 expected pooled)."""
    import numpy as np
    import torch

    values = np.unique(np.concatenate([a, b]))
    counts = np.array([[np.sum(x == v) for v in values] for x in (a, b)], dtype=float)
    expected = counts.sum(1, keepdims=True) * counts.sum(0, keepdims=True) / counts.sum()
    small = expected.min(0) < 5
    if small.any():  # the rare values pooled into one cell, itself put into the rarest other value if still rare
        pooled, counts = counts[:, small].sum(1), counts[:, ~small]
        if counts.shape[1] and pooled.sum() * counts.sum(1).min() / (counts.sum() + pooled.sum()) < 5:
            counts[:, counts.sum(0).argmin()] += pooled
        else:
            counts = np.concatenate([counts, pooled[:, None]], 1)
        expected = counts.sum(1, keepdims=True) * counts.sum(0, keepdims=True) / counts.sum()
    df = counts.shape[1] - 1
    if df < 1:
        return 1.0
    stat = float(((counts - expected) ** 2 / expected).sum())
    half = torch.tensor([df / 2, stat / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1]).item())


def _quantized(x, scale):
    """Floats to 1e-4 of the column's scale: eager's and inductor's kernels round differently in the last bits."""
    import numpy as np

    return np.round(x / scale * 1e4)


def repeats(columns):
    """The fraction of consecutive calls whose every observed value equals the call before's."""
    import numpy as np

    same = np.ones(len(columns[0]) - 1, dtype=bool)
    for values in columns:
        same &= values[1:] == values[:-1]
    return float(same.mean())


SPREAD = 3  # a float value varies when eager's calls span 3 quanta or more: a nondeterministic kernel's last bits
# (atomic adds) move a value across one quantum's edge at most, a draw moves it further


def judge(eager, graph):
    """(a)'s verdict on one function: eager's and the replays' samples, as sample() returns them. Each observed
    value (a column) that eager's draws move is compared: how often a call repeats the one before, and the law."""
    import numpy as np

    tests, varying_e, varying_g = {}, [], []
    for name, (e, discrete) in eager.items():
        g = graph[name][0]
        if not discrete:
            scale = max(float(np.abs(e).max()), 1e-12)
            e, g = _quantized(e, scale), _quantized(g, scale)
        for j in range(e.shape[1]):
            if e[:, j].max() - e[:, j].min() >= (1 if discrete else SPREAD):
                varying_e.append(e[:, j])
                varying_g.append(g[:, j])
                tests[f"{name}[{j}]"] = (chi2_p if discrete else ks_p)(e[:, j], g[:, j])
    if not tests:
        return dict(draws=False, ok=False, why="no output varies from one eager call to the next")
    n = len(varying_e[0]) - 1
    rep_e, rep_g = repeats(varying_e), repeats(varying_g)
    allowed = rep_e + 4 * math.sqrt(max(rep_e * (1 - rep_e), 1 / n) / n) + 0.05
    worst = min(tests, key=tests.get)
    fresh, same_law = rep_g <= allowed, tests[worst] >= P_MIN
    why = [] if fresh else [f"replays repeat the call before {rep_g:.0%} of the time (eager {rep_e:.0%})"]
    why += [] if same_law else [f"{worst}: p = {tests[worst]:.2g} that the replays' values are eager's distribution"]
    return dict(draws=True, ok=fresh and same_law, repeats_eager=rep_e, repeats_graph=rep_g, tests=len(tests),
                min_p=tests[worst], min_p_at=worst, why="; ".join(why))  # fmt: skip


def check_draws(twin, made):
    """(a)'s verdicts of a run's captured functions, {name: verdict}: a function of twin.draws that drew nothing, or
    was never replayed, fails."""
    found = {}
    for watched in made:
        name, n = watched.name, 2
        while name in found:
            name, n = f"{watched.name}#{n}", n + 1
        if watched.verdict is None:
            found[name] = dict(draws=False, ok=False, why="never replayed in this run")
        else:
            found[name] = dict(watched.verdict, seconds=round(watched.seconds, 1))
        if not found[name]["draws"] and watched.name not in twin.draws:
            found[name].update(ok=True, why="draws nothing" if watched.verdict else "never replayed; draws nothing")
    for name in twin.draws:
        if name not in found:
            found[name] = dict(draws=False, ok=False, why="no CudaGraphModule of this function")
    return found


# ---------------------------------------------------------------- (b) learning


def judge_bars(twin, line, run_dir):
    """(b)'s verdict: every bar of the twin's learning check, on the run's returns.csv."""
    rows = (run_dir / "returns.csv").read_text().splitlines()[1:]
    returns = [float(row.split(",")[2]) for row in rows]
    got = {f"last {w}": (sum(returns[-w:]) / len(returns[-w:]) if returns else None) for w, _ in twin.bars}
    ok = line.get("status") == "ok" and all(
        got[f"last {w}"] is not None and len(returns) >= min(w, 20) and got[f"last {w}"] >= bar for w, bar in twin.bars
    )
    return dict(ok=ok, status=line.get("status"), steps=line.get("steps"), episodes=len(returns), means=got,
                bars={f"last {w}": bar for w, bar in twin.bars})  # fmt: skip


# ---------------------------------------------------------------- one entry, in its own process


def worker(name, out, dry, freeze, replays):
    """Runs one entry (its script's main with --compile --cudagraphs), then checks (a) and (b); writes report.json."""
    import torch

    twin, out = BY_NAME[name], Path(out)
    out.mkdir(parents=True, exist_ok=True)
    module = load_script(twin.script)
    if dry:
        sys.path.insert(0, str(ROOT / "tests"))
        from gpu_standin import as_on_cuda
        from regression import PAIRS

        flags = twin.dry if twin.dry is not None else PAIRS[twin.script.removesuffix("_torchcompile")]
        flags = [*flags, "--no-cuda"]
    else:
        flags = list(twin.learn or twin.short)
    import tyro

    args = tyro.cli(
        module.Args, args=[*flags, "--compile", "--cudagraphs", "--results-file", str(out / "results.jsonl")]
    )
    report = dict(script=twin.script, flags=flags, dry_run=dry, freeze_draws=freeze, replays=replays,
                  device=torch.cuda.get_device_name() if torch.cuda.is_available() and not dry else "cpu",
                  torch=torch.__version__)  # fmt: skip
    patch, made = watching(module, replays, twin.draws, twin.counter)
    start = time.time()
    with as_on_cuda(module, args, freeze_draws=freeze) if dry else contextlib.nullcontext(), patch:
        module.main(args)
    report["run_s"] = round(time.time() - start, 1)  # the draws' checks included
    line = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    if twin.learn and not dry:
        report["learning"] = judge_bars(twin, line, out / line["run_name"])
    else:
        report["learning"] = dict(ok=None, status=line.get("status"), why="not judged (dry run or no bar)")
    report["draws"] = check_draws(twin, made)
    report["ok"] = all(v["ok"] for v in report["draws"].values()) and report["learning"]["ok"] is not False
    report["ok"] = report["ok"] and line.get("status") == "ok"
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


# ---------------------------------------------------------------- the command


def render(reports):
    """gpu_check.md: one row per entry."""
    head = (
        "| script | draws (a): function, repeats graph/eager, min p | learning (b): mean of last returns / bar | ok |"
    )
    lines = [head, "|---|---|---|---|"]
    for name, r in reports.items():
        if "draws" not in r:
            lines.append(f"| `{name}` | {r.get('why', 'no report')} | | no |")
            continue
        stopped = f" ({r['why']})" if r.get("why") else ""  # stopped at the deadline, its draws checked
        draws = "; ".join(
            f"{fn}: {v['repeats_graph']:.0%}/{v['repeats_eager']:.0%}, p {v['min_p']:.2g}"
            if v["draws"]
            else f"{fn}: {v['why']}"
            for fn, v in r["draws"].items()
        )
        learning = r["learning"]
        if learning["ok"] is None:
            learned = learning["why"]
        else:
            means = {k: "none" if v is None else f"{v:.1f}" for k, v in learning["means"].items()}
            learned = ", ".join(f"{k} {means[k]} / {b}" for k, b in learning["bars"].items())
        lines.append(f"| `{name}`{stopped} | {draws} | {learned} | {'yes' if r['ok'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="an empty or new folder")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, through the capture stand-in")
    parser.add_argument("--freeze-draws", action="store_true", help="(dry run) the stand-in replays frozen draws")
    parser.add_argument("--only", default="", help="comma-separated scripts (default: every entry)")
    parser.add_argument("--replays", type=int, default=0, help="calls of each side (default 200, dry run 60)")
    parser.add_argument("--jobs", type=int, default=0, help="entries at a time (default: one per 2 cores)")
    parser.add_argument("--deadline-s", type=float, default=330, help="entries still running then are stopped")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = parser.parse_args()
    replays = a.replays or (60 if a.dry_run else 200)
    if a.freeze_draws and not a.dry_run:
        parser.error("--freeze-draws is a fault planted in the CPU stand-in: only with --dry-run")
    if a.worker:
        report = worker(a.worker, a.out, a.dry_run, a.freeze_draws, replays)
        sys.exit(0 if report["ok"] else 1)
    names = [n for n in a.only.split(",") if n] or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"--only: unknown {unknown}; entries: {list(BY_NAME)}")
    absent = [n for n in names if not (ROOT / "leanrl" / f"{n}.py").exists()]
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    jobs = a.jobs or max(1, len(cores) // 2)
    share = max(1, len(cores) // jobs)
    waiting, running, reports = (
        [n for n in names if n not in absent],
        {},
        {n: dict(why="script absent") for n in absent},
    )
    deadline = time.time() + a.deadline_s
    flags = [*(["--dry-run"] if a.dry_run else []), *(["--freeze-draws"] if a.freeze_draws else [])]
    while waiting or running:
        while waiting and len(running) < jobs:
            name, slot = waiting.pop(0), next(i for i in range(jobs) if i not in {s for _, s in running.values()})
            mine = cores[slot * share : (slot + 1) * share] or cores
            env = dict(os.environ, OMP_NUM_THREADS=str(len(mine)), WANDB_MODE="disabled", **BY_NAME[name].env)
            log = (out / f"{name}.log").open("w")
            cmd = [sys.executable, __file__, *flags, "--replays", str(replays), "--worker", name, str(out / name)]
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    preexec_fn=lambda m=mine: os.sched_setaffinity(0, m))  # fmt: skip
            running[name] = (proc, slot)
        time.sleep(0.5)
        for name, (proc, _) in list(running.items()):
            if proc.poll() is None and time.time() < deadline:
                continue
            stopped = proc.poll() is None
            if stopped:  # SIGTERM: the script ends its run as interrupted, and the draws checked are still reported
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            path = out / name / "report.json"
            reports[name] = json.loads(path.read_text()) if path.exists() else dict(why=f"exit {proc.returncode}")
            if stopped:
                reports[name].update(ok=False, why=f"stopped at the deadline ({a.deadline_s:.0f} s)")
            del running[name]
    reports = {n: reports[n] for n in names}
    with (out / "gpu_check.jsonl").open("w") as f:
        for name, r in reports.items():
            f.write(json.dumps(dict(name=name, **r)) + "\n")
    (out / "gpu_check.md").write_text(render(reports))
    print(render(reports), end="")
    bad = [n for n, r in reports.items() if not r.get("ok")]
    print(f"gpu_check: {len(names) - len(bad)} of {len(names)} entries pass" + (f"; failed: {bad}" if bad else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
