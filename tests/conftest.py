"""Shared test helpers: load a script as a module, run a script as a subprocess on CPU, read what a run leaves."""

import atexit
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch._inductor.config

ROOT = Path(__file__).resolve().parents[1]

# One intra-op thread for every test and every script a test runs: the numbers recorded in tests/data and the
# compiled-against-eager bounds assume one (the order of a float reduction changes with the thread count), and on
# CI's 2 cores a second thread only adds contention with the env.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
# Inductor compiles in the process that asks: its pool of compile workers (one per core, each a Python process that
# imports torch) costs seconds of CPU in every compiling run, on a machine whose cores the test files already fill
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
torch._inductor.config.compile_threads = 1
# Inductor builds each CPU kernel as a shared library linked against libtorch, and GNU ld takes most of a second to
# read libtorch's symbols: where binutils' gold is installed, g++ links with it (collect2 runs the first `ld` on PATH).
# The same machine code, the link 3x faster; kernel builds are about a third of a cold run of the suite.
if shutil.which("ld.gold") and "LEANRL_TESTS_LD" not in os.environ:
    os.environ["LEANRL_TESTS_LD"] = tempfile.mkdtemp(prefix="leanrl-tests-ld-")
    atexit.register(shutil.rmtree, os.environ["LEANRL_TESTS_LD"], ignore_errors=True)
    os.symlink(shutil.which("ld.gold"), Path(os.environ["LEANRL_TESTS_LD"]) / "ld")
    os.environ["PATH"] = os.environ["LEANRL_TESTS_LD"] + os.pathsep + os.environ["PATH"]
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


@pytest.fixture(autouse=True)
def compiler_config_restored():
    """Each test starts from the same compiler options: a script's main() run in this process may switch some on for
    the rest of the process (the SAC, TD3 and PPO continuous twins set dynamo's trace_autograd_ops, which changes how
    every later compiled backward() is traced)."""
    import torch._dynamo.config
    import torch._inductor.config

    saved = torch._dynamo.config.save_config(), torch._inductor.config.save_config()
    yield
    torch._dynamo.config.load_config(saved[0])
    torch._inductor.config.load_config(saved[1])


