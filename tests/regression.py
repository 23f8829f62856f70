"""Seeded tiny CPU runs of every script whose numbers must not change when the scripts are rewritten.

`python tests/regression.py record [names...]` runs them and writes tests/data/regression.json;
tests/test_regression.py runs them again and compares. What is compared: the results line's numbers (steps,
episodes, mean return, losses, status) and the return curve (step, return) of returns.csv; times and speeds are not.

Float rounding differs between CPU models (oneDNN and MKL choose other kernels: a PPO Atari loss after ten iterations
differs by 2.5e-4 relative between the machine that recorded regression.json and a 2-core AMD EPYC, SAC's and TD3's
by up to 6%), so the whole run's floats are compared only on a CPU model that has numbers of its own,
tests/data/regression_<cpu>.json, recorded on it at a commit whose numbers the reference file also holds
(`python tests/regression.py record --this-cpu [names...]`): a case found there is compared with them, every other
case with regression.json (that CPU model computed those as the reference machine did). On every CPU the
comparison is of what rounding cannot change (invariants below) and of the first update: each case is run a second
time, cut at its first update (FIRST), and its losses are compared, to a tolerance, with
tests/data/regression-first-update.json (`python tests/regression.py record --first-update [names...]`).
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import ROOT, run_script  # noqa: E402

from leanrl.bookkeeping import cpu_name  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "regression.json"
FIRST_GOLDEN = GOLDEN.with_name("regression-first-update.json")


def cpu_golden(cpu=None):
    """This CPU model's own file of recorded numbers (it may not exist)."""
    slug = "".join(c if c.isalnum() else "-" for c in (cpu or cpu_name()).lower()).strip("-")
    return GOLDEN.with_name(f"regression_{slug}.json")


def golden_numbers(cpu=None):
    """{case: numbers}: the reference file's, and where this CPU model has its own, those cases as recorded on it."""
    path = cpu_golden(cpu)
    return {**json.loads(GOLDEN.read_text()), **(json.loads(path.read_text()) if path.exists() else {})}


