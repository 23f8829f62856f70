"""SB3's DQN with leanrl/dqn_atari_envpool.py's work per env step (CleanRL's defaults): one env, one gradient step of a
32 batch every 4 env steps from learning_starts on, a replay of 1,000,000, the target net copied every 1,000 steps,
the Nature CNN (SB3's CnnPolicy: NatureCNN and a linear Q head), epsilon from 1 to 0.01 over a tenth of the run;
--num-envs, --buffer-size, --batch-size, --train-frequency and --target-network-frequency change them as our flags do.
Where SB3 differs: a Huber loss (CleanRL: squared error) and gradients clipped at norm 10 (CleanRL: not clipped), a
few element-wise ops an update; its replay stores each transition's two stacks of 4 frames (56 KB; ours one frame,
7 KB), more bytes copied per stored step and per sampled batch. The env: SB3's AtariWrapper on gymnasium's ALE, where
ours runs envpool's pipeline with the same steps (sb3_ppo_atari.py says which): env cost, not the agent's work."""

from sb3_common import atari_env, learn, parse
from stable_baselines3 import DQN

args = parse(__doc__.split("\n")[0], learning_starts=80000, num_envs=1, buffer_size=1_000_000, batch_size=32,
             train_frequency=4, target_network_frequency=1000)  # fmt: skip
model = DQN(
    "CnnPolicy", atari_env(args.env_id, args.num_envs, args.seed), learning_rate=1e-4, buffer_size=args.buffer_size,
    learning_starts=args.learning_starts, batch_size=args.batch_size, tau=1.0, gamma=0.99,
    train_freq=args.train_frequency, gradient_steps=1, target_update_interval=args.target_network_frequency,
    exploration_fraction=0.1, exploration_initial_eps=1.0, exploration_final_eps=0.01, seed=args.seed,
    device=args.device,
)  # fmt: skip
learn(model, args.total_timesteps)