@pytest.fixture
def float64():
    """Tensors made while the test runs are float64 unless told otherwise (comparisons of two update orders)."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def load_script(name):
    """Import leanrl/<name>.py (or a path relative to the repo root) as a module, without running it."""
    path = ROOT / (name if name.endswith(".py") else f"leanrl/{name}.py")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # torch.compile looks a function's globals up through its module
    spec.loader.exec_module(module)
    return module


def run_script(name, *args, tmp_path, timeout=900, env=None, prelude=None):
    """Run leanrl/<name>.py on CPU with its results file in tmp_path.

    `env`: more environment variables for the process; `prelude`: Python code the process runs before the script
    (e.g. "import torch; torch.backends.mkldnn.enabled = False"), the script then run as its __main__.
    Returns (completed process, list of results lines written by the run).
    """
    results = Path(tmp_path) / "results.jsonl"
    run_env = dict(os.environ, CUDA_VISIBLE_DEVICES="", WANDB_MODE="disabled", PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [sys.executable, str(ROOT / "leanrl" / f"{name}.py"), "--no-cuda", "--results-file", str(results), *args]
    if prelude:  # python -c CODE script args..., CODE running the script as `python script args...` does
        main = "import os, runpy, sys; sys.argv[:1] = []; sys.path[0] = os.path.dirname(sys.argv[0])"
        cmd[1:1] = ["-c", f"{prelude}\n{main}; runpy.run_path(sys.argv[0], run_name='__main__')"]
    proc = None if prelude else PRELOADED.run(cmd, run_env, cwd=tmp_path, timeout=timeout)
    if proc is None:  # what loads with torch loads in a process of its own, and so does a run beside another one
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=run_env, cwd=tmp_path)
    lines = [strict_json(line) for line in results.read_text().splitlines()] if results.exists() else []
    return proc, lines


class Preloaded:
    """tests/preloaded.py, started on the first run that needs it: each run a child forked from a process that has
    imported what the scripts import (the same run, seconds of imports sooner; that file says what differs: nothing
    the scripts compute). It starts with that first run's environment; a run with another one (a test's own
    variable) gets a process of its own."""

    def __init__(self):
        self.env, self.proc, self.forked = None, None, 0  # forked: the runs it served
        self.busy = threading.Lock()  # one run at a time: a test's second thread gets a process of its own

    @staticmethod
    def loading(env):
        return {key: value for key, value in env.items() if key != "PYTEST_CURRENT_TEST"}  # pytest's name of the test

    def loaded_with(self, env):
        """Whether a run with this environment can be forked: the one the process started with."""
        return self.proc is None or self.proc.poll() is not None or self.loading(env) == self.env

    def run(self, cmd, env, cwd, timeout):
        """subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout), the script forked;
        None where it cannot be: another environment, or another run (of another thread) in progress."""
        if not self.busy.acquire(blocking=False):
            return None
        try:
            return self.forked_run(cmd, env, cwd, timeout) if self.loaded_with(env) else None
        finally:
            self.busy.release()

    def forked_run(self, cmd, env, cwd, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self.env = self.loading(env)
            server = [sys.executable, str(ROOT / "tests" / "preloaded.py")]
            self.proc = subprocess.Popen(server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env)
        out, err = Path(cwd) / ".preloaded.stdout", Path(cwd) / ".preloaded.stderr"
        request = dict(script=cmd[1], argv=cmd[2:], cwd=str(cwd), env=env, stdout=str(out), stderr=str(err))
        self.forked += 1
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        ended = threading.Timer(timeout, os.kill, (pid, signal.SIGKILL))
        ended.start()
        try:
            reply = self.proc.stdout.readline()
        finally:
            timed_out = not ended.is_alive()
            ended.cancel()
        returncode = json.loads(reply)["returncode"]
        stdout, stderr = (path.read_text(errors="replace") for path in (out, err))
        out.unlink()
        err.unlink()
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)


PRELOADED = Preloaded()


def check_bad_input(name, args, flag, tmp_path):
    """leanrl/<name>.py run with args stops with exit code 2 and one stderr line naming the flag, no traceback, no
    results line, and writes nothing (no run folder) in tmp_path, where it runs."""
    before = sorted(tmp_path.iterdir())
    proc, lines = run_script(name, *args, tmp_path=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    stderr_lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(stderr_lines) == 1, proc.stderr
    assert stderr_lines[0].startswith(f"{name}.py: error: ") and flag in stderr_lines[0], stderr_lines[0]
    assert "Traceback" not in proc.stderr
    assert lines == [] and sorted(tmp_path.iterdir()) == before, "a bad input writes no results line, no run folder"


def strict_json(text):
    """json.loads that refuses NaN, Infinity and -Infinity, as strict parsers (and jq, and browsers) do."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant} in {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def read_curve(line, folder):
    """The return curve (returns.csv: step, wall_s, return) of the run with results line `line`, under folder."""
    return (Path(folder) / line["run_name"] / "returns.csv").read_text()


def curve_points(line, folder):
    """[(step, return)] of the run's return curve."""
    return [(int(row.split(",")[0]), float(row.split(",")[2])) for row in read_curve(line, folder).splitlines()[1:]]


# ---------------------------------------------------------------- a script's main() in this process


def main_args(module, flags, tmp_path):
    """module.Args from these command-line flags, as a run on the CPU gets them, its results file in tmp_path."""
    import tyro

    return tyro.cli(module.Args, args=[*flags, "--no-cuda", "--results-file", str(Path(tmp_path) / "results.jsonl")])


def run_in(tmp_path):
    """(results line, [(step, return)] of its curve) of the one run that wrote into tmp_path."""
    (line,) = [strict_json(text) for text in (Path(tmp_path) / "results.jsonl").read_text().splitlines()]
    return line, curve_points(line, tmp_path)


def main_in_process(module, flags, tmp_path):
    """module.main() with these command-line flags on the CPU, in this process, as a user runs it (a twin through the
    GPU stand-in: gpu_standin.run_main). Returns the results line and [(step, return)] of its curve."""
    module.main(main_args(module, flags, tmp_path))
    return run_in(tmp_path)


# the one line every run prints when it ends, e.g. "dqn.py: ok: 5000 steps, 812 steps/s, mean return 21.3 over 40
# episodes; results: runs/results.jsonl, run folder: runs/CartPole-v1__dqn__1__1763855000" (one line, no break)
SUMMARY = re.compile(
    r"^(?P<script>\S+\.py): (?P<status>ok|diverged|interrupted|error): (?P<steps>\d+) steps, "
    r"(?P<sps>[\d.]+|n/a) steps/s, mean return (?P<mean_return>\S+) over (?P<episodes>\d+) episodes; "
    r"results: (?P<results>\S+), run folder: (?P<run_dir>\S+)$"
)


