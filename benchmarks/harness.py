"""What every benchmark here shares, once: the timer (time_call), the machine and commit stamp (machine_info,
machine_line, device_tag; session_machine for a session of whole runs), the report policy (write_or_refuse: a quick
run never replaces a full one; stopped_by_signal: a run stopped by a signal still writes what it measured),
load_script (a training script as a module, to time its own functions) and the hook in a measured process (hook_env:
a sitecustomize that calls a benchmark's function in the process it starts; stamp_first_loop: the time of every
iteration of the script's progress loop; stamp_first_bar: of every update of a bar stepped by hand). Every benchmark
imports it. The hook loads this file in the measured process, before the script: its top-level imports are the
stdlib's (torch and leanrl are imported where used)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

# where reports go unless --out says otherwise: full runs are committed, quick ones are scratch
ROOT = Path(__file__).resolve().parents[1]
FULL_OUT, QUICK_OUT = "benchmarks/results", "runs/benchmarks"


def _sync(device):
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def time_call(fn, device, budget_s=1.0, max_reps=100, min_reps=3):
    """Median microseconds of fn() after warm-up; CUDA events on GPU, perf_counter on CPU.

    The repetition count fits the budget: slow forms (Python loops at big sizes) get few repetitions,
    fast ones up to max_reps.
    """
    start = time.perf_counter()
    fn()  # first call (already checked, so caches and compiled code are ready)
    _sync(device)
    one = time.perf_counter() - start
    for _ in range(2 if one < 0.05 else 0):
        fn()
    _sync(device)
    reps = int(max(min_reps, min(max_reps, budget_s / max(one, 1e-6))))
    if one > budget_s:  # a slow form: its warm call counts as a sample (a second warm-up would buy nothing)
        rest, _ = _timed_reps(fn, device, min_reps - 1)
        return statistics.median([one * 1e6, *rest]), min_reps
    times, reps = _timed_reps(fn, device, reps)
    return statistics.median(times), reps


def _timed_reps(fn, device, reps):
    times = []
    if device.type == "cuda":
        import torch

        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for begin, end in events:
            begin.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [begin.elapsed_time(end) * 1e3 for begin, end in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return times, reps


def machine_info(device=None):
    """The stamp of a report: the device (default the CPU), the CPU, the threads, torch, the date, the load and the
    commit measured."""
    import torch

    from leanrl.bookkeeping import cpu_name, source_commit

    cuda = device is not None and device.type == "cuda"
    info = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_at_start": _load_average(),
        "commit": source_commit(ROOT),  # $LEANRL_COMMIT on a GPU machine (its copy's .git may be stale)
    }
    return info


def session_machine():
    """The machine record of a session of whole runs (gpu_session.py, time_to_score.py): machine_info's stamp of the
    first GPU (or the CPU), the driver, the versions of what the scripts run on, the time."""
    import importlib.metadata as md

    import torch

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    driver = None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout
        driver = out.strip().splitlines()[0] if out.strip() else None
    return dict(
        kind="machine",
        **machine_info(torch.device("cuda", 0) if torch.cuda.is_available() else None),
        driver=driver,
        **{name: version(name) for name in ("tensordict", "envpool", "gymnasium", "mujoco", "tyro", "numpy")},
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def _load_average():
    """1-minute load average (other processes share the CPU: worth knowing when reading CPU times)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def device_tag(device):
    if device.type != "cuda":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "").strip()
    return "cuda_" + "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


def machine_line(info):
    device = info["device"] if info["device"] != "cpu" else "CPU only"
    load = info.get("load_average_at_start")
    return (
        f"Measured on {device}; CPU {info['cpu']} ({info['cpu_count']} cores, {info['torch_threads']} torch threads"
        + (f", load average {load} at start" if load is not None else "")
        + f"); torch {info['torch']}"
        + (f", CUDA {info['cuda']}" if info.get("cuda") else "")
        + f"; {info['date']}."
    )


@contextlib.contextmanager
def stopped_by_signal(report):
    """Run the block; SIGTERM (`timeout`'s, a command limit's) or Ctrl-C ends it early and report["stopped"] says so,
    so that what was measured before is still written (a command stopped by `timeout` still writes the rows done)."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM raises KeyboardInterrupt too
    report["stopped"] = None
    try:
        yield
    except KeyboardInterrupt:
        report["stopped"] = "by a signal before the end: the rows measured until then"
        print(f"stopped {report['stopped']}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)


class WouldClobber(Exception):
    """A quick report would replace a full run's report."""


