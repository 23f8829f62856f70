"""Seeded tiny CPU runs of every script whose numbers must not change when the scripts are rewritten.

`python tests/regression.py record [names...]` runs them and writes tests/data/regression.json;
tests/test_regression.py runs them again and compares. What is compared: the results line's numbers (steps,
episodes, mean return, losses, status) and the return curve (step, return) of returns.csv; times and speeds are not.

Float rounding differs between CPU models (oneDNN and MKL choose other kernels: a PPO Atari loss after two updates
differs by 2.5e-4 relative between the machine that recorded regression.json and a 2-core AMD EPYC), so a CPU
model may have its own numbers, tests/data/regression_<cpu>.json, recorded on it at a commit whose numbers the
reference file also holds (`python tests/regression.py record --this-cpu [names...]`): a case found there is
compared with them, every other case with regression.json.
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import ROOT, run_script  # noqa: E402

from leanrl.bookkeeping import cpu_name  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "regression.json"


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
R2D2_ATARI = ("--num-envs", "2", "--hidden-size", "32", "--burn-in", "4", "--seq-len", "8", "--overlap", "4")
R2D2_ATARI += ("--batch-size", "4", "--buffer-size", "400", "--learning-starts", "40", "--train-frequency", "4")
R2D2_ATARI += ("--target-network-frequency", "20", "--measure-burnin", "1", "--total-timesteps", "160")
DIST = ("--local-num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1")
DIST += ("--total-timesteps", "64", "--measure-burnin", "1")

PAIRS = {
    "ppo_atari_envpool": PPO_ATARI,
    "ppo_continuous_action": PPO_CONT,
    "dqn": DQN,
    "dqn_atari_envpool": DQN_ATARI,
    "sac_continuous_action": OFF_POLICY,
    "td3_continuous_action": OFF_POLICY,
    "r2d2_atari_envpool": R2D2,
}
# (case name, script, flags): eager, twin, twin --compile of every pair; R2D2 on Atari too; the distributed
# script as one process (it is the twin then)
CASES = []
for pair, flags in PAIRS.items():
    CASES += [(pair, pair, flags), (f"{pair}_torchcompile", f"{pair}_torchcompile", flags)]
    CASES += [(f"{pair}_torchcompile --compile", f"{pair}_torchcompile", (*flags, "--compile"))]
CASES += [("r2d2_atari_envpool atari", "r2d2_atari_envpool", R2D2_ATARI)]
CASES += [("ppo_atari_envpool_distributed", "ppo_atari_envpool_distributed", DIST)]


def numbers(script, flags, tmp):
    """What a seeded run computed: the results line's numbers and the return curve."""
    proc, lines = run_script(script, *flags, tmp_path=tmp)
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    rows = (Path(tmp) / line["run_name"] / "returns.csv").read_text().splitlines()[1:]
    curve = [[int(row.split(",")[0]), float(row.split(",")[2])] for row in rows]
    keep = ("status", "steps", "episodes", "mean_return", "losses")
    return {**{key: line[key] for key in keep}, "curve": curve}


def record(names, path=GOLDEN):
    golden = json.loads(path.read_text()) if path.exists() else {}
    for case, script, flags in CASES:
        if names and case not in names and script not in names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            golden[case] = numbers(script, flags, tmp)
        print(case, golden[case]["steps"], golden[case]["episodes"], golden[case]["losses"], flush=True)
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__" and sys.argv[1:2] == ["record"]:
    this_cpu = "--this-cpu" in sys.argv
    record([name for name in sys.argv[2:] if name != "--this-cpu"], cpu_golden() if this_cpu else GOLDEN)
