#!/usr/bin/env bash
# Reproduce the speed and returns tables: every script pair, every variant, over seeds, then plots/plot.py.
#   ./run.sh                 speed at full budgets, seeds 1 2 3; adds the --cudagraphs variants where CUDA exists
#   ./run.sh --quick         speed at short CPU-friendly budgets, seed 1
#   ./run.sh --learning      returns at full budget: each pair's eager script and its fastest twin (--compile, and
#                            --cudagraphs where CUDA exists), seeds 1 2 3 (budgets below)
#   ./run.sh --steady        steady-state speed with benchmarks/steady.py: each pair's eager script and twin --compile
#                            at the --quick budgets (PPO's longer), pinned to one core, cold compile caches, 3 rounds
#                            (steady.md: steps per CPU-second, warm-up = compile time); --base DIR runs a checkout of
#                            an older commit (a git worktree) in turn with this one and adds the ratios; --peer DIR
#                            runs LeanRL's scripts (DIR/leanrl/<script>.py, patched to run on today's libraries: see
#                            docs/cpu-speed.md) as one more side at the same budgets and adds the ratio ours/peer
#                            (LeanRL has no dqn_atari_envpool or r2d2_atari_envpool: those rows are ours alone);
#                            --peers VENV adds SB3 and TorchRL's sota-implementations (a venv made by
#                            benchmarks/peers/install.sh VENV) as two more sides for the pairs they share (SAC, TD3,
#                            PPO continuous, DQN, PPO and DQN on Atari), TorchRL with its compile option as ours, and
#                            the ratios ours/each
# Options: --only "PAIR ..."   --seeds "1 2"   --timesteps N (replaces every run's --total-timesteps)
#          --extra "FLAGS" (added to every run)   --results-dir DIR (default: a new folder for each invocation,
#          runs/speed-<UTC time>, runs/learning-..., runs/steady-...: its tables hold exactly this command's runs;
#          a DIR you name collects every invocation you point at it, listed in DIR/command.txt)
#          --no-plot   --publish   --rounds K (--steady)   --base DIR, --peer DIR, --peers VENV (--steady; relative
#          paths from this clone)
# Fast configurations: the PQN and PPO Atari twins' FAST_FLAGS (flags only; their --help and docs/usage.md show
# them). The runs here keep CleanRL's defaults (the eager scripts lack --async-envs and --env-threads, so --extra
# cannot carry them); benchmarks/time_to_score.sh runs a twin in its fast configuration to CleanRL's score.
# Pairs: ppo ppo_atari_envpool ppo_continuous_action dqn dqn_atari_envpool sac_continuous_action
#        td3_continuous_action r2d2_atari_envpool pqn pqn_atari_envpool; and ppo_atari_envpool_distributed (speed
#        only, several GPUs).
# Speed variants per pair: the eager script, then the twin with no flag, --compile, --cudagraphs, both; on a machine
# with several GPUs, the distributed PPO Atari at 1, 2 and all of them. A failed run is recorded and the table goes on.
# Output, all in DIR: results.jsonl, the run folders, command.txt, and from plots/plot.py speed.md (--learning:
# returns.md, the returns beside CleanRL's published ones) and the PNGs. Nothing in the repository changes:
# --publish is what splices the table into README.md and copies it and its PNGs into plots/. To publish results
# already measured: python3 plots/plot.py --results DIR/results.jsonl [--learning [--part NAME]] --publish (--part: a
# returns table of its own beside the main one)
# --learning budgets on a CPU: CleanRL's full budgets where a CPU finishes them, ppo_continuous_action HalfCheetah-v4
# 1M steps (an hour for its 6 runs on a 2-core CPU), ppo/dqn/pqn CartPole-v1 500k (dqn: about 15 minutes); the others at
# the longest budget whose 6 runs fit about an hour on a 2-core CPU (estimated from the --quick table's steps/s):
# ppo_atari_envpool and pqn_atari_envpool Breakout-v5 130k, sac_continuous_action HalfCheetah-v4 45k,
# td3_continuous_action HalfCheetah-v4 80k, dqn_atari_envpool Breakout-v5 50k (learning from 10k, replay of 100k),
# r2d2_atari_envpool on velocity-masked CartPole-v1 with the --quick small-task settings 700k. With CUDA every pair
# runs CleanRL's full budget (Atari 10M, MuJoCo 1M, DQN CartPole 500k; R2D2 Pong-v5 4M).
set -uo pipefail
cd "$(dirname "$0")"