def write_report(report, out, tag, prefix, render):
    """<out>/<prefix>_<tag>.json and .md; a quick report never replaces a full one (benchmarks/replay.py too)."""
    out = Path(out)
    existing = out / f"{prefix}_{tag}.json"
    if report.get("quick") and existing.exists() and not json.loads(existing.read_text()).get("quick", False):
        raise WouldClobber(f"{existing} holds a full run; a --quick run does not replace it (choose --out or --tag)")
    out.mkdir(parents=True, exist_ok=True)
    existing.write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{prefix}_{tag}.md").write_text(render(report))
    print(f"wrote {out / f'{prefix}_{tag}.md'} and .json", file=sys.stderr)


def write_or_refuse(report, out, tag, prefix, render):
    try:
        write_report(report, out, tag, prefix, render)
    except WouldClobber as err:
        print(f"{prefix}.py: error: {err}", file=sys.stderr)
        return 2
    return 0


def load_script(name):
    """leanrl/<name>.py as a module, without running it (scripts import without side effects)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "leanrl" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # torch.compile reads a function's globals through its module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- inside a measured process

HOOK = "LEANRL_BENCH_HOOK"  # the hook of the process a benchmark starts: {"file", "call"} as JSON
SITECUSTOMIZE = """import importlib.util, json, os


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = os.environ.pop({hook!r}, None)  # popped: a process this one starts (a compile worker) runs no hook
if hook:
    hook = json.loads(hook)
    getattr(load("leanrl_bench_hook", hook["file"]), hook["call"])(load("leanrl_bench_harness", {harness!r}))
"""


def hook_env(folder, env, file, call):
    """`env` for a measured process whose sitecustomize (written in `folder`) calls `call`(this module) of the benchmark
    `file` before the script runs: how a benchmark times a script without changing it. The benchmark's file and this
    one are loaded by path: the measured process's own checkout (steady.py's sides) comes first on its path."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    harness = str(Path(__file__).resolve())
    (Path(folder) / "sitecustomize.py").write_text(SITECUSTOMIZE.format(hook=HOOK, harness=harness))
    path = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return dict(env, PYTHONPATH=path, **{HOOK: json.dumps(dict(file=str(Path(file).resolve()), call=call))})


def stamp_first_loop(on_item, on_end=None):
    """Wrap tqdm.tqdm (the progress loop of our scripts and of LeanRL's) so that on_item(n, now) runs at the start of
    each item of the first loop the process iterates over, n the items done before it; a False from it ends the loop
    there (the script then finishes as after its last iteration). on_end(n, now) runs when that loop ends by itself.
    Later loops (an evaluation) are not stamped."""
    import tqdm

    base, claimed = tqdm.tqdm, []

    class StampedTqdm(base):
        def __iter__(self):
            if claimed:
                yield from super().__iter__()
                return
            claimed.append(self)
            done = 0
            for item in super().__iter__():
                if on_item(done, time.time()) is False:
                    return
                yield item
                done += 1
            if on_end is not None:
                on_end(done, time.time())

    tqdm.tqdm = StampedTqdm


def stamp_first_bar(on_update, total=None):
    """Wrap tqdm.tqdm so that on_update(n, now) runs after each update of the first bar the process updates, n the sum
    of its updates so far: the progress of a script that steps its bar by hand (TorchRL's sota-implementations update
    it with the frames of each collected batch, our SB3 drivers once a rollout). With `total`, the first of the bars
    of that total (the run's frames: TorchRL's compile option steps a bar of its own before the training's). Other
    bars are not stamped."""
    import tqdm

    base, claimed = tqdm.tqdm, []

    class StampedBar(base):
        def update(self, n=1):
            shown = super().update(n)
            if not claimed and (total is None or self.total == total):
                claimed.append([self, 0])
            if claimed and claimed[0][0] is self:
                claimed[0][1] += n
                on_update(claimed[0][1], time.time())
            return shown

    tqdm.tqdm = StampedBar
