#!/usr/bin/env bash
# One GPU session in one command: every pair's eager script and twin, LeanRL's scripts beside them, each env's
# ceiling, recompiles and host syncs, a profile of PPO Atari's twin (benchmarks/gpu_session.py says how).
#   benchmarks/gpu_session.sh [--dry-run] [--rounds] [--alone] [--fast] [--peers] OUT   OUT: an empty or new folder
# Ends within 9 minutes on one H100 or H200 (the runs get 470 s; one still warming up then is stopped and recorded).
# --rounds, instead of the lanes: the ratios that hold, each pair's twin and LeanRL's at the same moment on equal
#   cores, then swapped; three slots side by side (PPO Atari then DQN on 4+4 cores, PPO continuous on 2+2, SAC then TD3
#   on 2+2); the archived runs' warm-ups say about 6 minutes, the longest slot LeanRL's PPO continuous (~3 min a round).
# --alone: first PPO Atari's twin at 8 envs alone on the machine, after the env's ceiling on the same cores (~1.5 min);
#   with --rounds the rounds follow in the time left (the slowest pair may then lose its second round), else nothing.
# --fast: PQN Atari's twin in its fast configuration (time_to_score.py's run: 128 envs, --async-envs, every core)
#   alone, after envpool's ceiling at 128 envs, profiled (profile.md: env, policy, update, GPU busy); not yet timed on
#   a GPU (a cold compile, a 20 s window, 10 profiled iterations: an estimate of 2-3 minutes); after --alone's run.
# --peers, a call of its own: SB3's and TorchRL's runs beside ours (SAC, TD3, PPO continuous, DQN), TorchRL with its
#   compile options off, compile, compile and cudagraphs; eight lanes of 2 cores. PEERS: a venv made by
#   benchmarks/peers/install.sh or the folder of its --offline mode (default .whl/peers/site, docs/usage.md's offline
#   install).
# --dry-run: the same steps on the CPU at tiny budgets (no --compile/--cudagraphs), about 2 minutes (rounds: 40 s a
#   pair; --peers: about a minute).
# LeanRL's patched scripts: PEER, a folder with leanrl/<script>.py patched as docs/cpu-speed.md says (default
# .whl/peers/leanrl, beside the wheels of docs/usage.md's offline install; PEER=none: ours only, not with --rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
flags=()
while [ $# -gt 1 ]; do
  case "$1" in
    --dry-run | --rounds | --alone | --fast) flags+=("$1"); shift ;;
    --peers) flags+=(--peers "${PEERS:-.whl/peers/site}"); shift ;;
    *) break ;;
  esac
done
usage="usage: benchmarks/gpu_session.sh [--dry-run] [--rounds] [--alone] [--fast] [--peers] OUT"
[ $# = 1 ] && [ "${1#--}" = "$1" ] || { echo "$usage" >&2; exit 2; }
py=${PYTHON:-python3}
torch_version=$($py -c 'import torch; print(torch.__version__)') || { echo "gpu_session.sh: no torch" >&2; exit 2; }
case "$torch_version" in
  # torch 2.11's inductor fails an assertion in reorder_loops_by_dep_pair on the SAC and TD3 updates: loop ordering
  # after fusion off for that release only, in every measured process (ours and LeanRL's alike), never in the scripts
  2.11.*) export GPU_SESSION_INDUCTOR='{"loop_ordering_after_fusion": false}' ;;
esac
peer=(--peer "${PEER:-.whl/peers/leanrl}")
[ "${PEER:-}" != none ] || peer=(--no-peer)
exec "$py" benchmarks/gpu_session.py "${flags[@]}" "${peer[@]}" "$1"
