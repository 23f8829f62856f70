"""A stopped run goes on (issue 41), for the PPO continuous pair on a MuJoCo env (InvertedPendulum-v4): the state
written when SIGTERM stops a run at an iteration's end comes back exactly (the agent, Adam, the global step, the
envs whole: MuJoCo's physics and RNG, the observation and reward normalisation statistics, the episodes under way;
the last obs and done flags); a run stopped and resumed gives exactly the numbers of the run never stopped; the twin's
capture stand-in resumed equals the twin resumed uncaptured. The helpers are test_resume.py's and
test_resume_continuous.py's."""

import pytest
import torch
from conftest import load_script
from gpu_standin import run_main
from test_resume import assert_same, results, resumed_captured_and_not
from test_resume_continuous import comparable, curve, resumed_equals_whole, state_at_the_loop, stop

NAMES = ["ppo_continuous_action", "ppo_continuous_action_torchcompile"]
MODULES = {name: load_script(name) for name in NAMES}
# 10 iterations of 2 envs x 32 steps (the lr annealed, 2 epochs of 2 minibatches), stopped after the 3rd; the 7 after
# it capture every graph of the twin (each one's 6th call) and replay it; the pendulum's episodes last a few steps
SHORT = ["--env-id", "InvertedPendulum-v4", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
SHORT += ["--update-epochs", "2", "--total-timesteps", "640", "--seed", "3", "--save-model"]
K = 192  # the step SIGTERM stops at: the end of the 3rd iteration


def main(name, flags, folder, cudagraphs=False):
    return run_main(
        MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
    )


def as_tensor(saved):
    """A saved array, numpy scalar or number as a tensor."""
    return saved.get("ndarray", saved.get("scalar")) if isinstance(saved, dict) else torch.tensor(saved)


def normalisers(packed_envs):
    """Each sub-env's running obs and reward statistics (mean, var, count) in the saved envs, as tensors."""
    stats = []

    def walk(data):
        if isinstance(data, dict) and "object" in data:
            for name in ("obs_rms", "return_rms"):
                if name in data["vars"]:
                    rms = data["vars"][name]["vars"]
                    stats.append([as_tensor(rms["mean"]), as_tensor(rms["var"]), as_tensor(rms["count"])])
        for part in data.values() if isinstance(data, dict) else data if isinstance(data, list | tuple) else ():
            walk(part)

    walk(packed_envs["env_data"])
    return stats


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Each script's SHORT run stopped at step K: {name: (its run folder, its state when written)}."""
    return {name: stop(name, tmp_path_factory.mktemp(name), main, SHORT, K) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_the_state_comes_back_exactly(name, stopped, tmp_path):
    """--resume, where the loop would start: the agent, Adam's moments and steps, the global step, each env's physics,
    RNG, normalisation statistics and episode counters, the last obs and done flags, the episodes and the RNGs."""
    run_dir, at_write = stopped[name]
    parts = at_write["parts"]
    assert parts["global_step"] == K and at_write["run"]["iterations"] == 3 and len(at_write["run"]["returns"]) > 10
    assert "env_data" in parts["envs"][0], "the envs were left out: their normalisation would start again"
    stats = normalisers(parts["envs"][0])
    assert len(stats) == 4 and all(count > K / 4 for _, _, count in stats), "no normalisation statistics saved"
    restored = state_at_the_loop(name, run_dir, tmp_path, main)
    assert_same(comparable(at_write), comparable(restored))
    assert_same(stats, normalisers(restored["parts"]["envs"][0]), "the normalisation statistics")


@pytest.mark.parametrize("name", NAMES)
def test_a_run_stopped_by_sigterm_and_resumed_gives_the_numbers_of_the_run_never_stopped(name, stopped, tmp_path):
    """SHORT with its seed once through, and stopped at step K then resumed with only --resume: the same losses,
    episodes, returns curve, saved model and last state (agent, Adam, envs with their statistics, RNGs)."""
    resumed_equals_whole(name, stopped[name][0], tmp_path, main, SHORT, saved=("model", "obs_rms"))


def test_a_resumed_twin_under_the_capture_stand_in_equals_the_resumed_twin_uncaptured(stopped, tmp_path):
    """One state (the twin stopped at step K) resumed with --cudagraphs under the CPU capture stand-in (the policy step,
    GAE and the update captured again after the resume) and with the same code path uncaptured: the same numbers."""
    name = NAMES[1]
    lines, dirs = resumed_captured_and_not(main, name, stopped[name][0], tmp_path, min_graphs=3)
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert lines[0][key] == lines[1][key], key
    curves = [curve(d) for d in dirs]
    assert curves[0] == curves[1] and len(curves[0]) > 20
    models = [torch.load(d / f"{name}.pt", weights_only=True) for d in dirs]
    for key in ("model", "obs_rms"):  # (their "args" differ: the resumed run's has --resume)
        assert_same(models[0][key], models[1][key], f"the saved {key}")
