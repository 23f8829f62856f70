"""SB3's SAC with leanrl/sac_continuous_action.py's work per env step (CleanRL's defaults): one env, one gradient
step of a 256 batch per env step from learning_starts on, target nets updated every step (tau 0.005), twin Q and
policy MLPs of 256 x 256, entropy coefficient tuned. Where SB3 differs: one learning rate for all (CleanRL: 3e-4
policy, 1e-3 Q; no effect on speed), and the actor updated every step where CleanRL updates it twice every second
step (the same number of actor updates)."""

import gymnasium as gym
from sb3_common import learn, parse
from stable_baselines3 import SAC

args = parse(__doc__.split("\n")[0], learning_starts=5000)
model = SAC(
    "MlpPolicy", gym.make(args.env_id), learning_rate=3e-4, buffer_size=1_000_000, learning_starts=args.learning_starts,
    batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto", target_update_interval=1,
    policy_kwargs=dict(net_arch=[256, 256]), seed=args.seed, device=args.device,
)  # fmt: skip
learn(model, args.total_timesteps)
