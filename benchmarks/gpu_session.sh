#!/usr/bin/env bash
# One GPU session in one command: every pair's eager script and twin, LeanRL's scripts beside them, each env's
# ceiling, recompiles and host syncs, a profile of PPO Atari's twin (benchmarks/gpu_session.py says how).
#   benchmarks/gpu_session.sh [--dry-run] OUT      OUT: an empty or new folder; at most 4 files come back in it
# Ends within 9 minutes on one H100 or H200 (the lanes get 470 s); --dry-run: the same steps on the CPU at tiny
# budgets (no --compile/--cudagraphs) in about 2 minutes. LeanRL's patched scripts: PEER (default .whl/peers/leanrl,
# where ../shared/gpu/kit.sh puts them; PEER=none: ours only).
set -euo pipefail
cd "$(dirname "$0")/.."
dry=()
[ "${1:-}" != --dry-run ] || { dry=(--dry-run); shift; }
[ $# = 1 ] || { echo "usage: benchmarks/gpu_session.sh [--dry-run] OUT" >&2; exit 2; }
py=${PYTHON:-python3}
torch_version=$($py -c 'import torch; print(torch.__version__)') || { echo "gpu_session.sh: no torch" >&2; exit 2; }
case "$torch_version" in
  # torch 2.11's inductor fails an assertion in reorder_loops_by_dep_pair on the SAC and TD3 updates: loop ordering
  # after fusion off for that release only, in every measured process (ours and LeanRL's alike), never in the scripts
  2.11.*) export GPU_SESSION_INDUCTOR='{"loop_ordering_after_fusion": false}' ;;
esac
peer=(--peer "${PEER:-.whl/peers/leanrl}")
[ "${PEER:-}" != none ] || peer=(--no-peer)
exec "$py" benchmarks/gpu_session.py "${dry[@]}" "${peer[@]}" "$1"
