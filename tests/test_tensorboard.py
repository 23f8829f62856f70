"""TensorBoard as in CleanRL (issue 43 item 2): `tensorboard --logdir runs` shows each run's scalars, written by the
run bookkeeping into the run folder at the log points: the event file read back equals the return curve and the
results line; a machine without the tensorboard package runs without event files and says so once."""

import numpy as np
import pytest
from conftest import run_in, run_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TINY = {
    "dqn": ["--learning-starts", "200", "--total-timesteps", "1000", "--train-frequency", "10"],
    "pqn": ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "1280"],
    "ppo": ["--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "640"],
}
LOSS = {"dqn": "losses/td_loss", "pqn": "losses/td_loss", "ppo": "losses/value_loss"}  # one the script must log


def events(run_dir):
    """{tag: [(step, value)]} of the scalars in the run folder's event files."""
    (event_file,) = run_dir.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(event_file), size_guidance={"scalars": 0})  # 0: keep every value
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("name", ["dqn", "pqn", "ppo"])
def test_the_event_file_holds_the_return_curve_and_the_results_lines_losses(name, tmp_path):
    proc, _ = run_script(name, *TINY[name], tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line, curve = run_in(tmp_path)
    logged = events(tmp_path / line["run_name"])
    # every episode at its step, the return as float32 (TensorBoard's type): a dropped or shifted episode fails
    assert curve and logged["charts/episodic_return"] == [(step, np.float32(ret)) for step, ret in curve]
    assert len(logged["charts/episodic_length"]) == len(curve) == line["episodes"]
    # CartPole pays 1 a step: an episode's length is its return
    assert [e[1] for e in logged["charts/episodic_length"]] == [e[1] for e in logged["charts/episodic_return"]]
    # the last log point's losses are the results line's
    for loss, value in line["losses"].items():
        if f"losses/{loss}" in logged:
            assert logged[f"losses/{loss}"][-1][1] == np.float32(value), loss
    assert LOSS[name] in logged
    sps = logged["charts/SPS"]
    assert sps and [step for step, _ in sps] == sorted(step for step, _ in sps) and all(v > 0 for _, v in sps[1:])


def test_without_the_tensorboard_package_a_run_writes_no_event_file_and_says_so_once(tmp_path):
    # torch.utils.tensorboard made unimportable, as on a machine without the package
    hide = "import sys; sys.modules['torch.utils.tensorboard'] = None"
    proc, _ = run_script("dqn", *TINY["dqn"], tmp_path=tmp_path, prelude=hide)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line, curve = run_in(tmp_path)
    assert curve and line["status"] == "ok"
    assert not list((tmp_path / line["run_name"]).glob("events.out.tfevents.*"))
    assert proc.stderr.count("tensorboard is not installed") == 1