def summary_of(stdout):
    """The run's summary line, parsed; fails unless there is exactly one."""
    found = [m.groupdict() for m in map(SUMMARY.match, stdout.splitlines()) if m]
    assert len(found) == 1, f"expected one summary line, got {len(found)} in:\n{stdout[-2000:]}"
    return found[0]


def assert_summary_matches(stdout, line, results_file):
    """The summary line says what the results line says, and points at the results file and the run folder."""
    summary = summary_of(stdout)
    assert summary["script"] == line["script"] and summary["status"] == line["status"]
    assert int(summary["steps"]) == line["steps"] and int(summary["episodes"]) == line["episodes"]
    if line["mean_return"] is None:
        assert summary["mean_return"] == "n/a"
    else:
        assert float(summary["mean_return"]) == pytest.approx(line["mean_return"], abs=0.051)
    if line.get("sps"):
        assert float(summary["sps"]) == pytest.approx(line["sps"], abs=0.51)
    assert Path(summary["results"]).resolve() == Path(results_file).resolve()
    if line.get("mode", "train") == "train":
        run_dir = Path(summary["run_dir"])
        assert run_dir.name == line["run_name"] and run_dir.is_dir(), summary
    return summary


# ---------------------------------------------------------------- runs stopped by a signal (Ctrl-C, SIGTERM)

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal: the shell's code of a job it stopped
# a scheduler's grace period between its SIGTERM and its SIGKILL (Slurm's KillWait and Kubernetes'
# terminationGracePeriodSeconds are 30 s by default): a stopped run has written everything and exited within it
GRACE = 30


def default_stop_signals():
    """In the child, before its program starts: SIGINT and SIGTERM at their default actions, as in a job in a terminal's
    foreground. An ignored signal is inherited: a shell without job control starts a `&` job with SIGINT ignored, and
    pytest started that way passed it on to the run it started, which never saw the test's SIGINT (a run keeps an
    ignored SIGINT ignored, as Python does) and trained on past the test's deadline."""
    for signum in EXIT_CODES:
        signal.signal(signum, signal.SIG_DFL)


