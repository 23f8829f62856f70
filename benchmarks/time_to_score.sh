#!/usr/bin/env bash
# Time to score in one command: a twin in its fast configuration on Breakout-v5, from launch to CleanRL's 10M-step score
# (PQN 385, PPO 400) or the deadline (benchmarks/time_to_score.py says how; plots/plot.py --time-to-score draws it).
#   benchmarks/time_to_score.sh [--dry-run] OUT [pqn|ppo]   OUT: an empty or new folder; at most 6 files in it
# Ends within 9.5 minutes: the run gets DEADLINE_S (default 530) seconds from its launch, 20 more to write its results
# line once stopped. --dry-run: the CPU smoke at tiny sizes (no --compile/--cudagraphs), under a minute.
# It installs nothing: run it after the README's install (offline: docs/usage.md, "On an offline machine");
# a copy of the tree without .git names its commit: LEANRL_COMMIT=<hash> benchmarks/time_to_score.sh OUT pqn
# OUT: time_to_score.jsonl (the record), <tag>.curve.csv, <tag>.log, <tag>.tar.gz (the run's folder and results line),
# time_to_score.md and time_to_score_<machine>.png (plots/plot.py's table and figure).
set -euo pipefail
cd "$(dirname "$0")/.."
dry=()
[ "${1:-}" != --dry-run ] || { dry=(--dry-run); shift; }
[ $# = 1 ] || [ $# = 2 ] || { echo "usage: benchmarks/time_to_score.sh [--dry-run] OUT [pqn|ppo]" >&2; exit 2; }
case "${2:-pqn}" in
  pqn) script=leanrl/pqn_atari_envpool_torchcompile.py ;;
  ppo) script=leanrl/ppo_atari_envpool_torchcompile.py ;;
  *) echo "time_to_score.sh: the twin is pqn or ppo, not '$2'" >&2; exit 2 ;;
esac
out=$1
[ ! -e "$out" ] || [ -z "$(ls -A "$out")" ] || { echo "time_to_score.sh: $out is not empty" >&2; exit 2; }
py=${PYTHON:-python3}
torch_version=$($py -c 'import torch; print(torch.__version__)') || { echo "time_to_score.sh: no torch" >&2; exit 2; }
case "$torch_version" in
  # torch 2.11's inductor fails an assertion in reorder_loops_by_dep_pair (gpu_session.sh's workaround): loop ordering
  # after fusion off for that release only, in the measured process, never in the scripts; the record lists it
  2.11.*) export TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION=0 ;;
esac
deadline=(--deadline-s "${DEADLINE_S:-530}")
[ ${#dry[@]} = 0 ] || [ -n "${DEADLINE_S:-}" ] || deadline=()  # the dry run's own 30 s
status=0
"$py" benchmarks/time_to_score.py "${dry[@]}" --script "$script" "${deadline[@]}" --archive --out "$out" || status=$?
"$py" plots/plot.py --time-to-score "$out/time_to_score.jsonl" --out "$out" || { [ "$status" != 0 ] || status=1; }
exit "$status"
