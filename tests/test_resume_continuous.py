"""A stopped run goes on (issue 41), for the TD3 and SAC pairs on a MuJoCo env (InvertedPendulum-v4): the training
state written when SIGTERM stops a run after learning started comes back exactly (networks, targets, optimizers, the
temperature and its optimizer, the replay memory, the MuJoCo envs' physics and RNGs, the RNGs); a run stopped and
resumed gives exactly the numbers of the run never stopped; the twin's capture stand-in resumed equals the twin
resumed uncaptured. The helpers are test_resume.py's (the DQN pair's)."""

from unittest import mock

import pytest
import torch
from conftest import load_script
from gpu_standin import run_main
from test_resume import assert_same, copy_of, results, resumed_captured_and_not, run_folder, sigterm_at, snapshot

from leanrl import bookkeeping as bk

NAMES = ["td3_continuous_action", "td3_continuous_action_torchcompile"]
NAMES += ["sac_continuous_action", "sac_continuous_action_torchcompile"]
MODULES = {name: load_script(name) for name in NAMES}
# random steps to 100, then an update a step (the actor's every 2nd), log points every 100 steps and at the last; the
# memory (300 rows) wraps at step 300; InvertedPendulum's random episodes last a few steps: many episodes end
SHORT = ["--env-id", "InvertedPendulum-v4", "--learning-starts", "100", "--total-timesteps", "400"]
SHORT += ["--batch-size", "32", "--buffer-size", "300", "--measure-burnin", "10", "--seed", "3", "--save-model"]
K = 238  # the step SIGTERM stops at: after learning started, between log points, on a step without the actor's update


def main(name, flags, folder, cudagraphs=False):
    """main() of the script in this process on the CPU (a twin's --cudagraphs through the capture stand-in); returns
    the results lines in folder."""
    return run_main(
        MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
    )


# what the next step reads of a MuJoCo env's MjData: the state it integrates (time, positions, velocities, actuators,
# controls, the solver's warm start) and the body positions and contact forces the envs read before and after it
PHYSICS = ("qpos", "qvel", "act", "ctrl", "qacc_warmstart", "xpos", "cfrc_ext")