PAIRS="ppo ppo_atari_envpool ppo_continuous_action dqn dqn_atari_envpool sac_continuous_action td3_continuous_action"
PAIRS="$PAIRS r2d2_atari_envpool"
PAIRS="$PAIRS pqn pqn_atari_envpool"
DISTRIBUTED=ppo_atari_envpool_distributed
die() { echo "run.sh: error: $*" >&2; exit 2; }

command="./run.sh"  # as typed, quoted where needed: the tables name the command that measured them
for arg in "$@"; do command+=" $(printf '%q' "$arg")"; done
mode=speed quick=0 seeds="" only="" timesteps="" extra="" dir="" dir_given="" plot=1 publish=0 steady=0 rounds="" base="" peer="" peers=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds | --only | --timesteps | --extra | --results-dir | --rounds | --base | --peer | --peers)
      [ $# -ge 2 ] || die "$1 needs a value" ;;
  esac
  case "$1" in
    --quick) quick=1 ;;
    --learning) mode=learning ;;
    --steady) steady=1 ;;
    --rounds) rounds=$2; shift ;;
    --base) base=$2; shift ;;
    --peer) peer=$2; shift ;;
    --peers) peers=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    --only) only=$2; shift ;;
    --timesteps) timesteps=$2; shift ;;
    --extra) extra=$2; shift ;;
    --results-dir) dir=$2; dir_given=1; shift ;;
    --no-plot) plot=0 ;;
    --publish) publish=1 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see ./run.sh --help)" ;;
  esac
  shift
done
# Check everything before anything is created or run: a typo gets one line and exit code 2, not an empty folder
valid="$PAIRS"
[ "$mode" = learning ] || [ "$steady" = 1 ] || valid="$valid $DISTRIBUTED"
for one in $only; do
  printf '%s\n' $valid | grep -qxF -- "$one" ||
    die "--only '$one' is not a pair$([ "$mode" = speed ] || echo " of --learning"); valid pairs: $valid"
