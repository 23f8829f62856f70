#!/usr/bin/env bash
# The peers' venv for `benchmarks/steady.py --peer-sb3 DIR --peer-torchrl DIR`, in one command:
#
#   benchmarks/peers/install.sh DIR        (DIR outside the repository, e.g. ../peers-venv)
#   benchmarks/peers/install.sh --offline WHEELS DIR    (no package index: from the wheels of wheels.txt in WHEELS)
#
# DIR becomes a venv with stable-baselines3 2.9.2, torchrl 0.14.1 and tensordict 0.14.3 (torchrl 0.14 needs
# tensordict < 0.15; ours has 0.15), hydra-core for TorchRL's scripts, ale-py and OpenCV for Atari
# (benchmarks/peers/requirements.txt), and torchvision for TorchRL's Atari scripts (below). Its torch,
# gymnasium, mujoco and numpy are the ones of the python3 that runs this command (the project's venv): a .pth line
# puts that python's site-packages after the venv's own, so both sides run the very same torch build and env code
# and nothing is downloaded twice. TorchRL's sota-implementations (sac, td3, ppo, dqn) are the .py files of the
# torchrl 0.14.1 wheel, copied to DIR/torchrl-sota/<algo>/; the wheel lacks their hydra configs, which are kept here
# (benchmarks/peers/torchrl_configs/, MIT, from pytorch/rl at ae9719f, whose scripts are byte for byte the wheel's).
# pip may warn that leanrl needs tensordict 0.15: it sees the project's metadata through that line, but the peers'
# venv never imports leanrl (the harness runs it with nothing of ours on its path).
# --offline: DIR becomes a plain folder of packages instead (pip install --target, no venv, nothing resolved): the
# wheels of wheels.txt, fetched where there is an index (docs/usage.md); benchmarks/gpu_session.py --peers DIR puts it
# first on the path of the project's python, so the peers get their tensordict and the project's torch and envs.
set -euo pipefail
usage="usage: $0 DIR (a new venv, outside the repository) | $0 --offline WHEELS DIR (a new folder)"
wheels=
if [ "${1:-}" = --offline ]; then
  [ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
  wheels=$2
  shift 2
fi
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
dir=$1
py=${PYTHON:-python3}
[ ! -e "$dir/bin/python" ] && [ ! -e "$dir/torchrl" ] ||
  { echo "install.sh: error: $dir already holds the peers; give a new DIR" >&2; exit 2; }
$py -c "import torch, gymnasium, mujoco" ||
  { echo "install.sh: error: $py lacks torch, gymnasium or mujoco: run it from the project's venv" >&2; exit 2; }

if [ -n "$wheels" ]; then
  ls "$wheels"/*.whl >/dev/null 2>&1 || { echo "install.sh: error: no wheels in $wheels" >&2; exit 2; }
  $py -m pip install -q --no-index --no-deps --no-compile --target "$dir" "$wheels"/*.whl
  site=$dir
  run=(env PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" "$py")
else
  $py -m venv "$dir"
  base=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base" >"$site/project_site.pth"  # torch, gymnasium, mujoco, numpy: the project venv's
  "$dir/bin/python" -m pip install -r "$here/requirements.txt"
  # TorchRL's Atari scripts resize frames with torchvision, built against one torch: the release made with the
  # project's torch 2.13, from the index that torch came from (a CPU build, +cpu, is PyTorch's; PyPI's is CUDA's)
  index=()
  case $($py -c 'import torch; print(torch.__version__)') in
    *+cpu) index=(--index-url https://download.pytorch.org/whl/cpu) ;;
  esac
  "$dir/bin/python" -m pip install "${index[@]}" torchvision==0.28.0
  run=("$dir/bin/python")
fi

mkdir -p "$dir/torchrl-sota"
for algo in sac td3 ppo dqn; do
  cp -r "$site/sota-implementations/$algo" "$dir/torchrl-sota/"
  cp "$here/torchrl_configs/$algo/"*.yaml "$dir/torchrl-sota/$algo/"
done
cp "$here/torchrl_configs/LICENSE" "$dir/torchrl-sota/"
"${run[@]}" - <<'PY'
import ale_py, cv2, gymnasium, stable_baselines3, tensordict, torch, torchrl

print(f"peers: torch {torch.__version__}, gymnasium {gymnasium.__version__}, stable-baselines3 "
      f"{stable_baselines3.__version__}, torchrl {torchrl.__version__}, tensordict {tensordict.__version__}, "
      f"ale-py {ale_py.__version__}, opencv {cv2.__version__}")
PY