def comparable(state):
    """state with each MuJoCo env's MjData as PHYSICS and its time (the solver's scratch arrays, sized by the last
    step's contacts, left out: the next step makes them anew)."""
    if isinstance(state, dict) and "mjdata" in state:
        return [state["time"], *(state["mjdata"][name] for name in PHYSICS)]
    if isinstance(state, dict):
        return {key: comparable(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(comparable(value) for value in state)
    return state


def stop(name, folder, main=main, flags=SHORT, k=K):
    """The script's run (flags) stopped by SIGTERM at step k in folder: (its run folder, its state when written)."""
    taken, write = [], bk.Run.write_state

    def write_and_take(run):
        taken.append(snapshot(run))
        write(run)

    with mock.patch.object(bk.Run, "write_state", write_and_take), sigterm_at(k), pytest.raises(SystemExit) as end:
        main(name, flags, folder)
    assert end.value.code == 143  # 128 + SIGTERM
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == k and line["resumed"] == 0, line
    [at_write] = taken
    return run_folder(folder), at_write


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Each script's SHORT run stopped at step K: {name: (its run folder, its state when written)}."""
    return {name: stop(name, tmp_path_factory.mktemp(name)) for name in NAMES}


def curve(run_dir):
    """The (step, return) rows of the run's returns.csv (its wall-clock column left out)."""
    return [row.split(",")[::2] for row in (run_dir / "returns.csv").read_text().splitlines()]


@pytest.mark.parametrize("name", NAMES)
def test_the_state_comes_back_exactly(name, stopped, tmp_path):
    """--resume, where the loop would start: every network and target, Adam's moments and steps (the twin's Adam held
    as tensors by hand), SAC's log_alpha and its optimizer, the replay memory and its fill count, the last obs, the
    global step, the last losses read, each MuJoCo env's physics, RNG and episode counters, the episodes, and the RNGs:
    exactly what they were when the state was written."""
    run_dir, at_write = stopped[name]
    parts = at_write["parts"]
    assert parts["global_step"] == K and at_write["run"]["iterations"] == K and len(at_write["run"]["returns"]) > 10
    assert "env_data" in parts["envs"][0], "the MuJoCo envs were left out"
    replay, count = parts["replay"]
    assert int(count) == K and replay["obs"].abs().sum() > 0, "the replay memory was left out"
    optimizers = [parts[key] for key in parts if key.endswith("optimizer")]
    assert len(optimizers) == (3 if name.startswith("sac") else 2)
    for adam in optimizers:  # each has stepped: torch.optim's state, or the twin's tensors
        steps = [s["step"] for s in adam["state"].values()] if "state" in adam else [adam["step"]]
        assert steps and all(int(step) > 0 for step in steps), "an optimizer has not stepped"
    if name.startswith("sac"):
        assert parts["log_alpha"].item() != 0.0, "the temperature has not moved from 1"
    assert_same(comparable(at_write), comparable(state_at_the_loop(name, run_dir, tmp_path)))


def state_at_the_loop(name, run_dir, tmp_path, main=main):
    """The state of the stopped run in run_dir resumed, where its loop would start (snapshot(), as written)."""
    restored = []

    def taken(run, iterable):
        restored.append(snapshot(run))
        raise SystemExit(0)

    with mock.patch.object(bk.Run, "progress", taken), pytest.raises(SystemExit):
        main(name, ["--resume", str(copy_of(run_dir, tmp_path))], tmp_path)
    return restored[0]


@pytest.mark.parametrize("name", NAMES)
def test_a_run_stopped_by_sigterm_and_resumed_gives_the_numbers_of_the_run_never_stopped(name, stopped, tmp_path):
    """SHORT with its seed once through, and stopped at step K then resumed with only --resume: the same losses,
    episodes, returns curve, saved actor and critics, and last state (memory, optimizers, temperature, envs, RNGs)."""
    resumed_equals_whole(name, stopped[name][0], tmp_path, saved=("actor", "qf"))


def resumed_equals_whole(name, run_dir, tmp_path, main=main, flags=SHORT, saved=()):
    """The run of flags once through, and the stopped one in run_dir resumed with only --resume: the same losses,
    episodes, returns curve, saved model (its `saved` parts), last state and RNGs."""
    whole, folder = tmp_path / "whole", tmp_path / "stopped"
    [line] = main(name, flags, whole)
    resumed = copy_of(run_dir, folder)
    last = main(name, ["--resume", str(resumed)], folder)[-1]
    assert last["status"] == "ok" and last["resumed"] == 1 and last["run_name"] == resumed.name, last
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert last[key] == line[key], key
    whole_dir = run_folder(whole)
    curves = [curve(d) for d in (whole_dir, resumed)]
    assert curves[0] == curves[1] and len(curves[0]) > 20
    models = [torch.load(d / f"{name}.pt", weights_only=True) for d in (whole_dir, resumed)]
    for key in saved:  # (the checkpoints' "args" differ: the resumed run's has --resume)
        assert_same(models[0][key], models[1][key], f"the saved {key}")
    states = [torch.load(d / bk.STATE_FILE, weights_only=True) for d in (whole_dir, resumed)]
    assert_same(comparable(states[0]["state"]), comparable(states[1]["state"]), "the last state")
    assert_same(states[0]["rng"], states[1]["rng"], "the RNGs")


@pytest.mark.parametrize("name", [name for name in NAMES if name.endswith("_torchcompile")])
def test_a_resumed_twin_under_the_capture_stand_in_equals_the_resumed_twin_uncaptured(name, stopped, tmp_path):
    """One state (the twin stopped at step K) resumed with --cudagraphs under the CPU capture stand-in (the policy
    step, the buffer write and the updates captured again after the resume) and with the same code path uncaptured:
    the same losses, episodes, returns curve and saved actor and critics."""
    lines, dirs = resumed_captured_and_not(main, name, stopped[name][0], tmp_path)
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert lines[0][key] == lines[1][key], key
    curves = [curve(d) for d in dirs]
    assert curves[0] == curves[1] and len(curves[0]) > 20
    models = [torch.load(d / f"{name}.pt", weights_only=True) for d in dirs]
    assert_same(models[0]["actor"], models[1]["actor"], "the saved actor")
    assert_same(models[0]["qf"], models[1]["qf"], "the saved critics")


def test_a_resumed_compiled_twin_compiles_no_more_graphs_than_a_new_run(stopped, tmp_path):
    """TD3's twin with --compile: a resumed run (its obs restored into the reset obs) compiles as many graphs as a new
    run; an obs laid out otherwise after the reset (a strided column of the step's upload) recompiled the update at its
    second call. SAC's twin shares the layout."""
    from torch._dynamo.utils import counters

    name, graphs = "td3_continuous_action_torchcompile", []
    resumed = ["--resume", str(copy_of(stopped[name][0], tmp_path))]
    for flags, folder in ((SHORT, tmp_path / "new"), (resumed, tmp_path)):
        counters.clear()
        main(name, [*flags, "--compile"], folder)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] > 0, graphs
