#!/usr/bin/env bash
# The operator and replay benchmarks on a GPU in one command: HPC_RL's operators (bench_rl_operators.py, in three
# parts, merged) and every script's buffers and R2D2's samplers (replay.py), each part under its own time limit; first,
# NCCL once: the distributed PPO as one rank under torchrun, its collectives on NCCL inside the compiled, captured
# update (NCCL_S, default 80 s, 40,960 steps; a dry run: gloo on the CPU).
#   benchmarks/gpu_benchmarks.sh [--dry-run] OUT     OUT: an empty or new folder; at most 7 files in it
# Ends within 9 minutes (PART_S, default 110 s a part, four parts, NCCL_S and the merge). A part that reaches its limit is
# stopped by SIGTERM and writes the rows it measured (its report says so), so a short command still brings figures
# back. --dry-run: the same parts on the CPU at tiny sizes (--quick --no-compile), in about a minute.
# It installs nothing: run it after the README's install (offline: docs/usage.md, "On an offline machine").
# OUT: rl_ops_<tag>.md/.json (the merged operator table), replay_<tag>.md/.json, nccl.jsonl (the distributed run's
# results line), gpu_benchmarks.log; tag: cuda (cpu in a dry run). plots/plot.py --rl-ops / --replay splice the tables into benchmarks/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=()
[ "${1:-}" != --dry-run ] || { dry=(--quick --no-compile --budget 0.02 --device cpu); shift; }
[ $# = 1 ] || { echo "usage: benchmarks/gpu_benchmarks.sh [--dry-run] OUT" >&2; exit 2; }
out=$1
[ ! -e "$out" ] || [ -z "$(ls -A "$out")" ] || { echo "gpu_benchmarks.sh: $out is not empty" >&2; exit 2; }
mkdir -p "$out"
py=${PYTHON:-python3}
torch_version=$($py -c 'import torch; print(torch.__version__)') || { echo "gpu_benchmarks.sh: no torch" >&2; exit 2; }
case "$torch_version" in
  # torch 2.11's inductor fails an assertion in reorder_loops_by_dep_pair (gpu_session.sh's workaround): loop ordering
  # after fusion off for that release only, in the measured processes, never in the scripts
  2.11.*) export TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION=0 ;;
esac
tag=cuda
[ ${#dry[@]} = 0 ] || tag=cpu
gpu=()
[ ${#dry[@]} != 0 ] || gpu=(--device cuda --budget 0.1)
part_s=${PART_S:-110}
parts=$(mktemp -d)
log=$out/gpu_benchmarks.log
status=0
# one rank joins a process group of one (leanrl/ppo_atari_envpool_distributed.py): NCCL on the GPU, gloo in a dry run
nccl=(--backend nccl --compile --cudagraphs --local-num-envs 8 --total-timesteps 40960)
[ ${#dry[@]} = 0 ] || nccl=(--no-cuda --backend gloo --local-num-envs 2 --num-steps 16 --total-timesteps 64)
timeout -s TERM "${NCCL_S:-80}" "$py" -m torch.distributed.run --standalone --nproc-per-node 1 \
  leanrl/ppo_atari_envpool_distributed.py "${nccl[@]}" --results-file "$parts/nccl/results.jsonl" >>"$log" 2>&1 \
  || status=$?
cp "$parts/nccl/results.jsonl" "$out/nccl.jsonl" 2>/dev/null || status=1
# the operators in the parts benchmarks/README.md lists; each part a process, stopped by SIGTERM at its limit
ops=(gae,td_lambda,vtrace_returns,upgo_returns vtrace,upgo qntd,qntd_rescale,dntd,ppo,lstm,scatter)
for i in 0 1 2; do
  timeout -s TERM "$part_s" "$py" benchmarks/bench_rl_operators.py "${gpu[@]}" "${dry[@]}" --reps 30 \
    --ops "${ops[$i]}" --out "$parts" --tag "${tag}_part$((i + 1))" >>"$log" 2>&1 || status=$?
done
"$py" benchmarks/bench_rl_operators.py --merge "$parts"/rl_ops_"${tag}"_part*.json --out "$out" --tag "$tag" \
  >>"$log" 2>&1 || status=$?
timeout -s TERM "$part_s" "$py" benchmarks/replay.py "${gpu[@]}" "${dry[@]}" --out "$out" --tag "$tag" \
  >>"$log" 2>&1 || status=$?
rm -rf "$parts"
ls "$out"
exit "$status"
