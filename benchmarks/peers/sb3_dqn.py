"""SB3's DQN with leanrl/dqn.py's work per env step (CleanRL's defaults): one env, one gradient step of a 128 batch
every 10 env steps from learning_starts on, a replay of 10,000, the target net copied every 500 steps, an MLP of
120 x 84, epsilon from 1 to 0.05 over half the run. Where SB3 differs: a Huber loss (CleanRL: squared error) and
gradients clipped at norm 10 (CleanRL: not clipped), a few element-wise ops an update."""

from sb3_common import learn, parse
from stable_baselines3 import DQN

args = parse(__doc__.split("\n")[0], learning_starts=10000)
model = DQN(
    "MlpPolicy", args.env_id, learning_rate=2.5e-4, buffer_size=10_000, learning_starts=args.learning_starts,
    batch_size=128, tau=1.0, gamma=0.99, train_freq=10, gradient_steps=1, target_update_interval=500,
    exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.05,
    policy_kwargs=dict(net_arch=[120, 84]), seed=args.seed, device=args.device,
)  # fmt: skip
learn(model, args.total_timesteps)
