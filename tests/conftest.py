"""Shared test helpers: load a script as a module, run a script as a subprocess on CPU."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_KEYS = {
    "script",
    "env_id",
    "seed",
    "compile",
    "cudagraphs",
    "device",
    "cpu",
    "cpu_count",
    "torch",
    "steps",
    "sps",
    "wall_s",
    "mean_return",
    "episodes",
    "status",
}


def load_script(name):
    """Import leanrl/<name>.py (or a path relative to the repo root) as a module, without running it."""
    path = ROOT / (name if name.endswith(".py") else f"leanrl/{name}.py")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # torch.compile looks a function's globals up through its module
    spec.loader.exec_module(module)
    return module


def run_script(name, *args, tmp_path, timeout=900):
    """Run leanrl/<name>.py on CPU with its results file in tmp_path.

    Returns (completed process, list of results lines written by the run).
    """
    results = Path(tmp_path) / "results.jsonl"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(ROOT / "leanrl" / f"{name}.py"), "--no-cuda", "--results-file", str(results), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    lines = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    return proc, lines


def assert_finite_results_line(line, script):
    """The results line of a finished run: every spec key, status ok, finite speed and losses."""
    assert set(line) >= RESULT_KEYS, RESULT_KEYS - set(line)
    assert line["script"] == f"{script}.py"
    assert line["status"] == "ok"
    assert line["device"] == "cpu"
    assert line["steps"] > 0
    assert math.isfinite(line["sps"]) and line["sps"] > 0
    assert math.isfinite(line["wall_s"]) and line["wall_s"] > 0
    assert line["losses"], "no losses recorded"
    for name, value in line["losses"].items():
        assert math.isfinite(value), (name, value)
