"""SB3's PPO with leanrl/ppo_continuous_action.py's work per env step (CleanRL's defaults): one env, rollouts of
2,048 steps, 10 epochs of 32 minibatches of 64, separate actor and critic MLPs of 64 x 64 with tanh, GAE 0.95, the
value loss clipped as the policy's (0.2), gradients clipped at 0.5, the learning rate annealed to 0, observations and
rewards normalised and clipped at 10 (VecNormalize: what CleanRL's gymnasium wrappers do). --num-steps,
--num-minibatches and --update-epochs change the first three as our flags do."""

from sb3_common import learn, parse
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
from torch import nn

args = parse(__doc__.split("\n")[0], learning_starts=None, num_steps=2048, num_minibatches=32, update_epochs=10)
env = VecNormalize(make_vec_env(args.env_id, n_envs=1, seed=args.seed), gamma=0.99, clip_obs=10.0, clip_reward=10.0)
model = PPO(
    "MlpPolicy", env, learning_rate=lambda progress: 3e-4 * progress, n_steps=args.num_steps,
    batch_size=args.num_steps // args.num_minibatches, n_epochs=args.update_epochs,
    gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
    policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=nn.Tanh), seed=args.seed,
    device=args.device,
)  # fmt: skip
learn(model, args.total_timesteps)
