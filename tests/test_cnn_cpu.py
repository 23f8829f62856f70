"""benchmarks/cnn_cpu.py: the FLOPs it divides by are PPO Atari's network's, counted here apart from torch."""

from benchmarks import cnn_cpu


def conv_flops(in_channels, out_channels, kernel, out_side):
    return 2 * out_channels * out_side**2 * in_channels * kernel**2


def test_an_iterations_flops_are_the_networks_arithmetic_at_the_scripts_sizes():
    """Forward: the three convolutions (20x20, 9x9 and 7x7 outputs), the 3136->512 layer and the two heads; the
    backward twice that, less the first convolution's input gradient (the frames need none); the iteration: the
    rollout's frames forward and update_epochs passes over them forward and backward."""
    ppo = cnn_cpu.load_script("ppo_atari_envpool")
    n_actions = 4
    first = conv_flops(4, 32, 8, 20)
    forward = first + conv_flops(32, 64, 4, 9) + conv_flops(64, 64, 3, 7) + 2 * 3136 * 512 + 2 * 512 * (n_actions + 1)
    both = 3 * forward - first
    args = ppo.Args(num_envs=3, num_steps=5, update_epochs=2)
    counted = cnn_cpu.iteration_flops(ppo.Agent(n_actions=n_actions), args)
    assert counted == (forward, both, 15 * forward + 2 * 15 * both)