done
chosen() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }  # --only "PAIR ...": these pairs alone
[ "$mode:$quick" != learning:1 ] || die "--quick and --learning are two different runs: give one"
[ "$plot:$publish" != 0:1 ] || die "--publish needs the plots: drop --no-plot"
[ "$mode:$steady" != learning:1 ] || die "--steady and --learning are two different runs: give one"
[ -z "$rounds$base$peer" ] || [ "$steady" = 1 ] || die "--rounds, --base and --peer go with --steady"
[ -z "$rounds" ] || [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
[ -z "$base" ] || [ -d "$base/leanrl" ] || die "--base $base is not a leanrl checkout (no leanrl/ folder)"
[ -z "$peers" ] || [ "$steady" = 1 ] || die "--peers goes with --steady"
[ -z "$peers" ] || [ -x "$peers/bin/python" ] || die "--peers $peers is not a venv made by benchmarks/peers/install.sh"
[ -z "$peer" ] || [ -d "$peer/leanrl" ] || die "--peer $peer has no leanrl/ folder of LeanRL's scripts (leanrl/<script>.py)"
[ -z "$timesteps" ] || [[ "$timesteps" =~ ^[1-9][0-9]*$ ]] || die "--timesteps must be a positive integer, got '$timesteps'"
for seed in $seeds; do [[ "$seed" =~ ^[0-9]+$ ]] || die "--seeds takes integers, got '$seed'"; done
[ -n "$seeds" ] || { [ "$quick" = 1 ] && seeds="1" || seeds="1 2 3"; }
# A table holds exactly the runs of the command that made it: by default each invocation gets a new folder (a script
# run by hand appends to runs/results.jsonl, which no table reads); a --results-dir you name collects every
# invocation you point at it, and command.txt there lists them
stamp=$(date -u +%Y%m%d-%H%M%S)
[ "$steady" = 0 ] || { quick=1; [ -n "$dir" ] || dir=runs/steady-$stamp; }
[ -n "$dir" ] || { [ "$mode" = learning ] && dir=runs/learning-$stamp || dir=runs/speed-$stamp; }
n=2
while [ -z "$dir_given" ] && [ -e "$dir" ]; do dir="${dir%-[0-9]}-$n"; n=$((n + 1)); done  # two in one second

py=${PYTHON:-python3}
# the scripts import the leanrl package: a clone that skipped `pip install -e .` runs too
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
results="$dir/results.jsonl"
mkdir -p "$dir"
# the commands that wrote into this results dir, one a line (a dir may collect several invocations)
grep -qxF "$command" "$dir/command.txt" 2>/dev/null || echo "$command" >>"$dir/command.txt"
has_cuda=$($py -c "import torch; print(int(torch.cuda.is_available()))")
# On a small CPU-only machine two torch threads fight the env and each other: one thread is steadier
[ "$has_cuda" = 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# R2D2's Atari update (LSTM 512 unrolled over 120 steps) is hours on a CPU: on a CPU it runs velocity-masked CartPole
# with the tests' small-task settings, timed once the updates run (learning starts at iteration 250)
R2D2_CARTPOLE="--env-id CartPole-v1 --mask-velocity --num-envs 8 --hidden-size 64 --burn-in 8 --seq-len 16 --overlap 8"
R2D2_CARTPOLE="$R2D2_CARTPOLE --batch-size 32 --train-frequency 16 --learning-rate 1e-3 --gamma 0.99"
R2D2_CARTPOLE="$R2D2_CARTPOLE --target-network-frequency 200 --buffer-size 40000 --learning-starts 2000"

# Budgets. --quick: one to two minutes per run on a 2-core CPU (a PPO Atari iteration of 1,024 frames takes 4-8 s on
# the 2-core EPYC, so it gets 3 iterations; the replay pairs start learning early and are timed once the updates
# run); full speed runs are for a GPU machine. --learning: see --help (the CPU figures are estimates from the --quick
# table).
budget() {
  local kind=$mode
  [ "$quick" = 0 ] || kind=quick
  # --steady: the --quick budgets, but PPO's leave 2 iterations after the burn-in, too few to resolve 10% (PPO
  # Atari's twin read 0.70x LeanRL's in one round, 1.09x over three): 11 and 19 steady iterations
  if [ "$steady" = 1 ]; then
    case "$1" in
      ppo_atari_envpool | pqn_atari_envpool) echo "--total-timesteps 12288 --measure-burnin 1" && return ;;
      ppo_continuous_action) echo "--total-timesteps 40960 --measure-burnin 1" && return ;;
    esac
  fi
  [ "$kind" != learning ] || [ "$has_cuda" = 0 ] || kind=learning-cuda
  case "$1:$kind" in
    ppo:quick) echo "--total-timesteps 30720 --measure-burnin 10" ;;
    ppo:speed | ppo:learning*) echo "--total-timesteps 500000" ;;
    ppo_atari_envpool:quick) echo "--total-timesteps 3072 --measure-burnin 1" ;;
    ppo_atari_envpool:speed) echo "--total-timesteps 500000" ;;
    ppo_atari_envpool:learning) echo "--total-timesteps 130000" ;;
    ppo_continuous_action:quick) echo "--total-timesteps 6144 --measure-burnin 1" ;;
    ppo_continuous_action:speed) echo "--total-timesteps 300000" ;;
    ppo_continuous_action:learning*) echo "--total-timesteps 1000000" ;;
    dqn:quick) echo "--total-timesteps 30000 --measure-burnin 1000" ;;
    dqn:speed | dqn:learning*) echo "--total-timesteps 500000" ;;
    pqn:quick) echo "--total-timesteps 30720 --measure-burnin 10" ;;
    pqn:speed | pqn:learning*) echo "--total-timesteps 500000" ;;
    dqn_atari_envpool:quick) echo "--total-timesteps 4000 --learning-starts 1000 --buffer-size 10000 --measure-burnin 1100" ;;
    dqn_atari_envpool:speed) echo "--total-timesteps 500000" ;;
    dqn_atari_envpool:learning) echo "--total-timesteps 50000 --learning-starts 10000 --buffer-size 100000" ;;
    sac_continuous_action:quick) echo "--total-timesteps 8000 --measure-burnin 200" ;;
    sac_continuous_action:speed) echo "--total-timesteps 100000" ;;
    sac_continuous_action:learning) echo "--total-timesteps 45000" ;;
    td3_continuous_action:quick) echo "--total-timesteps 8000 --learning-starts 5000 --measure-burnin 200" ;;
    td3_continuous_action:speed) echo "--total-timesteps 100000" ;;
    td3_continuous_action:learning) echo "--total-timesteps 80000" ;;
    r2d2_atari_envpool:quick) echo "$R2D2_CARTPOLE --measure-burnin 300 --total-timesteps 30000" ;;
    r2d2_atari_envpool:speed) echo "--total-timesteps 500000" ;;
    r2d2_atari_envpool:learning) echo "$R2D2_CARTPOLE --total-timesteps 700000" ;;
    r2d2_atari_envpool:learning-cuda) echo "--env-id Pong-v5 --total-timesteps 4000000" ;;
    sac_continuous_action:learning-cuda | td3_continuous_action:learning-cuda) echo "--total-timesteps 1000000" ;;
    ppo_atari_envpool:learning-cuda | dqn_atari_envpool:learning-cuda) echo "--total-timesteps 10000000" ;;
    pqn_atari_envpool:quick) echo "--total-timesteps 3072 --measure-burnin 1" ;;
    pqn_atari_envpool:speed) echo "--total-timesteps 500000" ;;
    pqn_atari_envpool:learning) echo "--total-timesteps 130000" ;;
    pqn_atari_envpool:learning-cuda) echo "--total-timesteps 10000000" ;;
    *) echo "" ;;
  esac
}
flags_for() {
  local args
  args=$(budget "$1")
  if [ -n "$timesteps" ]; then
    case " $args " in
      *" --total-timesteps "*) args=$(echo "$args" | sed -E "s/--total-timesteps [0-9]+/--total-timesteps $timesteps/") ;;
      *) args="$args --total-timesteps $timesteps" ;;
    esac
  fi
  echo "$args $extra"
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

