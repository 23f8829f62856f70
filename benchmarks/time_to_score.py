"""Time to score: wall-clock seconds from launch (imports and compile included) to a published score, one training run.

    benchmarks/time_to_score.sh OUT [pqn|ppo]              # on a GPU machine, one call (the wrapper's header says how)
    python3 benchmarks/time_to_score.py --out runs/time_to_score [--script S] [--target T] [--deadline-s D] [-- FLAGS]
    python3 benchmarks/time_to_score.py --dry-run --out runs/time_to_score_dry   # CPU smoke: tiny sizes, under a minute

It runs one training script (default the PQN Atari twin) as a subprocess in its fast configuration (the script's
module-level FAST_FLAGS, read by importing it: importing a script does no work; a script without one runs at its
defaults) on Breakout-v5, with --compile --cudagraphs where CUDA is available (on a CPU: --compile only if asked), then
FLAGS (after --), with an empty inductor cache (as on a new machine: the whole compile counts; --warm-cache keeps the
one it finds). While the run goes it tails the run's returns.csv (one line a finished game) and stamps each game with
the wall seconds since the process was launched (to within the 0.2 s poll), the env step and the mean of the last 100
games; its own curve, <tag>.curve.csv: wall_s,step,return,last100_mean. When that mean reaches the target (with at
least --min-games games: 100, as the published figures are means of 100 games) or at the deadline, it stops the run
with SIGTERM (the script writes its results line, status interrupted); or the run ends by itself at its
--total-timesteps.

Then it appends one strict-JSON record (kind "time_to_score") to OUT/time_to_score.jsonl: the script, env, flags,
target, reached, seconds_to_score (null if not reached), steps_at_score, the best and the final last-100 mean, the
steps and wall seconds at the end, what stopped the run, the script's own results line (sps: steps/s from its burn-in
to the end; status) and the machine (harness.session_machine(), with the cores this process may use). Also in OUT:
<tag>.log (the run's output) and the run's results file and folder under runs/ (--archive: packed into <tag>.tar.gz).
plots/plot.py --time-to-score OUT/time_to_score.jsonl draws the curves beside the published end points.

Targets (--target overrides): CleanRL's 10M-step Breakout-v5 scores as the spec rounds them, PQN 385 (CleanRL
pqn_atari_envpool 384.85 +- 12.39), PPO 400 (CleanRL's JAX ppo_atari_envpool_xla_jax_scan: 423.90 +- 5.49; the spec's
bar is 400). The published end points: plots/published_time_to_score.csv. pqn_device_env.py (CartPole-v1 as tensors):
475, CartPole solved, on CartPole-v1 (flags after --, e.g. -- --num-envs 4096 on a GPU). On a CPU, beside SB3: DQN, PPO
and PQN to 475 on CartPole-v1, PPO continuous and SAC to 3,000 on HalfCheetah-v4.

--sb3 VENV times SB3 instead, on the same env to the same target: benchmarks/peers/sb3_zoo.py run by VENV/bin/python
(benchmarks/peers/install.sh) with rl-baselines3-zoo's tuned settings for the algorithm of --script (dqn, ppo,
ppo_continuous_action, sac_continuous_action): what an SB3 user runs. It writes a returns.csv and a results line as
our scripts do (its sps: from its start, after its imports; it has no burn-in); the record's script is sb3_zoo.py,
with sb3_algo.

Many agents (--num-seeds N, the device-env files: N independent agents in one process): the target is reached when a
fraction (--solved-fraction, default 0.9) of the N seeds each have a last-100 mean at the target (with --min-games
games) at the same moment; the curve gains each game's seed and the fraction solved then, and last100_mean is the
mean over seeds of each seed's (seeds with a game). The spec's figure: 64 CartPole agents, 90% at 475, within 60 s:

    python3 benchmarks/time_to_score.py --script leanrl/pqn_device_env.py --num-seeds 64 --out runs/time_to_score
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, session_machine  # noqa: E402  (the machine stamp and commit of a session)

DEFAULT_SCRIPT = "leanrl/pqn_atari_envpool_torchcompile.py"
TARGETS = {"pqn_atari_envpool": 385.0, "ppo_atari_envpool": 400.0}  # by pair: the script's name less _torchcompile
TARGETS["pqn_device_env"] = 475.0  # CartPole-v1 solved (issue 44: its env on the device, the score in seconds)
TARGETS["ppo_device_env"] = 475.0  # the same for PPO's (issue 49)
ENVS = {"pqn_device_env": "CartPole-v1", "ppo_device_env": "CartPole-v1"}  # a script's env where not Breakout-v5
# issue 51: time to a score on a CPU, beside SB3 with the zoo's settings (CartPole solved; HalfCheetah 3,000)
CPU_TARGETS = dict(dqn=475.0, ppo=475.0, pqn=475.0, ppo_continuous_action=3000.0, sac_continuous_action=3000.0)
ENVS.update(dqn="CartPole-v1", ppo="CartPole-v1", pqn="CartPole-v1", ppo_continuous_action="HalfCheetah-v4",
            sac_continuous_action="HalfCheetah-v4")  # fmt: skip
SB3_ALGOS = {"dqn": "dqn", "ppo": "ppo", "ppo_continuous_action": "ppo", "sac_continuous_action": "sac"}
SB3_DRIVER = ROOT / "benchmarks" / "peers" / "sb3_zoo.py"
# the dry run: sizes both Atari twins take, a target any finished game reaches (a Breakout score is never negative)
DRY_FLAGS = "--num-envs 2 --num-steps 16 --num-minibatches 2 --update-epochs 1 --total-timesteps 20000"
DRY_FLAGS += " --measure-burnin 1"
DRY = dict(target=0.0, min_games=1, deadline_s=30.0)
POLL_S = 0.2
GRACE_S = 20.0  # after SIGTERM, the run's time to write its results line before a SIGKILL
CURVE_HEADER = "wall_s,step,return,last100_mean\n"
SEEDS_CURVE_HEADER = "wall_s,step,return,last100_mean,seed,solved_fraction\n"


def load_module(path):
    """The script at `path` as a module, without running it (a script's import does no work): its FAST_FLAGS."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks a function's globals up through its module
    spec.loader.exec_module(module)
    return module


def pair_of(script):
    return Path(script).stem.removesuffix("_torchcompile")


class Score:
    """The games as they end: the mean of the last 100, and the first game at which it reaches the target."""

    def __init__(self, target, min_games, curve_path):
        self.target, self.min_games = target, min_games
        self.last = deque(maxlen=100)
        self.games, self.step, self.best, self.at_score = 0, 0, None, None
        self.curve = open(curve_path, "w", buffering=1)  # noqa: SIM115 (closed by close(); line by line: watch it live)
        self.curve.write(CURVE_HEADER)

    def game(self, wall_s, step, episodic_return, seed=None):  # seed: a run of seeds' column (one seed: ignored)
        self.last.append(episodic_return)
        self.games, self.step = self.games + 1, max(self.step, step)
        mean = sum(self.last) / len(self.last)
        self.curve.write(f"{wall_s:.3f},{step},{episodic_return:g},{mean:.6g}\n")
        if self.games >= self.min_games:
            self.best = mean if self.best is None else max(self.best, mean)
            if self.at_score is None and mean >= self.target:
                self.at_score = dict(seconds_to_score=wall_s, steps_at_score=step, games_at_score=self.games,
                                     mean_at_score=mean)  # fmt: skip

    @property
    def mean(self):
        return sum(self.last) / len(self.last) if self.last else None

    def close(self):
        self.curve.close()


class SeedsScore(Score):
    """The games of N seeds as they end: each seed's last 100, the mean over seeds of their means, the fraction of the
    N seeds whose own mean is at the target (with min_games games), and the first game at which that fraction reaches
    solved_fraction."""

    def __init__(self, target, min_games, curve_path, num_seeds, solved_fraction):
        super().__init__(target, min_games, curve_path)
        self.curve.seek(0)
        self.curve.truncate()
        self.curve.write(SEEDS_CURVE_HEADER)
        self.num_seeds, self.solved_fraction = num_seeds, solved_fraction
        self.by_seed, self.games_of = defaultdict(lambda: deque(maxlen=100)), defaultdict(int)
        self.solved, self.best_fraction = set(), 0.0

    def game(self, wall_s, step, episodic_return, seed=None):
        last = self.by_seed[seed]
        last.append(episodic_return)
        self.games_of[seed] += 1
        self.games, self.step = self.games + 1, max(self.step, step)
        own = sum(last) / len(last)
        if self.games_of[seed] >= self.min_games and own >= self.target:
            self.solved.add(seed)
        else:
            self.solved.discard(seed)
        fraction, mean = len(self.solved) / self.num_seeds, self.mean
        self.curve.write(f"{wall_s:.3f},{step},{episodic_return:g},{mean:.6g},{seed},{fraction:.6g}\n")
        self.best = mean if self.best is None else max(self.best, mean)
        self.best_fraction = max(self.best_fraction, fraction)
        if self.at_score is None and fraction >= self.solved_fraction:
            self.at_score = dict(seconds_to_score=wall_s, steps_at_score=step, games_at_score=self.games,
                                 mean_at_score=mean, solved_at_score=fraction)  # fmt: skip

    @property
    def mean(self):
        means = [sum(last) / len(last) for last in self.by_seed.values() if last]
        return sum(means) / len(means) if means else None


class Tail:
    """The complete lines a running script has added to its returns.csv since the last read."""

    def __init__(self, results_dir, before):
        self.results_dir, self.before, self.run_dir, self.file, self.rest = results_dir, before, None, None, ""

    def rows(self):
        if self.file is None:
            new = [d for d in self.results_dir.glob("*/returns.csv") if d.parent.name not in self.before]
            if not new:
                return []
            self.run_dir = min(new, key=lambda p: p.stat().st_mtime).parent  # the run's folder: the new one
            self.file = (self.run_dir / "returns.csv").open()
        text = self.rest + self.file.read()
        *lines, self.rest = text.split("\n")  # the last piece: a line not finished yet (or "")
        out = []
        for line in lines:
            if line and not line.startswith("step"):
                step, _, ret, *seed = line.split(",")  # a run of seeds: a 4th column, the seed
                out.append((int(step), float(ret), *map(int, seed)))
        return out

    def close(self):
        if self.file is not None:
            self.file.close()


def results_line(results_file, run_name):
    """The script's own results line for this run (None if it wrote none: killed, or refused its flags)."""
    if run_name is None or not results_file.exists():
        return None
    for raw in results_file.read_text().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if line.get("run_name") == run_name:
            return line
    return None


def parse(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s [options] [-- FLAGS]")
    parser.add_argument("--script", default=DEFAULT_SCRIPT, help="the training script (default: %(default)s)")
    parser.add_argument("--env-id", help="default: Breakout-v5 (pqn_device_env.py: CartPole-v1)")
    parser.add_argument("--target", type=float, help="the last-100 mean to reach (default: PQN 385, PPO 400, 475)")
    parser.add_argument("--min-games", type=int, help="games before the mean counts (default 100; dry run 1)")
    parser.add_argument("--deadline-s", type=float, help="stop the run this many seconds after launch (default 540)")
    parser.add_argument("--out", default="runs/time_to_score", help="folder of the record, curve, log and run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-seeds", type=int, default=1, help="N agents in one run (pqn_device_env.py): seeds "
                        "--seed .. --seed + N - 1, the target reached by --solved-fraction of them")  # fmt: skip
    parser.add_argument("--solved-fraction", type=float, default=0.9, help="with --num-seeds: the fraction of seeds "
                        "that must be at the target at once (default %(default)s)")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="on a CPU: add --compile (on a GPU it always is)")
    parser.add_argument("--warm-cache", action="store_true", help="keep inductor's cache (default: an empty one, as "
                        "on a bare machine: the compile counts in full)")  # fmt: skip
    parser.add_argument("--archive", action="store_true", help="pack the run's folder into OUT/<tag>.tar.gz")
    parser.add_argument("--dry-run", action="store_true", help=f"CPU smoke: {DRY_FLAGS}, target 0, 1 game, 30 s")
    parser.add_argument("--sb3", metavar="VENV", type=Path, help="time SB3 (zoo settings) on the algorithm of --script "
                        "instead, from VENV (benchmarks/peers/install.sh)")  # fmt: skip
    args = parser.parse_args(argv)
    target = TARGETS.get(pair_of(args.script), CPU_TARGETS.get(pair_of(args.script)))
    defaults = DRY if args.dry_run else dict(target=target, min_games=100, deadline_s=540.0)
    defaults = dict(defaults, env_id=ENVS.get(pair_of(args.script), "Breakout-v5"))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.target is None:
        parser.error(f"no published target for {args.script}: give --target")
    if not (ROOT / args.script).is_file() and not Path(args.script).is_file():
        parser.error(f"--script {args.script}: no such file")
    if args.sb3 is not None and (pair_of(args.script) not in SB3_ALGOS or not (args.sb3 / "bin" / "python").exists()):
        parser.error(f"--sb3 {args.sb3}: give a venv made by benchmarks/peers/install.sh, and a --script of "
                     f"{', '.join(SB3_ALGOS)}")  # fmt: skip
    if args.deadline_s <= 0 or args.min_games < 1:
        parser.error("--deadline-s must be positive and --min-games at least 1")
    if args.num_seeds < 1 or not 0 < args.solved_fraction <= 1:
        parser.error("--num-seeds must be at least 1 and --solved-fraction in (0, 1]")
    return args, extra


def main(argv=None):
    args, extra = parse(argv)
    script = Path(args.script) if Path(args.script).is_file() else ROOT / args.script
    script = script.resolve()
    sb3 = SB3_ALGOS[pair_of(script)] if args.sb3 is not None else None
    # None: a script without one runs at its defaults; SB3 runs the zoo's settings
    fast = None if sb3 else getattr(load_module(script), "FAST_FLAGS", None)
    fast_flags = shlex.split(fast or "")
    info = session_machine()  # before the launch: the harness's imports and CUDA context are not the run's
    info.pop("kind")
    info["cores"] = len(os.sched_getaffinity(0))  # the cores this process (and the run) may use
    cuda = info["device"] != "cpu" and not args.dry_run
    variant = ["--compile", "--cudagraphs"] if cuda else ["--compile", "--no-cuda"] if args.compile else ["--no-cuda"]
    dry = shlex.split(DRY_FLAGS) if args.dry_run else []
    out = Path(args.out).resolve()
    results_dir = out / "runs"
    results_dir.mkdir(parents=True, exist_ok=True)
    results_file = results_dir / "results.jsonl"
    seeds = ["--num-seeds", str(args.num_seeds)] if args.num_seeds > 1 else []
    flags = ["--seed", str(args.seed), *seeds, "--env-id", args.env_id, *fast_flags, *variant, *dry, *extra]
    python = sys.executable
    if sb3:  # SB3's driver in its venv: no variant flags, the dry run a short budget
        flags = ["--algo", sb3, "--seed", str(args.seed), "--env-id", args.env_id]
        flags += ["--total-timesteps", "2000"] if args.dry_run else []
        python, script = str(args.sb3 / "bin" / "python"), SB3_DRIVER
    cmd = [python, str(script), *flags, "--results-file", str(results_file)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE=os.environ.get("WANDB_MODE", "disabled"))
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")  # a small CPU: torch's threads spinning against envpool's cost 10x
    cache = None if args.warm_cache else tempfile.mkdtemp(prefix="time-to-score-inductor-")
    if cache:  # cold: what a first run on a new machine compiles, launch to score
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    tag = f"{'sb3_' + sb3 if sb3 else pair_of(script)}_{time.strftime('%Y%m%d-%H%M%S')}"
    tag = next(t for t in (tag, *(f"{tag}-{n}" for n in range(2, 100))) if not (out / f"{t}.log").exists())
    score = (
        SeedsScore(args.target, args.min_games, out / f"{tag}.curve.csv", args.num_seeds, args.solved_fraction)
        if args.num_seeds > 1
        else Score(args.target, args.min_games, out / f"{tag}.curve.csv")
    )
    tail = Tail(results_dir, {d.name for d in results_dir.iterdir()})
    what = f"target {args.target:g} over {args.min_games}+ games, deadline {args.deadline_s:g} s"
    if args.num_seeds > 1:
        what = f"{args.num_seeds} seeds, {args.solved_fraction:g} of them at a {what}"
    print(f"time_to_score: {script.name} {shlex.join(flags)}; {what}; {info['device']}, {info['cpu']} "
          f"({info['cores']} cores)", flush=True)  # fmt: skip
    stopped_by, stop_sent, exit_at = None, None, None

    def harness_stopped(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, harness_stopped)
    with open(out / f"{tag}.log", "w") as log:
        launch = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                ended = proc.poll() is not None
                now = time.time() - launch
                if ended:
                    exit_at = now
                for row in tail.rows():  # after the exit: stamped with the exit, a bound
                    score.game(now, *row)
                if ended:
                    break
                if stop_sent is None and (score.at_score or now >= args.deadline_s):
                    stopped_by = "target" if score.at_score else "deadline"
                    stop_sent = now
                    proc.send_signal(signal.SIGTERM)
                elif stop_sent is not None and now > stop_sent + GRACE_S:
                    proc.kill()
                time.sleep(POLL_S)
        except KeyboardInterrupt:  # the harness was stopped: so is the run, and the record says so
            stopped_by = "harness"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            exit_at = time.time() - launch
            for row in tail.rows():
                score.game(exit_at, *row)
        finally:
            signal.signal(signal.SIGTERM, previous)
    score.close()
    tail.close()
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    run_name = tail.run_dir.name if tail.run_dir else None
    line = results_line(results_file, run_name)
    if stopped_by is None:
        stopped_by = "total-timesteps" if proc.returncode == 0 else "exited"
    seeds_fields = {}
    if args.num_seeds > 1:  # the fraction of seeds at the target at the end, and the most at once
        seeds_fields = dict(num_seeds=args.num_seeds, solved_fraction=args.solved_fraction,
                            solved_at_end=len(score.solved) / args.num_seeds,
                            best_solved=score.best_fraction)  # fmt: skip
    record = dict(
        kind="time_to_score",
        script=script.name,
        sb3_algo=sb3,
        env_id=args.env_id,
        flags=shlex.join(flags),
        fast_flags=fast,
        target=args.target,
        min_games=args.min_games,
        deadline_s=args.deadline_s,
        reached=score.at_score is not None,
        **(score.at_score or dict.fromkeys(("seconds_to_score", "steps_at_score", "games_at_score", "mean_at_score"))),
        best_last100=score.best,
        last100_at_end=score.mean,
        **seeds_fields,
        games=score.games,
        steps_at_end=line["steps"] if line else score.step,
        wall_s_at_end=exit_at,
        stopped_by=stopped_by,
        exit_code=proc.returncode,
        results={k: line.get(k) for k in ("status", "sps", "steps", "wall_s", "mean_return", "episodes", "message")}
        if line
        else None,
        run_name=run_name,
        curve=f"{tag}.curve.csv",
        log=f"{tag}.log",
        dry_run=args.dry_run,
        machine=info,
        cold_cache=cache is not None,
        inductor_env={
            k: v for k, v in sorted(env.items()) if k.startswith("TORCHINDUCTOR_") and k != "TORCHINDUCTOR_CACHE_DIR"
        },
        command=shlex.join(["benchmarks/time_to_score.py", *(argv if argv is not None else sys.argv[1:])]),
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    if line is None:  # no results line: the run's last words say why
        record["log_tail"] = (out / f"{tag}.log").read_text(errors="replace").splitlines()[-5:]
    if args.archive:
        with tarfile.open(out / f"{tag}.tar.gz", "w:gz") as tar:
            tar.add(results_dir, arcname="runs")
        shutil.rmtree(results_dir)
    with open(out / "time_to_score.jsonl", "a") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")
    of_seeds = f" ({args.solved_fraction:g} of {args.num_seeds} seeds)" if args.num_seeds > 1 else ""
    got = (
        f"{record['seconds_to_score']:.1f} s to {args.target:g}{of_seeds} at {record['steps_at_score']:,} steps"
        if record["reached"]
        else f"not reached: last-100 mean {record['last100_at_end']} at the end ({stopped_by})"
    )
    if line is None:
        print(f"time_to_score: the run wrote no results line (exit {proc.returncode}): {record['log_tail'][-1:]}")
    sps = (line or {}).get("sps")
    print(f"time_to_score: {script.name}: {got}; {record['steps_at_end']:,} steps in {exit_at:.1f} s, "
          f"{'n/a' if sps is None else f'{sps:,.0f}'} steps/s; record: {out / 'time_to_score.jsonl'}")  # fmt: skip
    return 0 if line is not None else 1


if __name__ == "__main__":
    sys.exit(main())
