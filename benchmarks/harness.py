"""What every benchmark here shares, once: the timer (time_call), the machine stamp (machine_info, machine_line,
device_tag), the report policy (write_or_refuse: a quick run never replaces a full one; stopped_by_signal: a run
stopped by a signal still writes what it measured) and load_script (a training script as a module, to time its own
functions). bench_rl_operators.py, replay.py, cnn_cpu.py and env_scaling.py import it; steady.py, gpu_session.py and
time_to_score.py time whole runs in subprocesses and stamp them with gpu_session.machine() instead."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import signal
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

# where reports go unless --out says otherwise: full runs are committed, quick ones are scratch
ROOT = Path(__file__).resolve().parents[1]
FULL_OUT, QUICK_OUT = "benchmarks/results", "runs/benchmarks"


def _sync(device):
    if device.type == "cuda":
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


def machine_info(device):
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_at_start": _load_average(),
    }
    return info


def _load_average():
    """1-minute load average (other processes share the CPU: worth knowing when reading CPU times)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def device_tag(device):
    if device.type != "cuda":
        return "cpu"
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
    so that what was measured before is still written (a GPU command's time is limited: the rows done come back)."""
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
