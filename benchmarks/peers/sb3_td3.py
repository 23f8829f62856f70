"""SB3's TD3 with leanrl/td3_continuous_action.py's work per env step (CleanRL's defaults): one env, one gradient
step of a 256 batch per env step from learning_starts on, the actor and the targets every second step, target policy
noise 0.2 clipped at 0.5, Gaussian exploration noise 0.1, MLPs of 256 x 256 (SB3's default is 400 x 300)."""

import gymnasium as gym
import numpy as np
from sb3_common import learn, parse
from stable_baselines3 import TD3
from stable_baselines3.common.noise import NormalActionNoise

args = parse(__doc__.split("\n")[0], learning_starts=25000)
env = gym.make(args.env_id)
noise = NormalActionNoise(np.zeros(env.action_space.shape), 0.1 * np.ones(env.action_space.shape))
model = TD3(
    "MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000, learning_starts=args.learning_starts, batch_size=256,
    tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, action_noise=noise, policy_delay=2, target_policy_noise=0.2,
    target_noise_clip=0.5, policy_kwargs=dict(net_arch=[256, 256]), seed=args.seed, device=args.device,
)  # fmt: skip
learn(model, args.total_timesteps)
