"""What the SB3 drivers (sb3_<algo>.py) share: their flags and a progress bar that moves once per collect-then-train
cycle, which benchmarks/steady.py stamps (harness.stamp_first_bar) as it stamps TorchRL's bar. Runs in the peers'
venv (benchmarks/peers/install.sh), never imported by the project's tests or scripts."""

import argparse

import tqdm
from stable_baselines3.common.callbacks import BaseCallback


def parse(description, learning_starts, **sizes):
    """The flags every driver takes, --learning-starts where it has one and a flag for each of `sizes` (our flag's
    name and default: --num-steps for num_steps=2048)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--total-timesteps", type=int, required=True)
    if learning_starts is not None:
        parser.add_argument("--learning-starts", type=int, default=learning_starts)
    for name, default in sizes.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--seed", type=int, default=1)
    # cpu where the CPU table times it (one core, as ours); a GPU session passes SB3's own default, auto (the GPU)
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, or auto (SB3's default)")
    return parser.parse_args()


class Progress(BaseCallback):
    """A tqdm bar updated at the end of each rollout (SB3 calls it after collecting, before training on it): every
    train_freq env steps of an off-policy algorithm, every n_steps x n_envs of PPO."""

    def _on_training_start(self):
        self.bar, self.done = tqdm.tqdm(total=self.locals["total_timesteps"]), 0

    def _on_step(self):
        return True

    def _on_rollout_end(self):
        self.bar.update(self.num_timesteps - self.done)
        self.done = self.num_timesteps

    def _on_training_end(self):
        self.bar.close()


def atari_env(env_id, n_envs, seed):
    """gymnasium's ALE game `env_id` (ALE/Breakout-v5) in SB3's Atari pipeline, as envpool's Breakout-v5 that ours
    run: AtariWrapper (up to 30 no-ops, fire on reset, frame skip 4 with max-pooling, a lost life ends the training
    episode, 84 x 84 grey, rewards clipped) and 4 stacked frames. ALE's own frame skip and sticky actions off (v5
    defaults: 4 and 0.25; envpool's: none), so that the wrapper's skip is the only one."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    ale = dict(frameskip=1, repeat_action_probability=0.0)
    return VecFrameStack(make_atari_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=ale), n_stack=4)


def learn(model, total_timesteps):
    model.learn(total_timesteps, callback=Progress())
