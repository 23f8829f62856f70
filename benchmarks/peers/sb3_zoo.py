"""SB3 with rl-baselines3-zoo's tuned hyper-parameters (what an SB3 user runs), for benchmarks/time_to_score.py --sb3:
it writes what our scripts write for the harness, <results folder>/<run_name>/returns.csv (step, wall seconds,
episodic return: one line a finished episode) and one results line when it ends (status ok, or interrupted when
stopped by SIGTERM or Ctrl-C). Runs in the peers' venv (benchmarks/peers/install.sh).

Settings, from rl-baselines3-zoo's hyperparams/: dqn.yml's CartPole-v1 (commit 019107e), ppo.yml's CartPole-v1 and
sac.yml's and ppo.yml's HalfCheetah entries (commit 00128b5, written for HalfCheetah-v3: the zoo's MuJoCo settings;
v4 is the same robot on the maintained bindings). "lin_X" there: X annealed linearly to 0; "normalize": VecNormalize
with the algorithm's gamma, as the zoo does; the budget, the entry's n_timesteps (its schedules' length)."""

import argparse
import json
import os
import signal
import time
from collections import deque

import stable_baselines3
import torch
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize


def linear(start):
    return lambda progress_remaining: progress_remaining * start


ZOO = {  # (algo, env): (class, n_envs, normalize, settings)
    ("dqn", "CartPole-v1"): (DQN, 1, False, dict(
        learning_rate=2.5e-4, batch_size=512, buffer_size=100_000, learning_starts=0, gamma=0.99,
        target_update_interval=5000, train_freq=16, gradient_steps=4, exploration_fraction=0.06,
        exploration_final_eps=0.11)),
    ("ppo", "CartPole-v1"): (PPO, 8, False, dict(
        n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        learning_rate=linear(1e-3), clip_range=linear(0.2))),
    ("ppo", "HalfCheetah-v4"): (PPO, 1, True, dict(
        batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
        n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
        policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                           net_arch=dict(pi=[256, 256], vf=[256, 256])))),
    ("sac", "HalfCheetah-v4"): (SAC, 1, False, dict(learning_starts=10_000)),
}  # fmt: skip
# the zoo's n_timesteps for each entry: the budget its "lin_" schedules and exploration_fraction are fractions of
ZOO_TIMESTEPS = {("dqn", "CartPole-v1"): 200_000, ("ppo", "CartPole-v1"): 100_000,
                 ("ppo", "HalfCheetah-v4"): 1_000_000, ("sac", "HalfCheetah-v4"): 1_000_000}  # fmt: skip


class Returns(BaseCallback):
    """One returns.csv line a finished episode (SB3's Monitor puts its return in the step's info)."""

    def __init__(self, path, start):
        super().__init__()
        self.file, self.start, self.last100, self.episodes = open(path, "w", buffering=1), start, deque(maxlen=100), 0  # noqa: SIM115
        self.file.write("step,wall_s,episodic_return\n")

    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.file.write(f"{self.num_timesteps},{time.time() - self.start:.3f},{info['episode']['r']:g}\n")
                self.last100.append(float(info["episode"]["r"]))
                self.episodes += 1
        return True


def stop(signum, frame):
    raise KeyboardInterrupt


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", choices=sorted({algo for algo, _ in ZOO}), required=True)
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, help="default: the zoo's n_timesteps for the entry")
    parser.add_argument("--results-file", required=True)
    args = parser.parse_args()
    if (args.algo, args.env_id) not in ZOO:
        parser.error(f"no zoo settings here for {args.algo} on {args.env_id}: {sorted(ZOO)}")
    cls, n_envs, normalize, settings = ZOO[args.algo, args.env_id]
    total = args.total_timesteps or ZOO_TIMESTEPS[args.algo, args.env_id]
    start = time.time()
    signal.signal(signal.SIGTERM, stop)
    run_name = f"{args.env_id}__sb3_{args.algo}__{args.seed}__{int(start)}"
    folder = os.path.join(os.path.dirname(os.path.abspath(args.results_file)), run_name)
    os.makedirs(folder)
    env = make_vec_env(args.env_id, n_envs=n_envs, seed=args.seed)
    if normalize:
        env = VecNormalize(env, gamma=settings["gamma"])
    model = cls("MlpPolicy", env, seed=args.seed, device="cpu", **settings)
    returns, status = Returns(os.path.join(folder, "returns.csv"), start), "ok"
    try:
        model.learn(total, callback=returns)
    except KeyboardInterrupt:
        status = "interrupted"
    wall = time.time() - start
    line = dict(script="sb3_zoo.py", algo=args.algo, env_id=args.env_id, seed=args.seed, run_name=run_name,
                stable_baselines3=stable_baselines3.__version__, torch=torch.__version__, device="cpu",
                steps=model.num_timesteps, sps=model.num_timesteps / wall, wall_s=wall,
                mean_return=sum(returns.last100) / len(returns.last100) if returns.last100 else None,
                episodes=returns.episodes, status=status)  # fmt: skip
    returns.file.close()
    with open(args.results_file, "a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
