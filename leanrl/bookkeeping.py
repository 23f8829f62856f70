"""Run bookkeeping shared by every script. Nothing of RL lives here: the algorithms are in the scripts, one file each.

What is here: flag and env-family checks (one clear line, exit code 2), the results line (strict JSON with the
hardware and the commit it ran on), the return curve `returns.csv`, the steps/s meter, the progress bar, the end-of-run
summary line, divergence/interrupt/error handling (Ctrl-C and a scheduler's SIGTERM alike), atomic checkpoints, the
episode loop of `--eval-checkpoint` and what `--capture-video` needs.
"""

import importlib.util
import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict
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


def save_checkpoint(path, args, **state):
    """Write {"args": ..., **state} atomically: a temporary file, then a rename, so a reader never sees half of it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"args": asdict(args), **state}, tmp)
    os.replace(tmp, path)
    print(f"model saved to {path}")


def load_checkpoint(script, path, *keys):
    """A checkpoint written by save_checkpoint, on the CPU; exit 2 if it is not one of this script's (lacks `keys`)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        missing = [key for key in ("args", *keys) if key not in checkpoint]
    except Exception as err:
        missing = [type(err).__name__]
    if missing:
        fail(script, f"--eval-checkpoint {path} is not a checkpoint of this script (no {', '.join(missing)})")
    return checkpoint


# ---------------------------------------------------------------- the run


