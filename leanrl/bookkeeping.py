"""Run bookkeeping shared by every script. Nothing of RL lives here: the algorithms are in the scripts, one file each.

What is here: flag and env-family checks (one clear line, exit code 2), the results line (strict JSON with the
hardware and the commit it ran on), the return curve `returns.csv`, the steps/s meter, the progress bar, the end-of-run
summary line, divergence/interrupt/error handling (Ctrl-C and a scheduler's SIGTERM alike), atomic checkpoints, the
training state a stopped run goes on from (`--resume`), the episode loop of `--eval-checkpoint` and what
`--capture-video` needs.
"""

import importlib.util
import itertools
import json
import math
import os
import pickle
import platform
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import tqdm


class Diverged(Exception):
    """A loss became NaN or infinite: the run stops with status "diverged"."""


def fail(script, message):
    """Bad input: one line on stderr naming the flag, exit code 2, no traceback and no results line."""
    print(f"{Path(script).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- flag checks


def check_flags(script, args, positive=()):
    """The checks every script shares; the flags named in `positive` must be > 0. Also drops known warnings."""
    warnings.filterwarnings("ignore", message=".*is out of date", category=DeprecationWarning)  # CleanRL's -v4 envs
    if getattr(args, "resume", None) is not None:  # first: the flags the run was started with are the ones checked
        resume_args(script, args)
    if getattr(args, "checkpoint_every_min", 0) < 0:
        fail(script, f"--checkpoint-every-min must not be negative, got {args.checkpoint_every_min}")
    if getattr(args, "cudagraphs", False) and not (args.cuda and torch.cuda.is_available()):
        fail(script, "--cudagraphs needs CUDA, and none is available")
    if args.measure_burnin < 0:
        fail(script, f"--measure-burnin must not be negative, got {args.measure_burnin}")
    check_results_file(script, args.results_file)
    if args.eval_checkpoint is not None:
        if not Path(args.eval_checkpoint).is_file():
            fail(script, f"--eval-checkpoint {args.eval_checkpoint}: no such file")
        if args.eval_episodes <= 0:
            fail(script, f"--eval-episodes must be positive, got {args.eval_episodes}")
        return
    for name, value in vars(args).items():
        rate = name.endswith(("learning_rate", "_lr")) and not isinstance(value, bool)  # not --anneal-lr's switch
        if (name in positive or rate) and value is not None and not value > 0:
            fail(script, f"--{name.replace('_', '-')} must be positive, got {value}")


def check_results_file(script, results_file):
    """--results-file must name a file we can append to (checked without creating anything)."""
    path = Path(results_file)
    if path.is_dir():
        fail(script, f"--results-file {results_file} is a folder, not a file")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        fail(script, f"--results-file {results_file}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(script, f"--results-file {results_file} is not writable")


def looks_like_atari(env_id):
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id or env_id.endswith("-v5")


def check_gym_env(script, env_id, action_space, example):
    """A gymnasium env with vector observations and `action_space` actions (gym.spaces.Box or Discrete)."""
    import gymnasium as gym

    wanted = "continuous (Box)" if action_space is gym.spaces.Box else "discrete"
    try:
        gym.spec(env_id)
    except gym.error.Error:
        if looks_like_atari(env_id):
            fail(script, f"--env-id {env_id} looks like an Atari id, the wrong family: this script needs {example}")
        fail(script, f"--env-id {env_id} is not a registered gymnasium env (try {example})")
    try:
        with mujoco_warning_dropped():
            env = gym.make(env_id)
    except Exception as err:
        fail(script, f"--env-id {env_id} could not be made: {type(err).__name__}: {err}".splitlines()[0])
    actions, observations = env.action_space, env.observation_space
    env.close()
    if not isinstance(actions, action_space):
        fail(script, f"--env-id {env_id} has {type(actions).__name__} actions, the wrong family: it needs {wanted} "
             f"actions, such as {example}")  # fmt: skip
    if isinstance(observations, gym.spaces.Box) and len(observations.shape) > 1:
        fail(script, f"--env-id {env_id} has image-like {observations.shape} observations, the wrong family: its MLP "
             f"needs vector observations, such as {example}'s")  # fmt: skip


def check_atari_env(script, env_id):
    """An envpool Atari game: stacked 84x84 uint8 frames and discrete actions."""
    import envpool
    import gymnasium as gym

    if env_id not in envpool.list_all_envs():
        fail(script, f"--env-id {env_id!r} is not an envpool task (Atari games look like 'Breakout-v5')")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium's notes on other families' spaces
            spec = envpool.make_spec(env_id)
            obs_space, act_space = spec.observation_space, spec.action_space  # the spaces warn as they are made
        is_atari = obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
        is_atari = is_atari and isinstance(act_space, gym.spaces.Discrete)
    except Exception:
        is_atari = False
    if not is_atari:
        fail(script, f"--env-id {env_id!r} is not an Atari game; this script needs stacked 84x84 frames and discrete "
             "actions")  # fmt: skip


# one frame rendered in a child process: a missing GL backend fails there (MuJoCo may even crash), not mid-run
RENDER_PROBE = """
import os, sys, gymnasium as gym
try:
    env = gym.make(sys.argv[1], render_mode="rgb_array")
    env.reset(seed=0)
    assert env.render() is not None, "render() returned no frame"
except Exception as err:
    print(f"{type(err).__name__}: {err}".splitlines()[0])
    os._exit(1)  # skips the half-made renderer's noisy __del__
"""


def check_video(script, env_id):
    """--capture-video: what gymnasium's RecordVideo and the env's frames need, checked before any training.

    RecordVideo writes mp4 files with moviepy; classic-control and Box2D envs draw with pygame; MuJoCo draws with
    OpenGL, which a machine without a display has only through MUJOCO_GL=egl (or osmesa)."""
    import gymnasium as gym

    entry_point = str(gym.spec(env_id).entry_point)
    needed = ["moviepy"] + ["pygame"] * ("classic_control" in entry_point or "box2d" in entry_point)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        fail(script, f"--capture-video needs {' and '.join(missing)}, not installed: pip install {' '.join(missing)}")
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # pygame draws the frames off screen: with no display, SDL would try Wayland first and print an error
        # ("XDG_RUNTIME_DIR is invalid") on a run that films fine
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    probe = subprocess.run([sys.executable, "-c", RENDER_PROBE, env_id], capture_output=True, text=True)
    if probe.returncode != 0:
        hint = "; without a display, set MUJOCO_GL=egl (or osmesa)" if "mujoco" in entry_point else ""
        reason = (probe.stdout.strip() or probe.stderr.strip() or f"exit code {probe.returncode}").splitlines()[-1]
        fail(script, f"--capture-video: {env_id} renders no frame ({reason}){hint}")


def check_memory(script, flag, nbytes, device):
    """Refuse a store that cannot fit: `nbytes` against the free memory of `device`."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:  # what Linux can give without swapping: free pages plus the page cache it can drop
            meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
            free = int(meminfo["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return
    if nbytes > free:
        fail(script, f"{flag}: the store needs {nbytes / 2**30:.1f} GiB, {device.type} has {free / 2**30:.1f} GiB "
             "free")  # fmt: skip


@contextmanager
def mujoco_warning_dropped():
    """Drop MuJoCo's 'settotalmass' deprecation warning, and only while an env is made.

    gymnasium's -v4 MuJoCo models (HalfCheetah's half_cheetah.xml) set <compiler settotalmass=...>, which MuJoCo 4
    deprecates: each env made prints the warning on stderr (and writes MUJOCO_LOG.TXT). It comes from C through
    MuJoCo's warning callback, not Python's `warnings`; any other MuJoCo warning is printed as MuJoCo does.
    """
    try:
        import mujoco
    except ImportError:  # an env that needs no MuJoCo
        yield
        return
    previous = mujoco.get_mju_user_warning()

    def handler(msg):
        if "'settotalmass' is deprecated" in msg:
            return
        if previous is not None:
            previous(msg)
        else:
            print(f"WARNING: {msg}", file=sys.stderr)

    mujoco.set_mju_user_warning(handler)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


# ---------------------------------------------------------------- episodes: what counts as a return
# This is RL, not bookkeeping, kept once because every script of a family counts the same way: a gymnasium episode's
# return is RecordEpisodeStatistics' (before any reward normalisation or clipping); an Atari return is a whole game's
# raw score, summed from envpool's unclipped rewards, though every lost life ends an episode for learning.


def gym_episodes(infos):
    """(return, length) of each episode that ended in this step of a gymnasium vector env (SAME_STEP autoreset)."""
    final = infos.get("final_info", {})
    if "episode" not in final:
        return []
    ended = np.flatnonzero(final["_episode"])
    return [(float(final["episode"]["r"][i]), int(final["episode"]["l"][i])) for i in ended]


def game_returns(running_returns, raw_rewards, game_over):
    """Add this step's raw (unclipped) rewards per env; return the scores of the games that just ended, reset those.

    envpool's episodic_life makes every lost life an episode for learning; a score is the return of a whole game.
    """
    running_returns += raw_rewards
    finished = running_returns[game_over].tolist()
    running_returns[game_over] = 0.0
    return finished


# ---------------------------------------------------------------- checkpoints


def atomic_save(obj, path):
    """torch.save(obj, path) atomically: a temporary file, on disk, then a rename, so a reader never sees half of it and
    a process killed while writing (kill -9, a node lost) leaves the previous file whole."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(path, args, **state):
    """Write {"args": ..., **state} atomically (atomic_save)."""
    atomic_save({"args": asdict(args), **state}, path)
    print(f"model saved to {path}")


def load_checkpoint(script, path, *keys):
    """A checkpoint written by save_checkpoint, on the CPU; exit 2 if it is not one of this script's (lacks `keys`)."""
    try:
        checkpoint = load_data(path)
        missing = [key for key in ("args", *keys) if key not in checkpoint]
    except DataOnly as err:
        fail(script, f"--eval-checkpoint {path}: {err}")
    except Exception as err:
        missing = [type(err).__name__]
    if missing:
        fail(script, f"--eval-checkpoint {path} is not a checkpoint of this script (no {', '.join(missing)})")
    return checkpoint


# ---------------------------------------------------------------- a stopped run goes on
# How a script makes its run resumable (DQN's lines; every script names its own state the same way):
#
#     class Args(bk.StopAndResume):  # --resume, --checkpoint-every-min, --save-replay / --no-save-replay
#     ...
#     with bk.Run(__file__, args, device) as run:
#         ...  # envs, networks, optimizers, replay memory, compiled and captured functions: built as in a new run
#         run.state = lambda: dict(q_network=q_network, target_network=target_network, optimizer=optimizer,
#                                  global_step=global_step, stats=stats, envs=(envs, obs), replay=(buffer, count))
#         global_step, stats, (_, obs), (_, count) = run.resume("global_step", "stats", "envs", "replay")
#         for iteration in run.progress(range(num_iterations)):  # a resumed run starts at the first iteration not done
#
# - `run.state`: a function that returns the training state by name, called when the state is written (the lambda
#   reads the script's variables as they are then). What a name may hold: an nn.Module or an optimizer (their
#   state_dicts), a tensor or a numpy array (restored in place, so views of it, a compiled or captured function's
#   inputs, stay valid), a dict, tuple or list of these (an empty one: a value the script rebinds), a number, a
#   gymnasium vector env (its sub-envs' state as data, MuJoCo's physics included: the episodes under way go on). Two
#   names have a meaning: `envs`, the vector env with what belongs to its episodes (the last obs, an LSTM state,
#   running game scores), restored all together or, where the envs cannot be saved (envpool's games), not at all:
#   the resumed run then starts new episodes from its own reset; and `replay`, the replay memory with its fill
#   count, priorities or stored states, which --no-save-replay leaves out (the resumed run starts from an empty
#   memory and the values the script made).
# - `run.resume(*names)`: with --resume, restores every named part (modules, optimizers, arrays and envs in place),
#   then the RNGs (Python's `random`, numpy's, torch's CPU and CUDA ones) and returns the saved values of `names` (as
#   operator.itemgetter: one value for one name); without it, returns their values now, so a new run passes through.
#   Call it once everything is built and warmed up, right before the loop: what draws random numbers before it (the
#   networks' init, a reset) is undone by the RNG states it restores.
# - Run writes the state into the run folder (`run.state_path`, state.pt) atomically, at an iteration's end, i.e.
#   where the loop of `run.progress` asks for its next iteration: when SIGTERM or Ctrl-C came during the iteration
#   (the run then ends "interrupted", its results line written as before; a second signal before the iteration's end
#   stops the run at once and writes no state, one while the state is written is not acted on), every
#   --checkpoint-every-min minutes, and at the loop's end with --save-model (or in a run that has written a state
#   before, or resumed from one, so that the folder's state is always the latest). The ranks of a distributed run
#   (`deferred_stop`) agree on the iterations where it is written: every rank calls `run.state()` there, which may
#   gather from the others, and rank 0 alone writes the file.
# - `--resume PATH` (a run folder or its state file): check_flags reads the state first, so that every check sees the
#   flags the run was started with; a flag left at its default takes the saved value (so one given at its default
#   does too); a flag given with another value is refused unless it is in MAY_CHANGE (--total-timesteps may be
#   raised, --compile switched on, the results go to another file). The run keeps its name and folder (the
#   folder that holds the state file), appends to its returns.csv (rows after the state's last episode, written
#   before a kill -9, are dropped), and writes one results line at its end that counts the steps, episodes and wall
#   time of every part, with `resumed`, the number of resumes. steps/s leaves out --measure-burnin iterations again
#   after a resume (a twin compiles and captures again there). A run already at its total prints one line, exit 0.
# - A state file is data: tensors, numbers, strings and containers of them, read by torch's weights-only load, the
#   envs restored by writing values into the envs the resumed run built. A file that holds anything else (a pickled
#   object or function, which a plain load would call) is refused, exit 2, and nothing in it runs.

STATE_FILE = "state.pt"
STATE_FORMAT = "leanrl training state 2"  # data only: loading one runs nothing from the file
OLD_STATE_FORMAT = "leanrl training state 1"  # its envs were a pickle
# flags a resumed run may be given with new values: they change neither the algorithm nor a shape (a speed trick, the
# budget, where and what is written)
MAY_CHANGE = {
    "resume", "checkpoint_every_min", "save_replay", "save_model", "total_timesteps", "track", "wandb_project_name",
    "wandb_entity", "results_file", "measure_burnin", "cuda", "compile", "cudagraphs", "capture_video",
    "torch_deterministic", "eval_checkpoint", "eval_episodes", "eval_epsilon",
}  # fmt: skip
_RESUMING = {}  # id(args) -> (state file, its contents): read by check_flags, taken by the Run made with those args


@dataclass
class StopAndResume:
    """The flags of a run that a signal stops and `--resume` continues (each script's Args inherits them)."""

    resume: str | None = None
    """continue the run whose training state this is (its run folder or its state.pt) to its --total-timesteps
    (envpool's games cannot be saved: a resumed envpool run starts new ones)"""
    checkpoint_every_min: float = 0.0
    """also write the training state every this many minutes (0: only when SIGTERM or Ctrl-C stops the run)"""
    save_replay: bool = True
    """whether the training state holds the replay memory (--no-save-replay: a resumed run starts with it empty)"""


class AtTotal(Exception):
    """A resumed run is already at its total: nothing to do."""


def read_state(script, path):
    """The state file at `path` (a run folder or the file) and its contents, on the CPU; exit 2 if it is none."""
    given, path = path, Path(path)
    if not path.exists():
        fail(script, f"--resume {given}: no such file or folder")
    if path.is_dir():
        path = path / STATE_FILE
        if not path.is_file():
            fail(script, f"--resume {given}: the folder holds no {STATE_FILE} (a run writes it when SIGTERM or Ctrl-C "
                 "stops it, with --checkpoint-every-min, or at its end with --save-model)")  # fmt: skip
    try:
        blob = load_data(path, mmap=True)
        ok = isinstance(blob, dict) and blob.get("format") == STATE_FORMAT
    except DataOnly as err:
        fail(script, f"--resume {given}: {err}")
    except Exception as err:
        fail(script, f"--resume {given}: the state file is truncated or corrupt ({type(err).__name__}: {err})"
             .splitlines()[0])  # fmt: skip
    if isinstance(blob, dict) and blob.get("format") == OLD_STATE_FORMAT:
        fail(script, f"--resume {given} was written by an older leanrl, whose states held the envs as a pickle that "
             "loading would run: it is not loaded (start the run again)")  # fmt: skip
    if not ok:
        fail(script, f"--resume {given} is not a training state that a leanrl run wrote")
    if blob["script"] != Path(script).name:
        fail(script, f"--resume {given} is the state of a {blob['script']} run, not of {Path(script).name}")
    return path, blob


def resume_args(script, args):
    """--resume: read the state; the flags not given take the saved values, a given flag that changes the algorithm or
    a shape is refused (exit 2, naming it)."""
    path, blob = read_state(script, args.resume)
    saved, defaults = blob["args"], asdict(type(args)())
    for name, value in asdict(args).items():
        if name == "resume" or name not in saved or value == saved[name]:
            continue
        if value == defaults[name]:  # not given (or given at its default): as the run was started
            setattr(args, name, saved[name])
        elif name not in MAY_CHANGE:
            fail(script, f"--{name.replace('_', '-')} {value} would change the resumed run (it ran with "
                 f"{saved[name]}): a run goes on with its algorithm and shapes")  # fmt: skip
    _RESUMING[id(args)] = (path, blob)


NOT_SAVED = "leanrl: not saved"
ENVPOOL_NOT_SAVED = "envpool's envs cannot be saved (their games' state is C++'s)"
SPEED_OPTIONS = ("capturable", "fused", "foreach")  # an optimizer's, kept from the resumed run's own


def load_data(path, **kwargs):
    """torch.load of a file that holds data only (tensors, numbers, strings, dicts, lists, tuples): a file that holds
    anything else (a pickled object or function, which a plain load would call) raises DataOnly and nothing of it
    runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except pickle.UnpicklingError as err:  # torch's weights-only unpickler refused a global or a call
        said = str(err).split("WeightsUnpickler error: ", 1)[-1].split(". ")[0].splitlines()[0]
        raise DataOnly(f"it holds more than data ({said}); it was not loaded and nothing in it ran") from None


class DataOnly(Exception):
    """A file that should hold data only holds objects or code."""


# The envs' state as data: the attributes of gymnasium's envs, wrappers, vector envs, spaces and running statistics
# (numbers, strings, arrays, RNG states, MuJoCo's MjData arrays), nested as tagged dicts that a weights-only load
# takes; what is no data (functions, classes, the MuJoCo model, env makers) is left out, the script builds it again.
# Restoring writes the values into the envs the resumed run built, in place: nothing is made from the file but numbers.
BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_NOT_DATA = object()


def _walked(value):
    import gymnasium as gym
    from gymnasium.wrappers.utils import RunningMeanStd

    return isinstance(value, gym.Env | gym.vector.VectorEnv | gym.spaces.Space | RunningMeanStd)


def _type_name(value):
    return f"{type(value).__module__}.{type(value).__qualname__}"


def env_data(value, depth=0):
    """`value` (an env and what it holds) as data; _NOT_DATA where it is none."""
    if depth > 100:
        raise ValueError("the envs nest too deep to be saved")
    if isinstance(value, np.ndarray | np.bool_ | np.number):  # (before float: np.float64 is one)
        array = np.asarray(value)
        if array.dtype == object:
            return _NOT_DATA
        return {"ndarray" if isinstance(value, np.ndarray) else "scalar": torch.from_numpy(array.copy())}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.random.Generator):
        return {"generator": env_data(value.bit_generator.state)}
    if type(value).__name__ == "MjData" and type(value).__module__.startswith("mujoco"):
        arrays = {name: getattr(value, name) for name in dir(value) if not name.startswith("_")}
        arrays = {name: torch.from_numpy(a.copy()) for name, a in arrays.items() if isinstance(a, np.ndarray)}
        return {"mjdata": arrays, "time": value.time}
    if isinstance(value, list | tuple | deque):
        parts = [env_data(part, depth + 1) for part in value]
        if any(part is _NOT_DATA for part in parts):
            return _NOT_DATA
        kind = "deque" if isinstance(value, deque) else type(value).__name__
        return {kind: parts, "maxlen": value.maxlen} if kind == "deque" else {kind: parts}
    if isinstance(value, dict) and all(isinstance(key, str | int) for key in value):
        parts = {key: env_data(part, depth + 1) for key, part in value.items()}
        return _NOT_DATA if any(part is _NOT_DATA for part in parts.values()) else {"dict": parts}
    if isinstance(value, list | tuple) or not _walked(value):
        return _NOT_DATA
    parts = {key: env_data(part, depth + 1) for key, part in vars(value).items()}
    return {"object": _type_name(value), "vars": {key: part for key, part in parts.items() if part is not _NOT_DATA}}


def set_env_data(live, saved):
    """The value to put where `live` is, from `saved` (as env_data wrote it): written into `live` in place where it
    is an env (or another walked object), an array of the same shape and dtype, an RNG, MjData or a list."""
    if not isinstance(saved, dict):
        return saved  # None, a number or a string
    if "ndarray" in saved or "scalar" in saved:
        array = (saved.get("ndarray", saved.get("scalar"))).numpy()
        if "scalar" in saved:
            return array[()]
        if isinstance(live, np.ndarray) and live.shape == array.shape and live.dtype == array.dtype:
            np.copyto(live, array)
            return live
        return array.copy()
    if "generator" in saved:
        state = set_env_data(None, saved["generator"])
        if not isinstance(live, np.random.Generator):
            if state["bit_generator"] not in BIT_GENERATORS:
                raise ValueError(f"saved an RNG of kind {state['bit_generator']}")
            live = np.random.Generator(getattr(np.random, state["bit_generator"])())
        live.bit_generator.state = state
        return live
    if "mjdata" in saved:
        if type(live).__name__ != "MjData":
            raise ValueError(f"saved MuJoCo's MjData, here {_type_name(live)}")
        for name, array in saved["mjdata"].items():
            # the arrays the model sizes; the solver's and the contacts' (sized by this step's contacts) are made
            # anew by the next mj_step before it reads them
            own = getattr(live, name, None)
            if isinstance(own, np.ndarray) and own.shape == tuple(array.shape):
                np.copyto(own, array.numpy())
        live.time = saved["time"]
        return live
    for kind in ("list", "tuple", "deque"):
        if kind in saved:
            items = saved[kind]
            same = isinstance(live, list | tuple | deque) and len(live) == len(items)
            parts = [set_env_data(own, part) for own, part in zip(live if same else [None] * len(items), items)]
            if kind == "list" and isinstance(live, list):  # the vector env's sub-envs: the same list
                live[:] = parts
                return live
            if kind == "deque":
                return deque(parts, maxlen=saved["maxlen"])
            return tuple(parts) if kind == "tuple" else parts
    if "dict" in saved:
        lives = live if isinstance(live, dict) else {}
        return {key: set_env_data(lives.get(key), part) for key, part in saved["dict"].items()}
    if "object" in saved:
        if live is None or _type_name(live) != saved["object"]:
            raise ValueError(f"saved {saved['object']}, here {_type_name(live)}")
        own = vars(live)
        for key, part in saved["vars"].items():
            if key not in own:
                raise ValueError(f"saved {saved['object']}.{key}, which this run's has not")
            own[key] = set_env_data(own[key], part)
        return live
    raise ValueError(f"saved {sorted(saved)}: not the state of an env")


def pack(value, name="", save_replay=True):
    """The training state as torch.save writes it (weights_only loads it): state_dicts, tensors (numpy arrays as
    tensors), numbers, the envs' state as data (env_data); {NOT_SAVED: why} for a part left out."""
    if name == "replay" and not save_replay:
        return {NOT_SAVED: "--no-save-replay"}
    if isinstance(value, torch.nn.Module | torch.optim.Optimizer):
        return value.state_dict()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, torch.Tensor):  # a view of part of a storage is saved as a copy of its own: torch.save would
        # write the whole storage, and refuses one storage under two dtypes (a twin's step upload: one byte buffer
        # viewed as the obs, the rewards and the flags); it is restored in place all the same
        return value.detach().clone() if value.untyped_storage().nbytes() != value.nbytes else value.detach()
    if isinstance(value, dict):
        return {key: pack(part) for key, part in value.items()}
    if isinstance(value, tuple | list):
        parts = [pack(part) for part in value]
        left_out = [part for part in parts if isinstance(part, dict) and NOT_SAVED in part]
        return left_out[0] if left_out else type(value)(parts)  # a group is saved whole or not at all
    if hasattr(value, "step") and hasattr(value, "reset"):  # a vector env: its sub-envs' state as data
        if any(kind.__module__.startswith("envpool") for kind in type(value).__mro__):
            return {NOT_SAVED: ENVPOOL_NOT_SAVED}
        if not _walked(value):
            return {NOT_SAVED: f"the envs cannot be saved ({type(value).__name__} is no gymnasium env)"}
        return {"env_data": env_data(value)}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"the training state cannot hold {name or 'a part'} of type {type(value).__name__}")