PPO_ATARI = ("--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2")
PPO_ATARI += ("--total-timesteps", "640", "--measure-burnin", "1")
# CartPole-v1's 4 envs x 16 steps, 7 iterations, 2 epochs of 2 minibatches of 32 (PPO continuous's shape)
PPO = ("--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "448")
PPO_CONT = ("--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2")
PPO_CONT += ("--total-timesteps", "448")
DQN = ("--learning-starts", "200", "--total-timesteps", "1000", "--train-frequency", "10")
DQN_ATARI = ("--buffer-size", "2000", "--learning-starts", "200", "--batch-size", "8", "--measure-burnin", "1")
DQN_ATARI += ("--target-network-frequency", "100", "--total-timesteps", "600", "--train-frequency", "4")
OFF_POLICY = ("--env-id", "Pendulum-v1", "--learning-starts", "100", "--total-timesteps", "500", "--batch-size", "32")
OFF_POLICY += ("--buffer-size", "1000")
OFF_POLICY += ("--measure-burnin", "10")
R2D2 = ("--env-id", "CartPole-v1", "--num-envs", "4", "--hidden-size", "16", "--burn-in", "1")
R2D2 += ("--seq-len", "3", "--overlap", "1", "--batch-size", "8", "--train-frequency", "8")
R2D2 += ("--buffer-size", "400", "--learning-starts", "200", "--target-network-frequency", "10")
R2D2 += ("--measure-burnin", "1", "--total-timesteps", "600")
# 6 iterations of 4 envs x 32 steps: the returns, called once an iteration, are captured in the 5th
PQN = ("--num-steps", "32", "--total-timesteps", "768", "--measure-burnin", "1")
R2D2_ATARI = ("--num-envs", "2", "--hidden-size", "32", "--burn-in", "4", "--seq-len", "8", "--overlap", "4")
R2D2_ATARI += ("--batch-size", "4", "--buffer-size", "400", "--learning-starts", "40", "--train-frequency", "4")
R2D2_ATARI += ("--target-network-frequency", "20", "--measure-burnin", "1", "--total-timesteps", "160")
PQN_ATARI = ("--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2")
PQN_ATARI += ("--total-timesteps", "640", "--measure-burnin", "1")
DIST = ("--local-num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1")
DIST += ("--total-timesteps", "64", "--measure-burnin", "1")

PAIRS = {
    "ppo": PPO,
    "ppo_atari_envpool": PPO_ATARI,
    "ppo_continuous_action": PPO_CONT,
    "dqn": DQN,
    "dqn_atari_envpool": DQN_ATARI,
    "sac_continuous_action": OFF_POLICY,
    "td3_continuous_action": OFF_POLICY,
    "r2d2_atari_envpool": R2D2,
    # PQN Atari before PQN: compiled in one process after PQN's twin (test_gpu_path runs twins in-process), dynamo
    # fails an assertion ("q_network missing") resuming RAdam.step; each alone, and in this order, they pass
    "pqn_atari_envpool": PQN_ATARI,
    "pqn": PQN,
}
# the --total-timesteps of each pair's run cut at its first update: the first log point that holds every loss (PPO,
# PQN: one rollout and its update epochs; SAC and TD3: the first two gradient steps, the second one the actor's; DQN
# and R2D2: the first gradient step)
FIRST = {
    "ppo": "64",
    "ppo_atari_envpool": "64",
    "ppo_continuous_action": "64",
    "dqn": "211",
    "dqn_atari_envpool": "205",
    "sac_continuous_action": "103",
    "td3_continuous_action": "103",
    "r2d2_atari_envpool": "204",
    "pqn": "128",
    "pqn_atari_envpool": "64",
}


def first_update(flags, total):
    """The flags of the run cut at its first update: the same, but --total-timesteps `total`."""
    at = flags.index("--total-timesteps") + 1
    return (*flags[:at], total, *flags[at + 1 :])


# (case name, script, flags, flags of the run cut at its first update): eager, twin, twin --compile of every pair;
# R2D2 on Atari too; the distributed script as one process (it is the twin then)
CASES = []
for pair, flags in PAIRS.items():
    first = first_update(flags, FIRST[pair])
    CASES += [(pair, pair, flags, first), (f"{pair}_torchcompile", f"{pair}_torchcompile", flags, first)]
    CASES += [(f"{pair}_torchcompile --compile", f"{pair}_torchcompile", (*flags, "--compile"), (*first, "--compile"))]
CASES += [("r2d2_atari_envpool atari", "r2d2_atari_envpool", R2D2_ATARI, first_update(R2D2_ATARI, "42"))]
CASES += [("ppo_atari_envpool_distributed", "ppo_atari_envpool_distributed", DIST, first_update(DIST, "32"))]

# the cases whose networks read Atari frames through convolutions (oneDNN's kernels on CPU; every other case is an MLP,
# R2D2 on CartPole an MLP and an LSTM): other float kernels move their first update the most
CONV_CASES = {case for case, script, flags, _ in CASES if "atari" in script and "--env-id" not in flags}

# Float paths: switches that make this machine round as another CPU model does, by running other float kernels for
# the same algorithm (environment variables, or code run before the script in its process). What each moved on a
# 2-core AMD EPYC (torch 2.13.0+cpu), in the runs cut at the first update, none of them steps, episodes or curve steps:
FLOAT_PATHS = {
    # convolutions on ATen's own im2col + MKL gemm instead of oneDNN's kernels: the Atari cases
    "oneDNN off": {"prelude": "import torch; torch.backends.mkldnn.enabled = False"},
    # oneDNN's kernels for a CPU without AVX: the Atari cases
    "ONEDNN_MAX_CPU_ISA=SSE41": {"env": {"ONEDNN_MAX_CPU_ISA": "SSE41"}},
    # MKL's gemm (Linear layers) on its generic code path rather than the one it picks for this CPU: most cases
    "MKL_CBWR=COMPATIBLE": {"env": {"MKL_CBWR": "COMPATIBLE"}},
    # ATen's elementwise and reduction kernels without AVX2 / AVX-512: most cases (with --compile, inductor's C++
    # code then fails to build)
    "ATEN_CPU_CAPABILITY=default": {"env": {"ATEN_CPU_CAPABILITY": "default"}},
    # two intra-op threads instead of one: the PPO cases only (the others' tensors are too small to be split)
    "OMP_NUM_THREADS=2": {"env": {"OMP_NUM_THREADS": "2"}},
}


def numbers(script, flags, tmp, **how):
    """What a seeded run computed: the results line's numbers and the return curve. `how`: run_script's env and
    prelude (a float path)."""
    proc, lines = run_script(script, *flags, tmp_path=tmp, **how)
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    rows = (Path(tmp) / line["run_name"] / "returns.csv").read_text().splitlines()[1:]
    curve = [[int(row.split(",")[0]), float(row.split(",")[2])] for row in rows]
    keep = ("status", "steps", "episodes", "mean_return", "losses")
    return {**{key: line[key] for key in keep}, "curve": curve}


def invariants(numbers):
    """What float rounding does not change: status, steps, episodes, the return curve's steps, the losses' names."""
    keep = {key: numbers[key] for key in ("status", "steps", "episodes")}
    return {**keep, "curve steps": [step for step, _ in numbers["curve"]], "losses": sorted(numbers["losses"])}


def record(names, path=GOLDEN, first=False):
    golden = json.loads(path.read_text()) if path.exists() else {}
    for case, script, flags, first_flags in CASES:
        if names and case not in names and script not in names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            golden[case] = numbers(script, first_flags if first else flags, tmp)
        print(case, golden[case]["steps"], golden[case]["episodes"], golden[case]["losses"], flush=True)
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__" and sys.argv[1:2] == ["record"]:
    options = {"--this-cpu", "--first-update"}
    path = cpu_golden() if "--this-cpu" in sys.argv else FIRST_GOLDEN if "--first-update" in sys.argv else GOLDEN
    record([name for name in sys.argv[2:] if name not in options], path, first="--first-update" in sys.argv)
