"""SB3's PPO with leanrl/ppo_atari_envpool.py's work per env step (CleanRL's defaults): 8 envs, rollouts of 128 steps
each (1,024 a batch), 4 epochs of 4 minibatches of 256, the Nature CNN shared by a linear policy head and a linear
value head (SB3's CnnPolicy: NatureCNN, no hidden layers after it), GAE 0.95, the policy and value losses clipped at
0.1, gradients clipped at 0.5, Adam's eps 1e-5, the learning rate annealed to 0; --num-envs, --num-steps,
--num-minibatches and --update-epochs change the first four as our flags do. The env: ALE through gymnasium with
SB3's AtariWrapper (sb3_common.atari_env), where ours runs envpool's C++ pipeline with the same steps (frame skip 4
with max-pooling, 84 x 84 grey frames, 4 stacked, up to 30 no-ops, fire on reset, a lost life ends the training
episode, rewards clipped): those differ in env cost, not in the agent's work."""

from sb3_common import atari_env, learn, parse
from stable_baselines3 import PPO

args = parse(__doc__.split("\n")[0], learning_starts=None, num_envs=8, num_steps=128, num_minibatches=4,
             update_epochs=4)  # fmt: skip
batch = args.num_envs * args.num_steps
model = PPO(
    "CnnPolicy", atari_env(args.env_id, args.num_envs, args.seed), learning_rate=lambda progress: 2.5e-4 * progress,
    n_steps=args.num_steps, batch_size=batch // args.num_minibatches, n_epochs=args.update_epochs, gamma=0.99,
    gae_lambda=0.95, clip_range=0.1, clip_range_vf=0.1, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
    policy_kwargs=dict(optimizer_kwargs=dict(eps=1e-5)), seed=args.seed, device=args.device,
)  # fmt: skip
learn(model, args.total_timesteps)