def unpack(live, saved):
    """Restore `saved` (as pack wrote it) into `live`, in place where `live` is an object; returns the value to use."""
    if isinstance(saved, dict) and NOT_SAVED in saved:
        return live
    if isinstance(live, torch.optim.Optimizer):  # its speed options are this part's (a twin resumed with --cudagraphs)
        speed = [{key: group[key] for key in SPEED_OPTIONS if key in group} for group in live.param_groups]
        groups = [dict(group, **options) for group, options in zip(saved["param_groups"], speed)]
        tensors = [{key: v for key, v in group.items() if torch.is_tensor(v)} for group in live.param_groups]
        live.load_state_dict(dict(saved, param_groups=groups))
        # a tensor hyper-parameter (a twin's lr, on its device, read by its graphs) stays this run's tensor, the saved
        # value copied in: load_state_dict would put a copy of the saved one, on the CPU, in its place
        for group, own in zip(live.param_groups, tensors):
            for key, tensor in own.items():
                group[key] = tensor.copy_(torch.as_tensor(group[key]))
        return live
    if isinstance(live, torch.nn.Module):
        live.load_state_dict(saved)
        return live
    if isinstance(live, np.ndarray | torch.Tensor):
        array = saved.numpy() if isinstance(live, np.ndarray) else saved
        if tuple(array.shape) != tuple(live.shape) or array.dtype != live.dtype:
            raise ValueError(f"saved {array.dtype} {tuple(array.shape)}, here {live.dtype} {tuple(live.shape)}")
        if isinstance(live, np.ndarray):
            np.copyto(live, array)
        else:
            with torch.no_grad():
                live.copy_(array)
        return live
    if isinstance(live, dict) and isinstance(saved, dict) and live:  # an empty one: a value the script rebinds
        if set(live) != set(saved):
            raise ValueError(f"saved {sorted(saved)}, here {sorted(live)}")
        restored = {key: unpack(live[key], saved[key]) for key in live}
        live.update(restored)  # the same dict: its arrays were restored in place
        return live
    if isinstance(live, tuple | list) and isinstance(saved, tuple | list) and len(live) == len(saved) > 0:
        return type(live)(unpack(a, b) for a, b in zip(live, saved))
    if hasattr(live, "step") and hasattr(live, "reset"):  # a vector env: restored from data alone
        if not (isinstance(saved, dict) and "env_data" in saved):
            raise ValueError(f"saved {sorted(saved) if isinstance(saved, dict) else type(saved).__name__}, not envs")
        return set_env_data(live, saved["env_data"])
    return saved  # a value the script rebinds (a step count, the last losses)


