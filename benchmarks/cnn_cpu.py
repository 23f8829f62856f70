"""PPO Atari's Nature CNN on one CPU core: the arithmetic of a training iteration against the core's float32 matmul
rate, each layer in NCHW and channels-last, and the whole network eager and compiled (docs/cpu-speed.md).

    python benchmarks/cnn_cpu.py [--threads 1] [--batch 256] [--repeats 20]

It loads leanrl/ppo_atari_envpool.py's own Agent and Args (the iteration's sizes are the script's defaults) and
counts FLOPs with torch's FlopCounterMode on the very calls it times. Pin it to a core (taskset) on an idle machine.
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import load_script, time_call  # noqa: E402

CPU = torch.device("cpu")


def seconds(fn, repeats):
    """The median of `repeats` timed calls after the warm-up (harness.time_call)."""
    return time_call(fn, CPU, budget_s=float("inf"), max_reps=repeats, min_reps=repeats)[0] / 1e6


def flops_of(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def layer_step(layer, x, needs_input_grad):
    """Forward and backward of one layer; the first layer's input needs no gradient (the frames are data)."""
    x = x.detach().requires_grad_(needs_input_grad)

    def step():
        layer(x).sum().backward()

    return step


def network_step(agent, frames):
    """Forward and backward of the whole agent on a minibatch, as the update runs it."""
    actions = torch.zeros(frames.shape[0], dtype=torch.long)

    def step():
        _, logprob, entropy, value = agent.get_action_and_value(frames, actions)
        (logprob.mean() + entropy.mean() + value.mean()).backward()

    return step


def iteration_flops(agent, args):
    """(forward FLOPs a frame, forward and backward a frame, an iteration's total): the rollout's num_envs x num_steps
    frames forward, then update_epochs passes over them forward and backward."""
    frame = torch.zeros(1, 4, 84, 84, dtype=torch.uint8)
    forward = flops_of(lambda: agent.get_action_and_value(frame))
    both = flops_of(network_step(agent, frame))
    rollout = args.num_envs * args.num_steps
    return forward, both, rollout * forward + args.update_epochs * rollout * both


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256, help="frames a minibatch (the script's default: 256)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ppo = load_script("ppo_atari_envpool")

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    peak = 2 * 2048**3 / seconds(lambda: a @ b, args.repeats)
    print(f"torch {torch.__version__}, {args.threads} thread(s); a 2048x2048 float32 matmul: {peak / 1e9:.1f} GFLOP/s")

    print("\n| layer, forward and backward | GFLOP | NCHW, GFLOP/s | channels-last, GFLOP/s |\n|---|---|---|---|")
    agent = ppo.Agent(n_actions=4)
    x = torch.rand(args.batch, 4, 84, 84)
    for i, layer in enumerate(agent.network):
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            rates = []
            for layout in (torch.contiguous_format, torch.channels_last):
                moved_layer, moved_x = layer, x
                if isinstance(layer, torch.nn.Conv2d):
                    moved_layer, moved_x = layer.to(memory_format=layout), x.contiguous(memory_format=layout)
                step = layer_step(moved_layer, moved_x, needs_input_grad=i > 0)
                flops = flops_of(step)
                rates.append(f"{flops / seconds(step, args.repeats) / 1e9:.1f}")
            if isinstance(layer, torch.nn.Linear):
                rates[1] = ""
            print(f"| {layer} | {flops / 1e9:.2f} | {rates[0]} | {rates[1]} |")
        x = layer(x).detach()

    frames = torch.randint(0, 256, (args.batch, 4, 84, 84), dtype=torch.uint8)
    print("\n| whole network, forward and backward on a minibatch | ms |\n|---|---|")
    for name, layout, compiled in (
        ("eager, NCHW (the scripts)", torch.contiguous_format, False),
        ("eager, channels-last", torch.channels_last, False),
        ("compiled, NCHW (the twins; inductor picks the layout)", torch.contiguous_format, True),
        ("compiled, channels-last", torch.channels_last, True),
    ):
        model = ppo.Agent(n_actions=4).to(memory_format=layout)
        step = network_step(model, frames.contiguous(memory_format=layout))
        step = torch.compile(step) if compiled else step
        print(f"| {name} | {seconds(step, args.repeats) * 1e3:.1f} |")

    defaults = ppo.Args()
    forward, both, total = iteration_flops(ppo.Agent(n_actions=4), defaults)
    rollout = defaults.num_envs * defaults.num_steps
    print(
        f"\nAn iteration at the script's defaults: {rollout:,} rollout frames forward ({forward / 1e6:.1f} MFLOP a "
        f"frame), {defaults.update_epochs * rollout:,} update frames forward and backward ({both / 1e6:.1f} MFLOP): "
        f"{total / 1e9:.0f} GFLOP, {total / peak:.2f} s at the matmul's rate."
    )


if __name__ == "__main__":
    main()
