"""A stopped run goes on (issue 41), for the PPO CartPole pair: ppo.py and ppo_torchcompile.py stopped by SIGTERM at an
iteration's end and resumed give exactly the numbers of the run never stopped (losses, return curve, model, last
state); the twin's capture stand-in resumed equals the uncaptured resumed run. The helpers are test_resume.py's."""

import pytest
import torch
from conftest import load_script
from gpu_standin import run_main
from test_resume import assert_same, assert_same_ends, results, resumed_captured_and_not, run_folder, sigterm_at

from leanrl import bookkeeping as bk

EAGER, TWIN = "ppo", "ppo_torchcompile"
MODULES = {name: load_script(name) for name in (EAGER, TWIN)}
# 10 iterations of 4 envs x 16 steps (the lr annealed, 2 epochs of 2 minibatches), stopped after the 3rd; the 7 after
# it capture every graph of the twin (GAE at its 5th call) and replay it; CartPole's first episodes last ~20 steps
SHORT = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2"]
SHORT += ["--total-timesteps", "640", "--seed", "3", "--save-model"]
K = 192  # the step SIGTERM stops at: the end of the 3rd iteration


def main(name, flags, folder, cudagraphs=False):
    """main() of the script in this process on the CPU (--cudagraphs through the capture stand-in); its results."""
    return run_main(
        MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
    )


def stopped_run(name, folder):
    """The script's SHORT run stopped by SIGTERM at step K, in folder: its run folder."""
    with sigterm_at(K), pytest.raises(SystemExit) as stopped:
        main(name, SHORT, folder)
    assert stopped.value.code == 143  # 128 + SIGTERM
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == K and line["resumed"] == 0, line
    return run_folder(folder)


def curve(run_dir):
    """returns.csv's step and return columns."""
    return [row.split(",")[::2] for row in (run_dir / "returns.csv").read_text().splitlines()[1:]]


@pytest.mark.parametrize("name", [EAGER, TWIN])
def test_a_run_stopped_by_sigterm_and_resumed_gives_the_numbers_of_the_run_never_stopped(name, tmp_path):
    """SHORT with its seed: once through, and stopped by SIGTERM at the end of iteration 3 then resumed with only
    --resume: the same losses, episodes, mean return, return curve, model and last state (the agent, Adam's moments
    and steps, the envs with the last obs and done flags, the RNGs)."""
    whole, folder = tmp_path / "whole", tmp_path / "stopped"
    [line] = main(name, SHORT, whole)
    run_dir = stopped_run(name, folder)
    state = torch.load(run_dir / bk.STATE_FILE, weights_only=True)["state"]
    assert state["global_step"] == K and state["optimizer"] and state["agent"], "nothing to compare"
    assert "env_data" in state["envs"][0], "the envs were left out: their episodes would start again"
    last = main(name, ["--resume", str(run_dir)], folder)[-1]
    assert last["status"] == "ok" and last["resumed"] == 1 and last["run_name"] == run_dir.name, last
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert last[key] == line[key], key
    whole_dir = run_folder(whole)
    assert curve(run_dir) == curve(whole_dir) and len(curve(whole_dir)) > 10
    assert int(curve(run_dir)[0][0]) <= K < int(curve(run_dir)[-1][0])  # episodes on both sides of K
    assert_same_ends(name, whole_dir, run_dir)


def test_a_resumed_twin_under_the_capture_stand_in_equals_the_resumed_twin_uncaptured(tmp_path):
    """One state (the twin stopped at step K) resumed with --cudagraphs under the CPU capture stand-in (the policy step,
    GAE and the update captured again after the resume) and with the same code path uncaptured: the same numbers."""
    run_dir = stopped_run(TWIN, tmp_path / "stopped")
    lines, dirs = resumed_captured_and_not(main, TWIN, run_dir, tmp_path, min_graphs=3)
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert lines[0][key] == lines[1][key], key
    assert curve(dirs[0]) == curve(dirs[1]) and len(curve(dirs[0])) > 10
    models = [torch.load(d / f"{TWIN}.pt", weights_only=True)["model"] for d in dirs]
    assert_same(*models, where="the saved model")