def rng_state():
    """Every RNG a script draws from: Python's `random`, numpy's global one, torch's CPU and (where used) CUDA ones."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = dict(python=random.getstate(), numpy=(name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss))
    state["torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- the run


def aggregate(means, solved_at=None):
    """The figures of a run of seeds from each seed's mean return (None: a seed that finished no episode): their
    mean, std (ddof 0) and interquartile mean (the mean of the middle half: a quarter, rounded down, cut from each end,
    as scipy's trim_mean(means, 0.25)) over the seeds that have one, and the fraction of all seeds at solved_at or
    above."""
    have = sorted(m for m in means if m is not None)
    cut = len(have) // 4
    out = dict(
        num_seeds=len(means),
        mean=float(np.mean(have)) if have else None,
        std=float(np.std(have)) if have else None,
        iqm=float(np.mean(have[cut : len(have) - cut])) if have else None,
    )
    if solved_at is not None:
        out.update(solved_at=solved_at, solved=sum(m >= solved_at for m in have) / len(means) if means else None)
    return out


def finite_or_none(obj):
    """A results line is strict JSON: every non-finite float (NaN, inf), nested ones included, becomes null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite_or_none(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_none(value) for value in obj]
    return obj


_TENSORBOARD_MISSING = []  # said once a process


def tensorboard_writer(folder, args):
    """CleanRL's TensorBoard event file in the run folder (`tensorboard --logdir runs`), its flags as a text; None
    where the tensorboard package is missing (the offline GPU machine): the run goes on without, said once."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if not _TENSORBOARD_MISSING:
            _TENSORBOARD_MISSING.append(True)
            print("tensorboard is not installed: no event files in the run folder", file=sys.stderr)
        return None
    writer = SummaryWriter(str(folder))
    table = "\n".join(f"|{name}|{value}|" for name, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")  # CleanRL's
    return writer


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit(root):
    """The commit the checkout at `root` (the folder holding leanrl/) is at: $LEANRL_COMMIT where the caller names it
    (a copy without .git, or with a stale one), else git's short hash (+ " + uncommitted changes" where tracked files
    differ from it), else None: not a git checkout of its own (an installed copy, even inside another project's)."""
    if os.environ.get("LEANRL_COMMIT"):
        return os.environ["LEANRL_COMMIT"]
    root = Path(root).resolve()
    git = lambda *cmd: subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True)
    try:
        head = git("rev-parse", "--show-toplevel", "--short", "HEAD")
    except OSError:  # no git on this machine
        return None
    lines = head.stdout.splitlines()  # the top-level path may hold spaces
    if head.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return lines[1] + (" + uncommitted changes" if dirty else "")