def finite_or_none(obj):
    """A results line is strict JSON: every non-finite float (NaN, inf), nested ones included, becomes null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite_or_none(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_none(value) for value in obj]
    return obj


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
                run.report(global_step, {"losses/td_loss": losses["td_loss"]})  # the bar; wandb with --track
            run.add_to_results(epsilon=epsilon)  # a field of the results line (the last value given)

    - The run folder: `run.dir` (`run.name`, CleanRL's run name), with the return curve `returns.csv` written an
      episode a line; `run.model_path`, where `run.save` writes the checkpoint (--save-model: the script sets
      `run.save`); `run.videos`, the folder env 0 films in with --capture-video (else None; checked first).
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
      ignores SIGINT) stays ignored. deferred_stop=True: a signal only sets `run.stop_signal`; the script stops where
      it chooses with run.stop_for() (the ranks of a distributed run agree on the iteration to stop at).
    - record=False: a run that keeps its meter, its checks and its exit status but writes and prints nothing (no
      folder, curve, progress bar, wandb, results line or summary): the other ranks of a distributed run.
    """

    def __init__(self, script, args, device, burnin=None, mode="train", record=True, deferred_stop=False, **fields):
        if getattr(args, "capture_video", False):
            check_video(script, args.env_id)  # before the run folder and the results line: bad input leaves neither
        self.script, self.args, self.mode, self.record = Path(script).name, args, mode, record
        self.burnin = args.measure_burnin if burnin is None else burnin
        self.start_time = time.time()
        self.returns, self.losses, self.steps, self.ticks = [], {}, 0, 0
        self.mark = self.last = (self.start_time, 0)
        self.status, self.message = "ok", None
        self.save, self.stop_signal, self.deferred_stop, self.handlers = None, None, deferred_stop, {}
        if mode == "eval":  # an evaluation reports the folder of the checkpoint it plays, and writes its curve there
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
            **fields,
        )
        if mode == "eval":
            self.fields["checkpoint"] = args.eval_checkpoint
        self.curve = (curve if record else Path(os.devnull)).open("w", buffering=1)  # line by line: watch it live
        self.curve.write("step,wall_s,return\n")
        self.wandb = None
        if args.track and mode == "train" and record:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), name=self.name)
            self.wandb = wandb
        self.pbar = None

    def progress(self, iterable):
        """The iterations of the loop, with a progress bar that report() keeps up to date."""
        self.pbar = tqdm.tqdm(iterable, desc=Path(self.script).stem, mininterval=1.0, disable=not self.record)
        return self.pbar

    def add_to_results(self, **fields):
        """Fields of the results line that only the script knows (its last epsilon, its replay memory's bytes)."""
        self.fields.update(fields)

    # ---------------------------------------------------------------- the return curve, the meter, the log points

    def episode(self, step, episodic_return, episodic_length=None, **logs):
        """An episode (a whole game on Atari) ended at env step `step`."""
        self.returns.append(episodic_return)
        self.steps = max(self.steps, step)  # a run that stops between ticks reports the steps it did
        self.curve.write(f"{step},{time.time() - self.start_time:.3f},{episodic_return}\n")
        if self.wandb:
            logs["charts/episodic_return"] = episodic_return
            if episodic_length is not None:
                logs["charts/episodic_length"] = episodic_length
            self.wandb.log(logs, step=step)

    def tick(self, step):
        """One iteration done: `step` env steps so far."""
        if self.stop_signal and not self.deferred_stop:  # the signal's KeyboardInterrupt was swallowed on its way up
            self.stop_for(self.stop_signal)  # (raised in a __del__ or a callback from C, it is only printed)
        self.steps, self.ticks = step, self.ticks + 1
        self.last = (time.time(), step)
        if self.ticks == self.burnin:
            self.mark = self.last

    @property
    def sps(self):
        start = self.mark if self.ticks > self.burnin else (self.start_time, 0)
        elapsed, steps = self.last[0] - start[0], self.last[1] - start[1]
        return steps / elapsed if self.ticks and steps > 0 and elapsed > 0 else None

    @property
    def mean_return(self):
        return float(np.mean(self.returns[-100:])) if self.returns else None

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
        """A log point: the progress bar's steps/s and mean return, and (with --track) charts/SPS and `logs`."""
        if self.pbar is not None:
            ret = self.mean_return
            self.pbar.set_postfix(sps=f"{self.sps or 0:.0f}", ret="n/a" if ret is None else f"{ret:.1f}", refresh=False)
        if self.wandb:
            self.wandb.log({"charts/SPS": self.sps or 0.0, **(logs or {})}, step=step)

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
        """The handler of SIGINT and SIGTERM while the run is on: stop it, unless it is already ending."""
        self.stop_signal = self.stop_signal or signum
        if self.deferred_stop:
            return
        while frame is not None:  # where the signal is handled, and its callers
            if frame.f_code is Run.__exit__.__code__:
                return  # the run is ending: its checkpoint and results line are being written
            frame = frame.f_back
        self.stop_for(signum)

    def stop_for(self, signum):
        """Stop the run as the signal `signum` does (none if 0): a KeyboardInterrupt, here."""
        if signum:
            self.stop_signal = signum
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
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.stop_signal = self.stop_signal or signal.SIGINT  # a KeyboardInterrupt raised without a signal
            by = "the user" if self.stop_signal == signal.SIGINT else signal.Signals(self.stop_signal).name
            self.status, self.message = "interrupted", f"interrupted by {by}"
        elif kind is not None and issubclass(kind, Diverged):
            self.status, self.message = "diverged", str(err)
            print(f"{self.script}: {self.message}", file=sys.stderr)
        elif kind is not None:
            self.status, self.message = "error", f"{kind.__name__}: {err}"
        save_error = None
        if self.save is not None and self.status in ("ok", "interrupted"):
            try:
                self.save()
            except Exception as error:  # reported in the results line, then raised on
                self.status, self.message = "error", f"saving the model: {type(error).__name__}: {error}"
                save_error = error
        self.curve.close()
        if self.pbar is not None:
            self.pbar.close()
        line = dict(
            self.fields,
            steps=self.steps,
            sps=self.sps,
            wall_s=time.time() - self.start_time,
            mean_return=self.mean_return,
            episodes=len(self.returns),
            status=self.status,
            losses=self.losses,
            message=self.message,
            time=datetime.now(UTC).isoformat(timespec="seconds"),
        )
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

    def summary(self, line):
        """The one line a run prints when it ends: what it did, and where its results line and its folder are."""
        sps = "n/a" if line["sps"] is None else f"{line['sps']:.0f}"
        ret = "n/a" if line["mean_return"] is None else f"{line['mean_return']:.1f}"
        return (
            f"{self.script}: {line['status']}: {line['steps']} steps, {sps} steps/s, mean return {ret} over "
            f"{line['episodes']} episodes; results: {Path(self.args.results_file).resolve()}, "
            f"run folder: {self.dir.resolve()}"
        )
