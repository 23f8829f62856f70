"""A stopped run goes on (issue 41), for the DQN pair: the training state written at a step's end when SIGTERM stops
the run, loaded in a fresh process as it was saved; a run stopped and resumed gives exactly the numbers of the run
never stopped (eager, the twin, the twin's capture stand-in against the uncaptured twin); a kill -9 while writing
leaves the previous state whole; --checkpoint-every-min and --no-save-replay; bad --resume input."""

import copy
import os
import pickle
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import ROOT, load_script, strict_json
from gpu_standin import run_main

from leanrl import bookkeeping as bk

EAGER, TWIN = "dqn", "dqn_torchcompile"
MODULES = {EAGER: load_script(EAGER), TWIN: load_script(TWIN)}
# every part of a run in 400 steps: random steps to 100, an update every 5 steps, target copies at 200 and 300, log
# points every 100 steps and at the last one
SHORT = ["--learning-starts", "100", "--total-timesteps", "400", "--train-frequency", "5"]
SHORT += ["--target-network-frequency", "100", "--batch-size", "32", "--seed", "3", "--save-model"]
K = 237  # the step SIGTERM stops at: after a target copy, between updates and log points


def results(folder):
    return [strict_json(text) for text in (Path(folder) / "results.jsonl").read_text().splitlines()]


def run_folder(folder):
    [found] = [path for path in Path(folder).iterdir() if path.is_dir()]
    return found


def main(name, flags, folder, cudagraphs=False):
    """main() of the script in this process on the CPU (the twin's --cudagraphs through the capture stand-in);
    returns the results lines in folder."""
    return run_main(
        MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
    )


@contextmanager
def sigterm_at(step, again_while_writing=False):
    """SIGTERM to this process once the run has ticked env step `step` (the run stops at that step's end); with
    again_while_writing, a second SIGTERM while the state is written (not acted on)."""
    tick, save = bk.Run.tick, bk.atomic_save

    def signalling_tick(run, now):
        tick(run, now)
        if now == step:
            os.kill(os.getpid(), signal.SIGTERM)

    def save_signalled(obj, path):
        os.kill(os.getpid(), signal.SIGTERM)
        save(obj, path)

    with (
        mock.patch.object(bk.Run, "tick", signalling_tick),
        mock.patch.object(bk, "atomic_save", save_signalled) if again_while_writing else mock.MagicMock(),
    ):
        yield


def stopped_run(name, folder, flags=()):
    """The script's SHORT run stopped by SIGTERM at step K, in folder: its results line and run folder."""
    with sigterm_at(K, again_while_writing=name == EAGER), pytest.raises(SystemExit) as stopped:
        main(name, [*SHORT, *flags], folder)
    assert stopped.value.code == 143  # 128 + SIGTERM
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == K and line["resumed"] == 0, line
    return line, run_folder(folder)


def snapshot(run):
    """What the run's state is now, packed as written (copied): its parts, the RNGs, the run's counts and episodes."""
    parts = {name: bk.pack(value, name) for name, value in run.state().items()}
    counts = dict(iterations=run.iterations_done, steps=run.steps, ticks=run.ticks, returns=list(run.returns))
    return copy.deepcopy(dict(parts=parts, rng=bk.rng_state(), run=counts))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """dqn.py's SHORT run stopped by SIGTERM at step K: (its run folder, what its state was when written)."""
    folder = tmp_path_factory.mktemp("stopped")
    taken, write = [], bk.Run.write_state

    def write_and_take(run):
        taken.append(snapshot(run))
        write(run)

    with mock.patch.object(bk.Run, "write_state", write_and_take):
        _, run_dir = stopped_run(EAGER, folder)
    [at_write] = taken
    return run_dir, at_write


def copy_of(run_dir, folder):
    """A copy of the run folder under folder (a resume writes into the folder it resumes)."""
    return Path(shutil.copytree(run_dir, Path(folder) / run_dir.name))


# RecordEpisodeStatistics' wall-clock times of the episodes (no script reads them); the sub-envs' RNGs are compared as
# their bit generators' states
WALL_CLOCK = ("episode_start_time", "time_queue", "_np_random", "np_random")


def assert_same(a, b, where="state"):
    """Exactly the same: every tensor (dtype, shape, values), number and RNG state, recursively."""
    if isinstance(a, dict) and "pickled_envs" in a:  # the sub-envs: their dynamics, RNG, step and episode counters
        a, b = (pickle.loads(part["pickled_envs"].numpy().tobytes())["envs"] for part in (a, b))
        a, b = (
            [[vars(e.unwrapped), e.unwrapped.np_random.bit_generator.state, vars(e)] for e in envs] for envs in (a, b)
        )
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        a, b = ({key: value for key, value in d.items() if key not in WALL_CLOCK} for d in (a, b))
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "__array__"):
        assert (a == b).all(), where
    elif hasattr(a, "__dict__") and not isinstance(a, type):  # a wrapper's spaces and specs
        assert type(a) is type(b), where
    else:
        assert a == b, where