class Run:
    """One training (or evaluation) run. What a script uses, part by part:

        with Run(__file__, args, device, burnin=...) as run:
            for iteration in run.progress(range(num_iterations)):  # the loop, with its progress bar
                ...
                run.episode(global_step, episodic_return, episodic_length)  # an episode (an Atari game) ended
                run.tick(global_step)  # an iteration done: the steps/s meter
                losses = run.check_finite(global_step, losses)  # a log point: the losses read, a diverged run stopped
                run.report(global_step, {"losses/td_loss": losses["td_loss"]})  # the bar, TensorBoard, wandb
            run.add_to_results(epsilon=epsilon)  # a field of the results line (the last value given)

    - The run folder: `run.dir` (`run.name`, CleanRL's run name), with the return curve `returns.csv` written an
      episode a line, and CleanRL's TensorBoard scalars (the episodes', and at each report charts/SPS and the logs);
      `run.model_path`, where `run.save` writes the checkpoint (--save-model: the script sets `run.save`);
      `run.videos`, the folder env 0 films in with --capture-video (else None; checked first).
    - The steps/s meter: `burnin` ticks left out; measured from the tick that ends the burn-in to the last tick (from
      the start when the run ends inside its burn-in; none before the first tick).
    - The log points: `check_finite` returns the values it read (floats), the ones the script logs; they also go into
      the results line, as the run's last losses.
    - The end (leaving the `with` block): `run.save` when the run ended well or was interrupted, then the results line
      (strict JSON, also when the run fails) and the summary line; a diverged run then exits 1, an interrupted one
      130 (143 when SIGTERM stopped it), and an error is raised on.
    - Stop signals: inside the `with` block, Ctrl-C (SIGINT) and SIGTERM (how Slurm, Kubernetes and cloud schedulers
      stop a job, SIGKILL following a grace period later) both raise KeyboardInterrupt in the main thread, where
      Python runs the handler: after the native call under way (an env step, a torch op) returns. The run ends
      "interrupted", with its curve, checkpoint and results line; a signal that comes while the run is ending (a
      scheduler's second SIGTERM, torchrun forwarding the one its ranks got) is not raised there, so it cannot cut them
      short. A signal the process was started ignoring (a job that a shell without job control started with `&`
      ignores SIGINT) stays ignored. deferred_stop=agree: a signal only sets `run.stop_signal`; at each iteration's
      end `agree(signal or 0, state due)` returns what every rank agrees on (the ranks of a distributed run stop, and
      write their training state, at the same iteration).
    - A stopped run goes on: where the script names its training state (`run.state`, `run.resume`, see "a stopped
      run goes on" above), a signal stops the run at the iteration's end, the state written there first.
    - record=False: a run that keeps its meter, its checks and its exit status but writes and prints nothing (no
      folder, curve, progress bar, wandb, results line, summary or state file): the other ranks of a distributed run.
    - seeds=[...]: a run of several independent agents (a script's --num-seeds): `run.episode(..., seed=k)`, the curve
      gains a `seed` column, the mean return (results line, progress bar) is the mean over seeds of each seed's last-100
      mean, and the results line adds each seed's (`seeds`) and their aggregate (`aggregate`: mean, std, interquartile
      mean, the fraction of seeds at `solved_at` or above). With more than one seed, TensorBoard and wandb get no
      episode one by one: charts/episodic_return is that mean over seeds, at each report.
    """

    def __init__(self, script, args, device, burnin=None, mode="train", record=True, deferred_stop=None, seeds=None,
                 solved_at=None, **fields):  # fmt: skip
        if getattr(args, "capture_video", False):
            check_video(script, args.env_id)  # before the run folder and the results line: bad input leaves neither
        self.script, self.args, self.mode, self.record = Path(script).name, args, mode, record
        self.burnin = args.measure_burnin if burnin is None else burnin
        self.start_time = time.time()
        self.returns, self.losses, self.steps, self.ticks = [], {}, 0, 0
        self.seeds, self.solved_at = (list(seeds) if seeds is not None else None), solved_at
        self.seed_returns = {seed: [] for seed in self.seeds or []}  # each seed's episodes, with seeds
        self.mark = self.last = self.part_start = (self.start_time, 0)
        self.measured, self.wall_before, self.iterations_done, self.resumed = (0.0, 0), 0.0, 0, 0
        self.status, self.message = "ok", None
        self.save, self.stop_signal, self.deferred_stop, self.handlers = None, None, deferred_stop, {}
        self.state, self.writing, self.notes, self.wandb_id = None, False, set(), None
        self.has_state = False  # whether the run has a training state to keep up to date (written, or resumed from)
        self.every = 60 * getattr(args, "checkpoint_every_min", 0)
        self.next_write = self.start_time + self.every
        self.resuming = _RESUMING.pop(id(args), None) if mode == "train" else None
        if self.resuming:  # the run goes on: its name and folder (the one that holds the state), its meter, its curve
            state_path, blob = self.resuming
            self.has_state = True
            self.dir, saved = state_path.parent, blob["run"]
            self.name, self.returns, self.losses = saved["name"], list(saved["returns"]), dict(saved["losses"])
            self.steps, self.ticks, self.iterations_done = saved["steps"], saved["ticks"], saved["iterations"]
            self.measured, self.wall_before, self.resumed = tuple(saved["meter"]), saved["wall_s"], saved["resumed"] + 1
            self.wandb_id = saved.get("wandb_id")  # a tracked run logs on into its own wandb run
            for seed, returns in zip(self.seeds or [], saved.get("seed_returns", [])):
                self.seed_returns[seed] = list(returns)
            self.mark = self.last = self.part_start = (self.start_time, self.steps)
            if self.ticks >= self.burnin:  # past its burn-in: --measure-burnin iterations left out again
                self.burnin = self.ticks + args.measure_burnin
            curve = self.dir / "returns.csv"
        elif mode == "eval":  # an evaluation reports the folder of the checkpoint it plays, and writes its curve there
            self.dir = Path(args.eval_checkpoint).parent
            self.name, curve = self.dir.name, self.dir / "eval_returns.csv"
        else:
            # CleanRL's run name; a second run of the same script and seed started in the same second gets "-2"
            self.name = name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(self.start_time)}"
            for n in range(2, 1000):
                self.dir = Path(args.results_file).parent / self.name
                try:
                    if record:
                        self.dir.mkdir(parents=True)
                    break
                except FileExistsError:
                    self.name = f"{name}-{n}"
            curve = self.dir / "returns.csv"
        self.model_path = self.dir / f"{args.exp_name}.pt"  # where --save-model writes the checkpoint
        self.state_path = self.dir / STATE_FILE  # where the training state is written
        videos = self.dir / ("eval_videos" if mode == "eval" else "videos")
        self.videos = videos if getattr(args, "capture_video", False) else None
        self.fields = dict(
            script=self.script,
            env_id=args.env_id,
            seed=args.seed,
            compile=getattr(args, "compile", False),
            cudagraphs=getattr(args, "cudagraphs", False),
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            cpu=cpu_name(),
            cpu_count=os.cpu_count(),
            torch=torch.__version__,
            commit=source_commit(Path(script).resolve().parent.parent),  # the folder holding leanrl/
            run_name=self.name,
            mode=mode,
            total_timesteps=args.total_timesteps if mode == "train" else 0,
            resumed=self.resumed,
            **fields,
        )
        if mode == "eval":
            self.fields["checkpoint"] = args.eval_checkpoint
        # line by line: watch it live; a resumed run appends to its curve
        appends = self.resuming and record and curve.exists()
        self.curve = (curve if record else Path(os.devnull)).open("a" if appends else "w", buffering=1)
        if not appends:
            self.curve.write("step,wall_s,return,seed\n" if self.seeds is not None else "step,wall_s,return\n")
        self.tensorboard = tensorboard_writer(self.dir, args) if mode == "train" and record else None
        self.wandb = None
        if args.track and mode == "train" and record:
            import wandb

            same_run = dict(id=self.wandb_id, resume="must") if self.wandb_id else {}
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=self.name,
                       **same_run)  # fmt: skip
            self.wandb, self.wandb_id = wandb, getattr(wandb.run, "id", None)
        self.pbar = None

    def progress(self, iterable):
        """The iterations of the loop, with a progress bar that report() keeps up to date; a resumed run's start at the
        first iteration not done. At each iteration's end the training state is written where it is due."""
        total = len(iterable) if hasattr(iterable, "__len__") else None
        if self.resumed and total is not None and self.iterations_done >= total:
            raise AtTotal(f"{self.script}: the run in {self.dir} is already at its total ({self.steps} steps, "
                          f"--total-timesteps {self.args.total_timesteps}): nothing to do")  # fmt: skip
        todo = itertools.islice(iterable, self.iterations_done, None)
        self.pbar = tqdm.tqdm(todo, desc=Path(self.script).stem, mininterval=1.0, disable=not self.record,
                              total=total, initial=self.iterations_done)  # fmt: skip
        return self.iterations(self.pbar)

    def iterations(self, items):
        for item in items:
            yield item
            self.iterations_done += 1  # the iteration's end: its state is whole
            signum, due = self.stop_signal or 0, self.state_due
            if self.deferred_stop:  # the ranks of a distributed run agree on both (a collective)
                signum, due = self.deferred_stop(signum, due)
            if signum:
                self.stop_for(signum)
            elif due and self.state is not None:
                self.write_state()
        # the loop's end: the last state, from which a longer run goes on (--save-model, or a run that wrote one)
        if self.state is not None and (self.args.save_model or self.has_state):
            self.write_state()

    # ---------------------------------------------------------------- the training state: written, restored

    def wall(self):
        """Seconds the run has run, every part of it (the time between a stop and its resume left out)."""
        return self.wall_before + time.time() - self.start_time

    @property
    def state_due(self):
        """Whether --checkpoint-every-min asks for the training state now."""
        return bool(self.every) and time.time() >= self.next_write

    def write_state(self):
        """Write the training state (`run.state()`, the RNGs, the run's episodes and meter) atomically to
        `run.state_path`. A signal that comes meanwhile is not acted on (the run stops after it, if it stops). A run
        that does not record (another rank of a distributed run) only calls `run.state()`, which may gather from the
        ranks, and writes nothing."""
        self.writing, self.has_state = True, True
        try:
            state = self.state()
            self.next_write = time.time() + self.every
            if not self.record:
                return
            parts = {name: pack(value, name, getattr(self.args, "save_replay", True)) for name, value in
                     state.items()}  # fmt: skip
            run = dict(name=self.name, iterations=self.iterations_done, steps=self.steps, ticks=self.ticks,
                       meter=self.meter, wall_s=self.wall(), returns=list(self.returns), losses=dict(self.losses),
                       resumed=self.resumed, wandb_id=self.wandb_id)  # fmt: skip
            if self.seeds is not None:
                run["seed_returns"] = [list(self.seed_returns[seed]) for seed in self.seeds]
            blob = dict(format=STATE_FORMAT, script=self.script, args=asdict(self.args), run=run, rng=rng_state())
            atomic_save(dict(blob, state=parts), self.state_path)
        finally:
            self.writing = False
        print(f"training state saved to {self.state_path} at step {self.steps}", flush=True)
        for name, part in parts.items():
            if isinstance(part, dict) and NOT_SAVED in part and name not in self.notes:
                self.notes.add(name)
                loses = "starts with an empty replay memory" if name == "replay" else "starts new episodes"
                print(f"{self.script}: {name} not saved, {part[NOT_SAVED]}: a resumed run {loses}", flush=True)

    def resume(self, *names):
        """With --resume: restore the training state that `run.state` names (in place) and the RNGs, and return the
        saved values of `names`; without: their values now. See "a stopped run goes on" above."""
        live = self.state()
        if self.resuming:
            state_path, blob = self.resuming
            self.resuming, saved = None, blob["state"]
            if set(saved) != set(live):
                fail(self.script, f"--resume {state_path}: the state holds {', '.join(sorted(saved))}; this script's "
                     f"is {', '.join(sorted(live))}")  # fmt: skip
            for name in live:
                try:
                    live[name] = unpack(live[name], saved[name])
                except Exception as err:
                    fail(self.script, f"--resume {state_path}: its {name} does not fit this run's (another network "
                         f"shape, env or memory size?): {type(err).__name__}: {err}".splitlines()[0])  # fmt: skip
            set_rng_state(blob["rng"])
            for name, part in saved.items():
                if isinstance(part, dict) and NOT_SAVED in part:
                    loses = "starts with an empty replay memory" if name == "replay" else "starts new episodes"
                    print(f"{self.script}: resumed without its {name} ({part[NOT_SAVED]}): it {loses}", flush=True)
            rows = (self.dir / "returns.csv").read_text().splitlines(keepends=True) if self.record else []
            if len(rows) > 1 + len(self.returns):  # episodes after the state, before a kill -9
                self.curve.close()
                tmp = self.dir / "returns.csv.tmp"
                tmp.write_text("".join(rows[: 1 + len(self.returns)]))
                os.replace(tmp, self.dir / "returns.csv")
                self.curve = (self.dir / "returns.csv").open("a", buffering=1)
            print(f"{self.script}: resumed {self.name} at step {self.steps} from {state_path}", flush=True)
        values = tuple(live[name] for name in names)
        return values[0] if len(names) == 1 else values

    def add_to_results(self, **fields):
        """Fields of the results line that only the script knows (its last epsilon, its replay memory's bytes)."""
        self.fields.update(fields)

    # ---------------------------------------------------------------- the return curve, the meter, the log points

    def episode(self, step, episodic_return, episodic_length=None, seed=None, **logs):
        """An episode (a whole game on Atari) ended at env step `step` (of agent `seed`, in a run of seeds)."""
        self.returns.append(episodic_return)
        self.steps = max(self.steps, step)  # a run that stops between ticks reports the steps it did
        if self.seeds is not None:
            self.seed_returns[seed].append(episodic_return)
            self.curve.write(f"{step},{self.wall():.3f},{episodic_return},{seed}\n")
            if len(self.seeds) > 1:  # the mean over seeds goes to TensorBoard at each report
                return
        else:
            self.curve.write(f"{step},{self.wall():.3f},{episodic_return}\n")
        logs["charts/episodic_return"] = episodic_return
        if episodic_length is not None:
            logs["charts/episodic_length"] = episodic_length
        self.log(logs, step)

    def tick(self, step):
        """One iteration done: `step` env steps so far."""
        if self.stop_signal and not self.deferred_stop and self.state is None:  # the signal's KeyboardInterrupt was
            self.interrupt(self.stop_signal)  # swallowed on its way up (raised in a __del__ or a C callback: printed)
        self.steps, self.ticks = step, self.ticks + 1
        self.last = (time.time(), step)
        if self.ticks == self.burnin:
            self.mark = self.last

    @property
    def meter(self):
        """(seconds, env steps) measured: the window after the burn-in, in every part of a resumed run."""
        seconds, steps = self.measured
        if self.ticks > self.burnin:
            seconds, steps = seconds + self.last[0] - self.mark[0], steps + self.last[1] - self.mark[1]
        return seconds, steps

    @property
    def sps(self):
        seconds, steps = self.meter
        if steps <= 0:  # the run ended inside its burn-in: measured from its (this part's) start
            seconds, steps = self.last[0] - self.part_start[0], self.last[1] - self.part_start[1]
        return steps / seconds if steps > 0 and seconds > 0 else None

    @property
    def mean_return(self):
        """The mean of the last 100 episodes; in a run of seeds, the mean over seeds of each seed's (seeds with one)."""
        if self.seeds is not None:
            means = [m for m in self.seed_means() if m is not None]
            return float(np.mean(means)) if means else None
        return float(np.mean(self.returns[-100:])) if self.returns else None

    def seed_means(self):
        """Each seed's mean of its last 100 episodes (None for a seed with none yet), in the order of `seeds`."""
        return [float(np.mean(self.seed_returns[s][-100:])) if self.seed_returns[s] else None for s in self.seeds]

    def check_finite(self, step, losses, unchecked=None):
        """Read the losses (a dict of 0-d tensors or floats) to the host in one go; stop the run on a non-finite one.

        `unchecked`: more values of the log point, read and reported with the losses (results line included) but no
        reason to stop (CleanRL's explained variance is NaN when the returns do not vary)."""
        named = {**losses, **(unchecked or {})}
        values = list(named.values())
        if values and all(isinstance(v, torch.Tensor) for v in values):
            values = torch.stack([v.detach().float() for v in values]).tolist()
        self.steps = max(self.steps, step)
        self.losses = dict(zip(named, map(float, values)))
        for name in losses:
            if not math.isfinite(self.losses[name]):
                raise Diverged(f"loss diverged at step {step}: {name}={self.losses[name]}")
        return self.losses

    def report(self, step, logs=None):
        """A log point: the progress bar's steps/s and mean return; charts/SPS and `logs` to TensorBoard (and wandb)."""
        ret = self.mean_return
        if self.pbar is not None:
            self.pbar.set_postfix(sps=f"{self.sps or 0:.0f}", ret="n/a" if ret is None else f"{ret:.1f}", refresh=False)
        if self.seeds is not None and len(self.seeds) > 1 and ret is not None:
            logs = {"charts/episodic_return": ret, **(logs or {})}  # the mean over seeds
        self.log({"charts/SPS": self.sps or 0.0, **(logs or {})}, step)

    def log(self, scalars, step):
        """CleanRL's charts and losses: into the run folder's TensorBoard event file and (with --track) to wandb."""
        if self.tensorboard:
            for name, value in scalars.items():
                self.tensorboard.add_scalar(name, value, step)
        if self.wandb:
            self.wandb.log(scalars, step=step)

    # ---------------------------------------------------------------- --eval-checkpoint's loop

    def play(self, envs, act, episodes_of, num_episodes, **reset_kwargs):
        """The evaluation loop: step `envs` with `act(obs)` until `num_episodes` episodes ended.

        episodes_of(rewards, terminations, truncations, infos) -> returns of the episodes that ended in that step.
        """
        obs, _ = envs.reset(**reset_kwargs)
        num_envs = len(obs)
        while len(self.returns) < num_episodes:
            obs, rewards, terminations, truncations, infos = envs.step(act(obs))
            self.tick(self.steps + num_envs)
            for episodic_return in episodes_of(rewards, terminations, truncations, infos):
                if len(self.returns) < num_episodes:
                    self.episode(self.steps, episodic_return)
        envs.close()

    # ---------------------------------------------------------------- stop signals, the end, the results line

    def stop(self, signum, frame):
        """The handler of SIGINT and SIGTERM while the run is on: stop it, unless it is already ending; where the script
        named its training state, at the iteration's end (a second signal before it: at once, no state written)."""
        first = not self.stop_signal
        self.stop_signal = self.stop_signal or signum
        if self.deferred_stop or self.writing or (first and self.state is not None):
            return
        while frame is not None:  # where the signal is handled, and its callers
            if frame.f_code is Run.__exit__.__code__:
                return  # the run is ending: its checkpoint and results line are being written
            frame = frame.f_back
        self.interrupt(signum)

    def stop_for(self, signum):
        """Stop the run as the signal `signum` does, at an iteration's end: the training state written (where the
        script named one), then a KeyboardInterrupt."""
        self.stop_signal = signum
        if self.state is not None:
            self.write_state()
        self.interrupt(signum)

    def interrupt(self, signum):
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # the only thread where Python runs handlers
            for signum in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self.handlers[signum] = signal.signal(signum, self.stop)
        return self

    def __exit__(self, kind, err, traceback):
        try:
            return self.end(kind, err)
        finally:
            for signum, handler in self.handlers.items():
                signal.signal(signum, handler)

    def end(self, kind, err):
        """The run's end (__exit__): the checkpoint, the curve closed, the results line, the summary, the exit code."""
        if kind is not None and issubclass(kind, AtTotal | SystemExit):  # nothing to do; bad input (fail): no line
            self.close()
            if issubclass(kind, AtTotal):
                print(err, flush=True)
            return issubclass(kind, AtTotal)
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.stop_signal = self.stop_signal or signal.SIGINT  # a KeyboardInterrupt raised without a signal
            by = "the user" if self.stop_signal == signal.SIGINT else signal.Signals(self.stop_signal).name
            self.status, self.message = "interrupted", f"interrupted by {by}"
        elif kind is not None and issubclass(kind, Diverged):
            self.status, self.message = "diverged", str(err)
            print(f"{self.script}: {self.message}", file=sys.stderr)
        elif kind is not None:
            self.status, self.message = "error", f"{kind.__name__}: {err}"
        save_error, writes = None, []
        if self.save is not None and self.status in ("ok", "interrupted"):
            writes.append(("the model", self.save))
        for what, write in writes:
            try:
                write()
            except Exception as error:  # reported in the results line, then raised on
                self.status, self.message = "error", f"saving {what}: {type(error).__name__}: {error}"
                save_error = error
                break
        self.close()
        line = dict(
            self.fields,
            steps=self.steps,
            sps=self.sps,
            wall_s=self.wall(),
            mean_return=self.mean_return,
            episodes=len(self.returns),
            status=self.status,
            losses=self.losses,
            message=self.message,
            time=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        if self.seeds is not None:
            means = self.seed_means()
            line["seeds"] = dict(seed=self.seeds, mean_return=means, episodes=[len(self.seed_returns[s]) for s in
                                                                                self.seeds])  # fmt: skip
            line["aggregate"] = aggregate(means, self.solved_at)
        line = finite_or_none(line)
        path = Path(self.args.results_file)
        if self.record:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps(line, allow_nan=False) + "\n")
            print(self.summary(line), flush=True)
        if self.wandb:
            self.wandb.finish()
        if save_error is not None:
            raise save_error
        if self.status == "interrupted":
            sys.exit(128 + self.stop_signal)  # the shell's code of a process the signal ended: 130, 143
        if self.status == "diverged":
            sys.exit(1)
        return False  # an error goes on up, with its traceback

    def close(self):
        """The curve, the event file and the progress bar closed."""
        self.curve.close()
        if self.tensorboard:
            self.tensorboard.close()
        if self.pbar is not None:
            self.pbar.close()

    def summary(self, line):
        """The one line a run prints when it ends: what it did, and where its results line and its folder are."""
        sps = "n/a" if line["sps"] is None else f"{line['sps']:.0f}"
        ret = "n/a" if line["mean_return"] is None else f"{line['mean_return']:.1f}"
        return (
            f"{self.script}: {line['status']}: {line['steps']} steps, {sps} steps/s, mean return {ret} over "
            f"{line['episodes']} episodes; results: {Path(self.args.results_file).resolve()}, "
            f"run folder: {self.dir.resolve()}"
        )
