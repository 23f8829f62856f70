"""benchmarks/time_to_score.py --sb3: SB3's side of time to a score, through benchmarks/peers/sb3_zoo.py on a stand-in
SB3 (CI has no peers' venv): the zoo's settings reach the model, the driver's returns.csv and results line are read
as our scripts' are, and the record's score is the one its episodes give."""

import json
import sys

import pytest
from conftest import load_script

time_to_score = load_script("benchmarks/time_to_score.py")

SB3_STUB = """
import json, os, time

__version__ = "2.9.2"


class DQN:
    def __init__(self, policy, env, seed, device, **settings):
        with open(os.environ["STUB_SETTINGS"], "w") as f:
            json.dump(settings, f)
        self.num_timesteps = 0

    def learn(self, total_timesteps, callback):  # an episode every 10 steps, returns 10, 20, 30, ...
        with open(os.environ["STUB_SETTINGS"] + ".total", "w") as f:
            f.write(str(total_timesteps))
        callback.num_timesteps = 0
        for step in range(1, total_timesteps + 1):
            self.num_timesteps = callback.num_timesteps = step
            callback.locals = {"infos": [{"episode": {"r": float(step), "l": 10}} if step % 10 == 0 else {}]}
            callback._on_step()
            time.sleep(0.005)


PPO = SAC = DQN
"""


def stand_in_venv(tmp_path):
    site = tmp_path / "venv" / "site"
    common = site / "stable_baselines3" / "common"
    common.mkdir(parents=True)
    (site / "stable_baselines3" / "__init__.py").write_text(SB3_STUB)
    (common / "callbacks.py").write_text("class BaseCallback:\n    def __init__(self):\n        pass\n")
    (common / "env_util.py").write_text("def make_vec_env(env_id, n_envs, seed):\n    return env_id\n")
    (common / "vec_env.py").write_text("def VecNormalize(env, gamma):\n    return env\n")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return tmp_path / "venv"


def test_sb3_is_timed_to_the_score_its_episodes_reach_with_the_zoo_settings(tmp_path, monkeypatch):
    """Episodes of returns 10, 20, 30, ... every 10 steps: the mean of the first k is 5 (k + 1), 45 at the 8th
    (step 80). About 5 s."""
    monkeypatch.setenv("STUB_SETTINGS", str(tmp_path / "settings.json"))
    out = tmp_path / "out"
    venv = stand_in_venv(tmp_path)
    flags = ["--script", "leanrl/dqn.py", "--sb3", str(venv), "--target", "45", "--min-games", "3"]
    assert time_to_score.main([*flags, "--deadline-s", "60", "--out", str(out)]) == 0
    (record,) = [json.loads(line) for line in (out / "time_to_score.jsonl").read_text().splitlines()]
    assert record["script"] == "sb3_zoo.py" and record["sb3_algo"] == "dqn" and record["env_id"] == "CartPole-v1"
    assert record["reached"] and record["stopped_by"] == "target" and record["steps_at_score"] == 80
    assert record["games_at_score"] == 8 and record["mean_at_score"] == 45.0
    assert record["results"]["status"] == "interrupted" and record["results"]["steps"] >= 80  # stopped by SIGTERM
    # rl-baselines3-zoo's dqn.yml, CartPole-v1
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings == dict(learning_rate=2.5e-4, batch_size=512, buffer_size=100_000, learning_starts=0, gamma=0.99,
                            target_update_interval=5000, train_freq=16, gradient_steps=4, exploration_fraction=0.06,
                            exploration_final_eps=0.11)  # fmt: skip
    # and the zoo's budget, which exploration_fraction is a fraction of (n_timesteps 2e5), not one of ours
    assert (tmp_path / "settings.json.total").read_text() == "200000"


def test_the_targets_beside_sb3_and_a_script_sb3_lacks(tmp_path, capsys):
    for script, env_id, target in [("leanrl/dqn.py", "CartPole-v1", 475.0), ("leanrl/pqn.py", "CartPole-v1", 475.0),
                                   ("leanrl/sac_continuous_action_torchcompile.py", "HalfCheetah-v4", 3000.0),
                                   ("leanrl/ppo_continuous_action.py", "HalfCheetah-v4", 3000.0)]:  # fmt: skip
        args, _ = time_to_score.parse(["--script", script])
        assert (args.env_id, args.target) == (env_id, target)
    venv = stand_in_venv(tmp_path)
    with pytest.raises(SystemExit) as exit:
        time_to_score.parse(["--script", "leanrl/pqn.py", "--sb3", str(venv)])
    assert exit.value.code == 2 and "--sb3" in capsys.readouterr().err
