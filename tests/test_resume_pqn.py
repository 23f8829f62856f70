"""A stopped run goes on (issue 41), for the PQN CartPole family: pqn.py, pqn_torchcompile.py and pqn_device_env.py
stopped by SIGTERM at an iteration's end and resumed give exactly the numbers of the run never stopped (losses, return
curve, model, last state); the twins' capture stand-in resumed equals the uncaptured resumed run; another script's
state is refused."""

import pytest
import torch
from conftest import load_script, main_args
from gpu_standin import run_main
from test_resume import assert_same, assert_same_ends, results, resumed_captured_and_not, run_folder, sigterm_at

from leanrl import bookkeeping as bk

EAGER, TWIN, DEVICE = "pqn", "pqn_torchcompile", "pqn_device_env"
MODULES = {name: load_script(name) for name in (EAGER, TWIN, DEVICE)}
# 10 iterations of a small batch (6 for pqn_device_env; episodes end in each: epsilon starts at 1), stopped after the
# 3rd: every part of the loop (the lr annealed, epsilon scheduled, the rollout, the returns, two epochs of minibatch
# updates, the log point), and in the resumed part every graph captured (the twin's returns: its 5th call)
GYM = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2"]
SHORT = {
    EAGER: [*GYM, "--total-timesteps", "640"],
    TWIN: [*GYM, "--total-timesteps", "640"],
    DEVICE: ["--num-envs", "8", "--num-steps", "16", "--num-minibatches", "4", "--update-epochs", "2",
             "--total-timesteps", "768"],
}  # fmt: skip
for flags in SHORT.values():
    flags += ["--seed", "3", "--save-model"]
K = {EAGER: 192, TWIN: 192, DEVICE: 384}  # the step SIGTERM stops at: the end of the 3rd iteration


def main(name, flags, folder, cudagraphs=False):
    """main() of the script in this process on the CPU (--cudagraphs through the capture stand-in); returns the
    results lines in folder."""
    return run_main(
        MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
    )


def stopped_run(name, folder):
    """The script's SHORT run stopped by SIGTERM at step K, in folder: its run folder."""
    with sigterm_at(K[name]), pytest.raises(SystemExit) as stopped:
        main(name, SHORT[name], folder)
    assert stopped.value.code == 143  # 128 + SIGTERM
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == K[name] and line["resumed"] == 0, line
    return run_folder(folder)


def curve(run_dir):
    """returns.csv's step and return columns."""
    return [row.split(",")[::2] for row in (run_dir / "returns.csv").read_text().splitlines()[1:]]


@pytest.mark.parametrize("name", [EAGER, TWIN, DEVICE])
def test_a_run_stopped_by_sigterm_and_resumed_gives_the_numbers_of_the_run_never_stopped(name, tmp_path):
    """SHORT with its seed: once through, and stopped by SIGTERM at the end of iteration 3 then resumed with only
    --resume: the same losses, episodes, mean return, epsilon, return curve, model and last state (Q-network, RAdam's
    moments and steps, the envs with their obs and done flags or the tensor env's CartPole states, elapsed steps and
    episode sums, the RNGs)."""
    whole, folder = tmp_path / "whole", tmp_path / "stopped"
    [line] = main(name, SHORT[name], whole)
    run_dir = stopped_run(name, folder)
    state = torch.load(run_dir / bk.STATE_FILE, weights_only=True)["state"]
    assert state["global_step"] == K[name] and state["optimizer"] and state["q_network"], "nothing to compare"
    envs = state["envs"] if name == DEVICE else state["envs"][0]  # the tensor env, or the pickled sub-envs
    assert set(envs) == ({"state", "elapsed", "done", "length", "return"} if name == DEVICE else {"env_data"})
    last = main(name, ["--resume", str(run_dir)], folder)[-1]
    assert last["status"] == "ok" and last["resumed"] == 1 and last["run_name"] == run_dir.name, last
    for key in ("steps", "episodes", "mean_return", "losses", "epsilon"):
        assert last[key] == line[key], key
    whole_dir = run_folder(whole)
    assert curve(run_dir) == curve(whole_dir) and len(curve(whole_dir)) > 10
    assert int(curve(run_dir)[0][0]) <= K[name] < int(curve(run_dir)[-1][0])  # episodes on both sides of K
    assert_same_ends(name, whole_dir, run_dir)


@pytest.mark.parametrize("name", [TWIN, DEVICE])
def test_a_resumed_twin_under_the_capture_stand_in_equals_the_resumed_twin_uncaptured(name, tmp_path):
    """One state (the script stopped at step K) resumed twice, with --cudagraphs under the CPU capture stand-in (the
    graphs captured again after the resume, RAdam capturable whatever the stopped run's was) and with the same code
    path uncaptured: the same losses, episodes, return curve and model."""
    run_dir = stopped_run(name, tmp_path / "stopped")
    lines, dirs = resumed_captured_and_not(main, name, run_dir, tmp_path, min_graphs=1)
    for key in ("steps", "episodes", "mean_return", "losses", "epsilon"):
        assert lines[0][key] == lines[1][key], key
    assert curve(dirs[0]) == curve(dirs[1]) and len(curve(dirs[0])) > 10
    models = [torch.load(d / f"{name}.pt", weights_only=True)["model"] for d in dirs]
    assert_same(*models, where="the saved model")


def test_a_state_of_pqn_py_given_to_the_twin_is_refused(tmp_path, capsys):
    """pqn_torchcompile.py --resume with pqn.py's state: one line naming the problem, exit 2, nothing written."""
    run_dir = stopped_run(EAGER, tmp_path / "stopped")
    files = {p: p.read_bytes() for p in run_dir.iterdir()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        MODULES[TWIN].main(main_args(MODULES[TWIN], ["--resume", str(run_dir)], tmp_path / "twin"))
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("pqn_torchcompile.py: error: "), err
    assert "is the state of a pqn.py run, not of pqn_torchcompile.py" in err[0], err
    assert not (tmp_path / "twin").exists()
    assert {p: p.read_bytes() for p in run_dir.iterdir()} == files
