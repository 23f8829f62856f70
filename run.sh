#!/usr/bin/env bash
# Reproduce the speed tables: every script pair, every variant, over seeds, then plots/plot.py.
#   ./run.sh                 full budgets, seeds 1 2 3; adds the --cudagraphs variants where CUDA exists
#   ./run.sh --quick         short CPU-friendly budgets, seed 1
# Options: --seeds "1 2"   --only PAIR (e.g. ppo_atari_envpool, or ppo_atari_envpool_distributed)   --timesteps N (every run)
#          --results-dir DIR (default runs)   --no-plot
# Variants per pair: the eager script, then the twin with no flag, --compile, --cudagraphs, both; on a
# machine with several GPUs, the distributed PPO Atari at 1, 2 and all of them.
# A run that fails is recorded in the results file and the table goes on.
set -uo pipefail
cd "$(dirname "$0")"

command="./run.sh $*"
quick=0 seeds="" only="" timesteps="" dir=runs plot=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --seeds) seeds=${2:?}; shift ;;
    --only) only=${2:?}; shift ;;
    --timesteps) timesteps=${2:?}; shift ;;
    --results-dir) dir=${2:?}; shift ;;
    --no-plot) plot=0 ;;
    -h | --help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "run.sh: error: unknown option '$1' (see ./run.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
[ -n "$seeds" ] || { [ "$quick" = 1 ] && seeds="1" || seeds="1 2 3"; }
results="$dir/results.jsonl"
mkdir -p "$dir"
# the commands that wrote into this results dir, one a line (a dir may collect several invocations)
grep -qxF "${command% }" "$dir/command.txt" 2>/dev/null || echo "${command% }" >>"$dir/command.txt"
has_cuda=$($py -c "import torch; print(int(torch.cuda.is_available()))")
# On a small CPU-only machine two torch threads fight the env and each other: one thread is steadier
[ "$has_cuda" = 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# Budgets: --quick is one to two minutes per run on a 2-core CPU (PPO Atari's update of a 1024-frame batch
# takes ~25 s there, so it gets 3 iterations; the replay pairs start learning early and are timed once the
# updates run); full runs are for a GPU machine.
budget() {
  case "$1:$quick" in
    ppo_atari_envpool:1) echo "--total-timesteps 3072 --measure-burnin 1" ;;
    ppo_atari_envpool:0) echo "--total-timesteps 500000" ;;
    ppo_continuous_action:1) echo "--total-timesteps 6144 --measure-burnin 1" ;;
    ppo_continuous_action:0) echo "--total-timesteps 300000" ;;
    dqn:1) echo "--total-timesteps 30000 --measure-burnin 1000" ;;
    dqn:0) echo "--total-timesteps 500000" ;;
    dqn_atari_envpool:1) echo "--total-timesteps 4000 --learning-starts 1000 --buffer-size 10000 --measure-burnin 1100" ;;
    dqn_atari_envpool:0) echo "--total-timesteps 500000" ;;
    sac_continuous_action:1) echo "--total-timesteps 8000 --measure-burnin 200" ;;
    sac_continuous_action:0) echo "--total-timesteps 100000" ;;
    td3_continuous_action:1) echo "--total-timesteps 8000 --learning-starts 5000 --measure-burnin 200" ;;
    td3_continuous_action:0) echo "--total-timesteps 100000" ;;
    # R2D2's Atari update (LSTM 512 unrolled over 120 steps) is hours on a CPU: --quick runs velocity-masked CartPole
    # with the tests' small-task settings, timed once the updates run (learning starts at iteration 250)
    r2d2_atari_envpool:1) echo "--env-id CartPole-v1 --mask-velocity --num-envs 8 --hidden-size 64 --burn-in 8" \
      "--seq-len 16 --overlap 8 --batch-size 32 --train-frequency 16 --learning-rate 1e-3 --gamma 0.99" \
      "--target-network-frequency 200 --buffer-size 40000 --learning-starts 2000 --measure-burnin 300" \
      "--total-timesteps 30000" ;;
    r2d2_atari_envpool:0) echo "--total-timesteps 500000" ;;
    *) echo "" ;;
  esac
}

# One run; if it died without writing its results line, write one saying so.
run() {
  local script=$1 seed=$2; shift 2
  local before after
  before=$(cat "$results" 2>/dev/null | wc -l)
  echo "+ $py leanrl/$script.py $* --seed $seed"
  ${launch:-$py} "leanrl/$script.py" "$@" --seed "$seed" --results-file "$results"
  local code=$?
  after=$(cat "$results" 2>/dev/null | wc -l)
  if [ "$code" != 0 ] && [ "$before" = "$after" ]; then
    $py - "$results" "$script" "$seed" "$code" "$*" <<'PY'
import json, os, platform, sys
import torch
path, script, seed, code, flags = sys.argv[1:]
line = {"script": f"{script}.py", "env_id": None, "seed": int(seed), "compile": "--compile" in flags,
        "cudagraphs": "--cudagraphs" in flags,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cpu": platform.processor(), "cpu_count": os.cpu_count(), "torch": torch.__version__, "steps": 0,
        "sps": None, "wall_s": None, "mean_return": None, "episodes": 0, "status": "error",
        "message": f"exited {code} without a results line", "mode": "train"}
with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")
PY
  fi
  [ "$code" = 0 ] || echo "run.sh: $script seed $seed $* failed (exit $code); going on" >&2
}

for pair in ppo_atari_envpool ppo_continuous_action dqn dqn_atari_envpool sac_continuous_action td3_continuous_action \
  r2d2_atari_envpool; do
  [ -z "$only" ] || [ "$only" = "$pair" ] || continue
  [ -f "leanrl/$pair.py" ] && [ -f "leanrl/${pair}_torchcompile.py" ] || continue
  args=$(budget "$pair")
  [ -z "$timesteps" ] || args="--total-timesteps $timesteps"
  for seed in $seeds; do
    run "$pair" "$seed" $args
    run "${pair}_torchcompile" "$seed" $args
    run "${pair}_torchcompile" "$seed" $args --compile
    if [ "$has_cuda" = 1 ]; then
      run "${pair}_torchcompile" "$seed" $args --cudagraphs
      run "${pair}_torchcompile" "$seed" $args --compile --cudagraphs
    fi
  done
done

# Data-parallel PPO Atari at 1, 2 and all GPUs where more than one exists (8 envs per GPU, as CleanRL's multi-GPU PPO)
n_gpus=$($py -c "import torch; print(torch.cuda.device_count())")
if [ "$n_gpus" -gt 1 ] && { [ -z "$only" ] || [ "$only" = ppo_atari_envpool_distributed ]; }; then
  args=$(budget ppo_atari_envpool)
  [ -z "$timesteps" ] || args="--total-timesteps $timesteps"
  for seed in $seeds; do
    for n in $(printf '%s\n' 1 2 "$n_gpus" | sort -nu); do
      launch="$py -m torch.distributed.run --standalone --nproc-per-node $n" \
        run ppo_atari_envpool_distributed "$seed" $args --local-num-envs 8 --compile --cudagraphs
    done
  done
fi

[ "$plot" = 1 ] && $py plots/plot.py --results "$results"