# --steady: the harness runs each pair's eager script and twin --compile in turn on each side, then exits here
if [ "$steady" = 1 ]; then
  jobs=()
  for pair in $PAIRS; do
    chosen "$pair" || continue
    args=$(flags_for "$pair")
    jobs+=(--run "leanrl/$pair.py $args" --run "leanrl/${pair}_torchcompile.py $args --compile")
  done
  sides=(--side "new=$PWD")
  [ -z "$base" ] || sides=(--side "base=$base" "${sides[@]}")
  [ -z "$peer" ] || sides+=(--peer "$peer")  # measured after ours in each round, at the same budgets
  [ -z "$peers" ] || sides+=(--peer-sb3 "$peers" --peer-torchrl "$peers")
  core=$($py -c "import os; print(max(os.sched_getaffinity(0)))")  # the last core this shell may use
  $py benchmarks/steady.py "${sides[@]}" "${jobs[@]}" --rounds "${rounds:-3}" --cpu "$core" --cold --out "$dir" \
    --command "$command"
  code=$?  # 1: some run failed, and the table says which
  # --publish: a table of every script the published one has replaces it; one of some of them (--only) goes beside
  # it in benchmarks/results, its rows replacing theirs in the README's cut (plot.py --steady-publish)
  if [ "$publish" = 1 ] && [ "$code" -le 1 ]; then
    $py plots/plot.py --steady-publish "$dir/steady.md"
  fi
  exit $code
fi

fastest="--compile"
[ "$has_cuda" = 0 ] || fastest="--compile --cudagraphs"
for pair in $PAIRS; do
  chosen "$pair" || continue
  [ -f "leanrl/$pair.py" ] && [ -f "leanrl/${pair}_torchcompile.py" ] || continue
  args=$(flags_for "$pair")
  for seed in $seeds; do
    run "$pair" "$seed" $args
    if [ "$mode" = learning ]; then
      run "${pair}_torchcompile" "$seed" $args $fastest
      continue
    fi
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
if [ "$mode" = speed ] && [ "$n_gpus" -gt 1 ] && chosen "$DISTRIBUTED"; then
  args=$(flags_for ppo_atari_envpool)
  for seed in $seeds; do
    for n in $(printf '%s\n' 1 2 "$n_gpus" | sort -nu); do
      launch="$py -m torch.distributed.run --standalone --nproc-per-node $n" \
        run "$DISTRIBUTED" "$seed" $args --local-num-envs 8 --compile --cudagraphs
    done
  done
fi

if [ "$plot" = 1 ]; then
  plot_flags=()
  [ "$mode" = speed ] || plot_flags+=(--learning)
  [ "$publish" = 0 ] || plot_flags+=(--publish)
  $py plots/plot.py --results "$results" --out "$dir" "${plot_flags[@]}"
fi