@contextmanager
def started_runs(cmds, tmp_path, rows=1, timeout=120):
    """Start each (command, environment) (a run, or each rank of one) on CPU in tmp_path, output captured, and wait
    until a return curve under tmp_path has more than `rows` rows: the run is in its loop, episodes have ended. Yields
    the processes; on the way out, kills what is still running."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    procs = []
    try:
        for cmd, more_env in cmds:
            procs.append(
                subprocess.Popen(
                    cmd, env={**env, **more_env}, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, preexec_fn=default_stop_signals,
                )
            )  # fmt: skip
        deadline = time.time() + timeout
        while not any(len(f.read_text().splitlines()) > rows for f in Path(tmp_path).glob("*/returns.csv")):
            ended = [p.args for p in procs if p.poll() is not None]
            assert not ended and time.time() < deadline, f"ended or saw no episode: {ended}"
            time.sleep(0.2)
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def stop(procs, sig, signalled=None, timeout=120):
    """Send `sig` to the processes `signalled` (all of them by default), wait for every one to end.

    Returns the (stdout, stderr) of each and the seconds from the signal to the last exit."""
    sent = time.time()
    for proc in procs if signalled is None else signalled:
        proc.send_signal(sig)
    outputs = [proc.communicate(timeout=max(1.0, sent + timeout - time.time())) for proc in procs]
    return outputs, time.time() - sent


def assert_stopped_run(stdout, stderr, results_file, sig, script):
    """What a run stopped by `sig` reports: no traceback, one strict JSON results line, status interrupted and the
    signal in its message, the summary line pointing at it, and a return curve with a row per episode. Returns it."""
    assert "Traceback" not in stderr, stderr[-3000:]
    [line] = [strict_json(text) for text in Path(results_file).read_text().splitlines()]
    assert line["script"] == f"{script}.py" and line["status"] == "interrupted", line
    by = "the user" if sig == signal.SIGINT else "SIGTERM"
    assert line["message"] == f"interrupted by {by}" and 0 < line["steps"] < line["total_timesteps"], line
    assert_summary_matches(stdout, line, results_file)
    rows = read_curve(line, Path(results_file).parent).splitlines()
    assert rows[0] == "step,wall_s,return" and len(rows) - 1 == line["episodes"] > 0, rows
    return line


def assert_checkpoint_evaluates(script, checkpoint, tmp_path, episodes):
    """--eval-checkpoint plays `episodes` episodes with the checkpoint: exit 0, an ok evaluation line."""
    proc, lines = run_script(script, "--eval-checkpoint", str(checkpoint), "--eval-episodes", str(episodes),
                             tmp_path=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = lines
    assert line["mode"] == "eval" and line["status"] == "ok" and line["episodes"] == episodes, line


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


def args_from_flags(module, flags):
    """module.Args with command-line flags given as ("--flag", "value", ...) pairs, each value typed as its default
    (a flag whose default is None keeps its string; a boolean one is true when given "True")."""
    defaults = module.Args()

    def typed(key, value):
        default = getattr(defaults, key)
        if default is None:
            return value
        return value == "True" if isinstance(default, bool) else type(default)(value)

    fields = {flag.removeprefix("--").replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}
    return module.Args(**{key: typed(key, value) for key, value in fields.items()})


def assert_main_exits_2_with_one_line(module, name, args, flag, capsys, tmp_path):
    """main(args) on CPU stops with exit code 2 and one stderr line naming the flag, and writes no results line."""
    args.results_file = str(tmp_path / "results.jsonl")
    args.cuda = False
    with pytest.raises(SystemExit) as exit_info:
        module.main(args)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: ") and flag in err[0], err
    assert not (tmp_path / "results.jsonl").exists()


def assert_same_runs_and_eager_format_checkpoints(name, flags, runs, tmp_path, q_network):
    """Two runs of one seed (results lines `runs`, run i under tmp_path / str(i)) gave the same losses, episodes,
    return curves and weights; the Q-networks were saved in the eager script's format: qf1's and qf2's state dicts
    that load strictly into q_network, each tensor its own (not a view of a stack)."""
    assert runs[0]["episodes"] > 0 and runs[0]["compile"] is runs[1]["compile"] is ("--compile" in flags)
    for key in ("losses", "mean_return", "episodes", "steps"):
        assert runs[0][key] == runs[1][key], key
    curves = [read_curve(line, tmp_path / str(i)) for i, line in enumerate(runs)]
    assert [row.split(",")[::2] for row in curves[0].splitlines()] == [
        row.split(",")[::2] for row in curves[1].splitlines()
    ]
    checkpoints = [
        torch.load(tmp_path / str(i) / line["run_name"] / f"{name}.pt", weights_only=True)
        for i, line in enumerate(runs)
    ]
    for key in ("actor", "qf"):
        torch.testing.assert_close(checkpoints[0][key], checkpoints[1][key], rtol=0, atol=0)
    qf = checkpoints[0]["qf"]
    assert set(qf) == {"qf1", "qf2"} and not torch.equal(qf["qf1"]["fc2.weight"], qf["qf2"]["fc2.weight"])
    for state in qf.values():
        q_network.load_state_dict(state)  # strict: the same keys and shapes
        assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in state.values())


class FakeWandb:
    """Stands in for the wandb module in a `--track` run in this process: keeps init's arguments and every log."""

    def __init__(self):
        self.config, self.logs, self.finished, self.run = None, [], False, None

    def init(self, **kwargs):
        self.config = kwargs
        self.run = types.SimpleNamespace(id=kwargs.get("id", "fake-run-id"))  # wandb.run once init has run

    def log(self, data, step=None):
        self.logs.append((step, dict(data)))

    def finish(self):
        self.finished = True

    def keys(self):
        return set().union(*(data for _, data in self.logs))


@pytest.fixture
def fake_wandb(monkeypatch):
    """sys.modules["wandb"] is a FakeWandb while the test runs (the scripts import wandb only with --track)."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


def pytest_collection_finish(session):
    """A pointer, not a red herring: several test files in one pytest process share compiled code and compiler state
    (one script's compiled functions, another's recompiles), and a few tests fail for that alone. tests/run_all.py
    runs each file in its own process; one file at a time is fine."""
    files = {item.path for item in session.items}
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if len(files) > 1 and reporter is not None:
        reporter.write_line(
            f"leanrl: {len(files)} test files in one process: compiled code and compiler state cross between them and "
            "some tests fail for that alone; python3 tests/run_all.py runs each file in its own process",
            yellow=True,
        )