# ---------------------------------------------------------------- what is saved is what loads


# loads the script in a fresh process, resumes the run and, where the loop would start, writes what its state is
FRESH = """
import sys, torch
from unittest import mock
from conftest import load_script, main_args
from test_resume import snapshot
from leanrl import bookkeeping as bk
name, run_dir, out = sys.argv[1:]
def taken(run, iterable):
    torch.save(snapshot(run), out)
    raise SystemExit(0)
module = load_script(name)
with mock.patch.object(bk.Run, "progress", taken):
    module.main(main_args(module, ["--resume", run_dir], out + ".results"))
"""


def test_the_state_loads_in_a_fresh_process_as_it_was_written(stopped, tmp_path):
    """Every tensor of the networks, the target network, Adam's moments and step, the replay memory and its fill count,
    the last obs, the global step (the epsilon schedule's position), the episodes, the sub-envs' dynamics and RNGs, and
    Python's, numpy's and torch's RNG states: in a new process after --resume exactly what they were at the write."""
    run_dir, at_write = stopped
    out = tmp_path / "restored.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", FRESH, EAGER, str(copy_of(run_dir, tmp_path)), str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    restored = torch.load(out, weights_only=False)
    assert at_write["parts"]["global_step"] == K and at_write["run"]["iterations"] == K
    assert len(at_write["run"]["returns"]) > 5 and at_write["parts"]["optimizer"]["state"], "nothing to compare"
    assert_same(at_write, restored)


# ---------------------------------------------------------------- stopped and resumed: the numbers never stopped


def assert_resumed_run_is_the_whole_run(name, whole, folder, resumed):
    """The resumed run's results line, curve, model and last state (folder: its results file's; resumed: its run
    folder) against the run never stopped (whole: its results file's folder)."""
    [line] = results(whole)
    last = results(folder)[-1]
    assert last["status"] == "ok" and last["resumed"] == 1 and last["run_name"] == resumed.name, last
    for key in ("steps", "episodes", "mean_return", "losses", "epsilon"):
        assert last[key] == line[key], key
    rows = [row.split(",") for row in (resumed / "returns.csv").read_text().splitlines()[1:]]
    whole_dir = run_folder(whole)
    want = [row.split(",") for row in (whole_dir / "returns.csv").read_text().splitlines()[1:]]
    assert [(r[0], r[2]) for r in rows] == [(r[0], r[2]) for r in want], "the step and return columns differ"
    walls = [float(r[1]) for r in rows]  # one clock over both parts: the resumed part's rows go on from the first's
    assert walls == sorted(walls) and walls[-1] <= last["wall_s"]
    models = [torch.load(d / f"{name}.pt", weights_only=True)["q_network"] for d in (whole_dir, resumed)]
    assert_same(*models, where="the saved model")
    states = [torch.load(d / bk.STATE_FILE, weights_only=True) for d in (whole_dir, resumed)]
    assert_same(states[0]["state"], states[1]["state"], "the last state")  # target network, Adam, memory, envs
    assert_same(states[0]["rng"], states[1]["rng"], "the RNGs")
    for key in ("iterations", "steps", "ticks", "returns"):
        assert states[0]["run"][key] == states[1]["run"][key], key


@pytest.mark.parametrize("name", [EAGER, TWIN])
def test_a_run_stopped_by_sigterm_and_resumed_gives_the_numbers_of_the_run_never_stopped(name, stopped, tmp_path):
    """SHORT with its seed: once through, and stopped by SIGTERM at step K (eager: a second SIGTERM while the state is
    written, not acted on) then resumed with only --resume: the same losses, episodes, return curve, epsilon, model and
    last state (target network, Adam, replay memory, envs, RNGs); the wall clock goes on over both parts."""
    whole, folder = tmp_path / "whole", tmp_path / "stopped"
    whole.mkdir()
    folder.mkdir()
    main(name, SHORT, whole)
    if name == EAGER:  # the module's stopped run (a second SIGTERM came while it wrote its state)
        run_dir = copy_of(stopped[0], folder)
    else:
        _, run_dir = stopped_run(name, folder)
    main(name, ["--resume", str(run_dir)], folder)
    assert_resumed_run_is_the_whole_run(name, whole, folder, run_dir)
