"""PPO Atari, data-parallel: two gloo ranks against one process, torchrun end to end on CPU, dead and hung ranks,
ranks stopped by SIGTERM."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
from conftest import (
    GRACE,
    ROOT,
    assert_checkpoint_evaluates,
    assert_finite_results_line,
    assert_stopped_run,
    assert_summary_matches,
    curve_points,
    load_script,
    main_in_process,
    run_script,
    started_runs,
    stop,
    strict_json,
    summary_of,
)
from test_resume import assert_same
from torch._dynamo.utils import counters

from leanrl import bookkeeping as bk

DIST, TWIN = "ppo_atari_envpool_distributed", "ppo_atari_envpool_torchcompile"
HYPER = dict(clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True, max_grad_norm=0.5)


# ---------------------------------------------------------------- the averaged gradient

T, ENVS, RANKS = 4, 8, 2  # one process with 8 envs against two ranks with 4 each
LOCAL = ENVS // RANKS


def rollout_of_8_envs(iteration):
    """A (T, 8 envs) rollout, and one minibatch: 8 random steps of each rank's 4 envs (local and global indices)."""
    g = torch.Generator().manual_seed(iteration)
    obs = torch.randint(0, 256, (T, ENVS, 4, 84, 84), generator=g, dtype=torch.uint8)
    actions = torch.randint(0, 4, (T, ENVS), generator=g)
    logprobs = -torch.rand(T, ENVS, generator=g) * 2 - 0.5
    # advantages with a non-zero mean that differs between the ranks' envs: a per-rank normalization would show
    advantages = torch.randn(T, ENVS, generator=g) + torch.linspace(-1.0, 2.0, ENVS)
    returns, values = torch.randn(T, ENVS, generator=g), torch.randn(T, ENVS, generator=g)
    local = [torch.randperm(T * LOCAL, generator=g)[: T * LOCAL // 2] for _ in range(RANKS)]
    # flat (T, B) index: step t, env b of rank r is t * LOCAL + b on its rank, t * ENVS + r * LOCAL + b in one process
    global_inds = torch.cat([(i // LOCAL) * ENVS + r * LOCAL + i % LOCAL for r, i in enumerate(local)])
    return (obs, actions, logprobs, advantages, returns, values), local, global_inds


def agent_and_optimizer(module):
    torch.manual_seed(0)  # the same weights in every process
    agent = module.Agent(4)
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(2.5e-4), eps=1e-5, fused=True)
    return agent, optimizer


# the update returns its logged numbers as one stacked tensor, in this order (the scripts' LOSSES)
LOSSES = ("loss", "policy", "value", "entropy", "old_approx_kl", "approx_kl", "clipfrac")


def snapshot(agent, losses):
    return dict(
        grads=[p.grad.clone() for p in agent.parameters()],
        params=[p.detach().clone() for p in agent.parameters()],
        losses=dict(zip(LOSSES, losses.tolist(), strict=True)),
    )


ITERATIONS = 3


def update_on_rank(rank, init_file, out_dir):
    """One rank (spawned): the distributed script's update on its 4 envs' share of each minibatch."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=RANKS)
    module = load_script(DIST)
    agent, optimizer = agent_and_optimizer(module)
    steps = []
    for iteration in range(ITERATIONS):
        share = rank_share(iteration, rank)
        losses = module.update(agent, optimizer, *share, **HYPER, world_size=RANKS)
        steps.append(snapshot(agent, losses))

    # the first step again, compiled: the graphs dynamo makes are run as traced (no inductor: quick), and kept
    graphs = []

    def keeping_backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    agent, optimizer = agent_and_optimizer(module)
    losses = torch.compile(module.update, backend=keeping_backend)(
        agent, optimizer, *rank_share(0, rank), **HYPER, world_size=RANKS
    )
    breaks = {reason.splitlines()[0]: count for reason, count in counters["graph_break"].items()}
    compiled = dict(snapshot(agent, losses), graphs=graphs, breaks=breaks)

    # an iteration's end where rank 1 alone got SIGTERM and rank 0 alone is due to write the training state
    agreed = module.agree_to_stop(signal.SIGTERM if rank == 1 else 0, rank == 0, torch.device("cpu"))
    torch.manual_seed(100 + rank)
    rngs = module.rngs_of_ranks(RANKS)
    torch.save(dict(steps=steps, compiled=compiled, agreed=agreed, rngs=rngs), Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def rank_share(iteration, rank):
    """A rank's storage (its 4 envs) flattened as the script flattens it, and its minibatch indices."""
    batch, local, _ = rollout_of_8_envs(iteration)
    return *(x[:, rank * LOCAL : (rank + 1) * LOCAL].flatten(0, 1) for x in batch), local[rank]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_ranks")
    mp.spawn(update_on_rank, args=(str(tmp / "rendezvous"), str(tmp)), nprocs=RANKS)
    return [torch.load(tmp / f"rank{rank}.pt") for rank in range(RANKS)]


def test_the_ranks_agree_on_stopping_and_on_writing_the_state_and_gather_their_rngs_in_rank_order(two_ranks):
    """Rank 1 alone got SIGTERM and rank 0 alone is due to write its state (--checkpoint-every-min): both stop with
    SIGTERM and both write (the state gathers from every rank: a rank that does not come leaves the others waiting).
    Every rank holds rank r's RNGs at place r."""
    seeded = [torch.Generator().manual_seed(100 + rank).get_state() for rank in range(RANKS)]
    for rank in two_ranks:
        assert rank["agreed"] == [signal.SIGTERM, 1]
        assert [torch.equal(rng["torch"], want) for rng, want in zip(rank["rngs"], seeded)] == [True] * RANKS


def test_the_updates_name_their_numbers_alike():
    assert load_script(DIST).LOSSES == load_script(TWIN).LOSSES == LOSSES


def test_two_ranks_compute_the_gradient_of_one_process_with_all_envs(two_ranks):
    """Same minibatch data: the ranks' averaged (and clipped) gradient and their losses are those of the twin's update
    in one process with the 8 envs; so are the weights after each Adam step."""
    twin = load_script(TWIN)
    agent, optimizer = agent_and_optimizer(twin)
    for iteration in range(ITERATIONS):
        batch, _, global_inds = rollout_of_8_envs(iteration)
        want = snapshot(agent, twin.update(agent, optimizer, *(x.flatten(0, 1) for x in batch), global_inds, **HYPER))
        for got in (rank["steps"][iteration] for rank in two_ranks):
            for g, w in zip(got["grads"], want["grads"]):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
            for g, w in zip(got["params"], want["params"]):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
            assert got["losses"] == pytest.approx(want["losses"], rel=1e-4, abs=1e-6)
    # the check bites: the gradient was clipped (by its global norm) and the weights moved
    assert want["losses"]["clipfrac"] > 0
    norm = torch.cat([g.flatten() for g in want["grads"]]).norm()
    torch.testing.assert_close(norm, torch.tensor(HYPER["max_grad_norm"]), rtol=1e-3, atol=0)


def test_ranks_keep_bitwise_equal_weights(two_ranks):
    """Different data on each rank, the same averaged gradient: the same bits after every step."""
    rank0, rank1 = (rank["steps"] for rank in two_ranks)
    for a, b in zip(rank0, rank1):
        assert a["losses"] == b["losses"]
        for pa, pb, ga in zip(a["params"], b["params"], a["grads"]):
            assert torch.equal(pa, pb)
            assert ga.abs().sum() > 0
    assert not torch.equal(rank0[0]["params"][0], rank0[-1]["params"][0])


def test_the_collectives_run_inside_the_compiled_update(two_ranks):
    """Compiled, the update breaks only where the twin's does (PyTorch's own breaks around backward() and the
    optimizer step); the advantage statistics are gathered inside the forward graph and the flat all-reduce runs
    inside the graph after backward(). The compiled step computes the eager step's gradient."""
    for rank in two_ranks:
        compiled, eager = rank["compiled"], rank["steps"][0]
        assert compiled["breaks"] == {  # as pinned for the twin in test_ppo_atari_envpool.py
            "Unsupported Tensor.backward() call": 1,
            "Call to `torch._dynamo.graph_break()`": 2,
            "Skip calling `torch.compiler.disable()`d function": 2,
        }, compiled["breaks"]
        # the stats are stacked before the all-reduce, so nothing is left after the optimizer step for a third graph
        forward, after_backward = compiled["graphs"]
        assert "_c10d_functional.all_gather_into_tensor" in forward and "all_reduce" not in forward
        assert "_c10d_functional.all_reduce" in after_backward and "wait_tensor" in after_backward
        assert "clamp" in after_backward  # the clipping follows the all-reduce in the same graph
        for got, want in zip(compiled["grads"], eager["grads"]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
        assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-5, abs=1e-7)


# ---------------------------------------------------------------- torchrun end to end


def torchrun(*flags, tmp_path, nproc=2, wait=True, program=None):
    """Launch the distributed script (or `program`, which runs its main) with torchrun on CPU, its results file in
    tmp_path.

    Returns (completed process, list of results lines); with wait=False, (Popen, results file).
    """
    results = Path(tmp_path) / "results.jsonl"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    cmd += [str(program or ROOT / "leanrl" / f"{DIST}.py"), "--no-cuda", "--results-file", str(results), *flags]
    if not wait:
        return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    lines = [strict_json(line) for line in results.read_text().splitlines()] if results.exists() else []
    return proc, lines


# two ranks of 2 envs, 16 steps: a global batch of 64 steps, two iterations of 2 minibatches
TINY = ("--local-num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1")
TINY += ("--total-timesteps", "128", "--measure-burnin", "1")
VARIANTS = {"eager": ("--save-model",), "--compile": ("--compile",)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{variant: (tmp dir, process, results lines)}, the two variants side by side."""

    def run(variant):
        tmp = tmp_path_factory.mktemp(variant.replace("-", "") or "eager")
        return (tmp, *torchrun(*TINY, *VARIANTS[variant], tmp_path=tmp))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VARIANTS, pool.map(run, VARIANTS)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_torchrun_writes_one_results_line_with_the_global_steps(runs, variant):
    tmp, proc, lines = runs[variant]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines  # rank 0 alone writes
    assert_finite_results_line(line, DIST)
    assert line["world_size"] == 2 and line["compile"] is (variant == "--compile")
    assert line["steps"] == 128  # 2 ranks x 2 envs x 16 steps x 2 iterations
    assert line["total_timesteps"] == 128
    assert_summary_matches(proc.stdout, line, tmp / "results.jsonl")  # one summary line: rank 1 prints none
    assert [d.name for d in tmp.iterdir() if d.is_dir()] == [line["run_name"]]  # one run folder, rank 0's
    assert (tmp / line["run_name"] / "returns.csv").read_text().startswith("step,wall_s,return\n")
    if "--save-model" in VARIANTS[variant]:  # rank 0's checkpoint, with the global and the per-rank env counts
        checkpoint = torch.load(tmp / line["run_name"] / f"{DIST}.pt", map_location="cpu")
        assert (checkpoint["args"]["num_envs"], checkpoint["args"]["local_num_envs"]) == (4, 2)
        assert set(checkpoint["model"]) >= {"actor.weight", "critic.weight"}


def test_compiled_ranks_learn_like_eager_ranks(runs):
    """The collectives inside the compiled update compute what the eager ones do: same actions (same seeds), same
    averaged losses to float32 rounding."""
    eager, compiled = runs["eager"][2][0], runs["--compile"][2][0]
    for name, value in eager["losses"].items():
        assert compiled["losses"][name] == pytest.approx(value, rel=1e-3, abs=1e-6), name


# ---------------------------------------------------------------- one process is the twin


def test_without_torchrun_it_is_the_twin(tmp_path):
    """World size 1, same seed: the same envs, actions, games and losses as the twin, bit for bit."""
    # two envs, two iterations of 128 steps: Breakout games end (seed 1: two of them, one scoring)
    flags = ("--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "1")
    flags += ("--total-timesteps", "512", "--measure-burnin", "1")

    def run(name):
        tmp = tmp_path / name
        tmp.mkdir()
        proc, lines = run_script(name, *flags, tmp_path=tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = lines
        return tmp, line

    with ThreadPoolExecutor(max_workers=2) as pool:
        (tmp, line), (twin_tmp, twin_line) = pool.map(run, (DIST, TWIN))
    assert_finite_results_line(line, DIST)
    assert line["world_size"] == 1 and line["steps"] == 512
    assert line["losses"] == twin_line["losses"]
    assert (line["episodes"], line["mean_return"]) == (twin_line["episodes"], twin_line["mean_return"])
    assert curve_points(line, tmp) == curve_points(twin_line, twin_tmp)
    assert any(score > 0 for _, score in curve_points(line, tmp)), "no game scored: compare something that can differ"


# ---------------------------------------------------------------- a dead or hung rank


def rank_pids(launcher_pid):
    """{RANK: pid} of the worker processes torchrun started."""
    pids = {}
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (proc / "environ").read_bytes().split(b"\0") if parent == launcher_pid else []
        except (OSError, ValueError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                pids[int(item[5:])] = int(proc.name)
    return pids


TIMEOUT = 6


# CI: each way of failing once and each rank once as the survivor (rank 0 killed, rank 1 hung); the other two -m slow
DEAD_OR_HUNG = [("killed", 1), ("killed", 0), ("hung", 1), ("hung", 0)]
SLOW = {("killed", 1), ("hung", 0)}


@pytest.mark.parametrize(
    "how,victim",
    [pytest.param(*case, marks=[pytest.mark.slow] if case in SLOW else []) for case in DEAD_OR_HUNG],
    ids=[f"{how}-rank{victim}" for how, victim in DEAD_OR_HUNG],
)
def test_a_dead_or_hung_rank_ends_the_run_with_an_error_line(how, victim, tmp_path):
    """A rank is killed (SIGKILL) or hangs (SIGSTOP) mid-run: the other stops within --dist-timeout and writes status
    error, also when the victim is rank 0, which writes the run's line when all goes well. Killed, its socket closes
    and the survivor's next collective fails at once (or torchrun stops it); hung, the collective times out. The two
    -m slow cases took 19 s (rank 1 killed) and 26 s (rank 0 hung) in a cold run of the suite on a 2-core AMD EPYC."""
    survivor = 1 - victim
    budget = ("--total-timesteps", "1000000", "--dist-timeout", str(TIMEOUT))
    launcher = torchrun(*TINY[:-4], *budget, tmp_path=tmp_path, wait=False)
    try:
        deadline = time.time() + 120
        # rank 0 is past the weight broadcast, into the rollouts: a game of its envs ended (the curve is made when the
        # run starts, before the ranks join; its first row comes from the rollouts)
        while not [curve for curve in tmp_path.glob("*/returns.csv") if len(curve.read_text().splitlines()) > 1]:
            assert launcher.poll() is None and time.time() < deadline, launcher.communicate()
            time.sleep(0.2)
        time.sleep(1.0)
        ranks = rank_pids(launcher.pid)
        assert set(ranks) == {0, 1}, ranks
        os.kill(ranks[victim], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        stopped = time.time()
        results = tmp_path / "results.jsonl"
        while not results.exists():
            assert time.time() - stopped < TIMEOUT + 20, f"rank {survivor} still waits on the dead rank"
            time.sleep(0.1)
        waited = time.time() - stopped
        time.sleep(0.5)  # the survivor's summary line follows its results line
        if how == "hung":
            os.kill(ranks[victim], signal.SIGKILL)  # torchrun's SIGTERM waits on a stopped process
        stdout, _ = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode != 0
    (line,) = [strict_json(text) for text in results.read_text().splitlines()]  # the survivor's; none from the victim
    assert line["status"] == "error" and line["world_size"] == 2 and line["rank"] == survivor, line
    assert 0 < line["steps"] < 1000000 and line["steps"] % 4 == 0 and line["message"]
    assert summary_of(stdout)["status"] == "error"
    if how == "hung":
        assert TIMEOUT - 1 < waited < TIMEOUT + 10, waited
        assert "Timed out" in line["message"], line["message"]
    else:
        assert waited < TIMEOUT, waited  # no need to wait for the timeout: the peer's socket closed


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("launch", ["torchrun", "ranks"])
def test_sigterm_stops_every_rank_with_the_line_curve_and_checkpoint(launch, tmp_path):
    """SIGTERM mid-run, as a scheduler stops a job. torchrun: the launcher gets it (Kubernetes signals a pod's first
    process) and forwards it to each rank. ranks: the ranks started by hand, as srun starts them, and only rank 1 gets
    it: rank 0 stops with it all the same, at the same iteration. Every rank stops within seconds, without a traceback;
    rank 0 writes the results line (status interrupted), its curve and the --save-model checkpoint, which
    --eval-checkpoint plays in one process."""
    results = tmp_path / "results.jsonl"
    script = [str(ROOT / "leanrl" / f"{DIST}.py"), "--no-cuda", "--results-file", str(results), *TINY[:-4]]
    script += ["--total-timesteps", "1000000", "--save-model"]
    logs = tmp_path / "logs"  # torchrun's: each rank's stdout and stderr apart from the launcher's own
    if launch == "torchrun":
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        cmds = [([*torchrun, "--log-dir", str(logs), "--redirects", "3", *script], {})]
    else:
        where = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        cmds = [([sys.executable, *script], dict(where, RANK=str(r), LOCAL_RANK=str(r))) for r in range(2)]
    with started_runs(cmds, tmp_path) as procs:
        outputs, seconds = stop(procs, signal.SIGTERM, signalled=procs[-1:])  # the launcher, or rank 1
    assert seconds < GRACE, seconds
    if launch == "torchrun":  # (torchrun itself ends with its SignalException's traceback)
        outputs = [
            (err.with_name("stdout.log").read_text(), err.read_text()) for err in sorted(logs.glob("**/stderr.log"))
        ]
    else:
        assert [proc.returncode for proc in procs] == [143, 143], outputs
    assert len(outputs) == 2 and "Traceback" not in outputs[1][1] and "results:" not in outputs[1][0], outputs[1]
    line = assert_stopped_run(*outputs[0], results, signal.SIGTERM, DIST)
    assert line["world_size"] == 2 and line["rank"] == 0 and line["steps"] % 4 == 0
    (tmp_path / "eval").mkdir()
    assert_checkpoint_evaluates(DIST, tmp_path / line["run_name"] / f"{DIST}.pt", tmp_path / "eval", episodes=1)


# ---------------------------------------------------------------- a stopped run goes on (issue 41)

# the script's main run by torchrun, then each rank's RNGs saved: what the rank draws from next
RNG_AFTER_MAIN = f"""
import os, sys, torch, tyro
sys.path.insert(0, {str(ROOT)!r})
from leanrl import bookkeeping as bk, ppo_atari_envpool_distributed as script
script.main(tyro.cli(script.Args, args=sys.argv[1:]))
torch.save(bk.rng_state(), f"rng_after_main_{{os.environ['RANK']}}.pt")
"""


def rngs_after_main(folder):
    return [torch.load(Path(folder) / f"rng_after_main_{rank}.pt", weights_only=True) for rank in range(2)]


def test_the_ranks_write_one_state_with_each_ranks_rngs_and_each_takes_its_own_back(tmp_path):
    """Two gloo ranks, a state written at every iteration's end (--checkpoint-every-min: the ranks agree on when, or
    the gather waits for a rank that does not come) and at the loop's end: the state holds each rank's RNGs as that
    rank left them. Two resumes of it in new processes, 2 iterations more, give the same numbers; a resume at its
    total gives each rank its own RNGs back (a rank given another's, or none, fails); one process refuses it."""
    program = tmp_path / "rng_after_main.py"
    program.write_text(RNG_AFTER_MAIN)
    every_iteration = ("--checkpoint-every-min", "1e-6", "--dist-timeout", "60")
    first = tmp_path / "first"
    first.mkdir()
    proc, [line] = torchrun(*TINY, *every_iteration, tmp_path=first, program=program)
    assert proc.returncode == 0 and line["status"] == "ok" and line["resumed"] == 0, proc.stderr[-3000:]
    assert proc.stdout.count("training state saved") == 3  # iterations 1 and 2, and the loop's end
    state = torch.load(first / line["run_name"] / bk.STATE_FILE, weights_only=True)
    assert state["run"]["iterations"] == 2 and state["state"]["global_step"] == 128
    rngs = state["state"]["rngs"]
    assert_same(rngs, rngs_after_main(first), "each rank's RNGs, in rank order")
    assert not torch.equal(rngs[0]["torch"], rngs[1]["torch"])  # seeded seed + rank

    def resume(name):  # a copy of the run folder, resumed for 2 iterations more
        folder = tmp_path / name
        shutil.copytree(first / line["run_name"], folder / line["run_name"])
        flags = ("--resume", str(folder / line["run_name"]), "--total-timesteps", "256")
        return folder, *torchrun(*flags, tmp_path=folder, program=program)

    with ThreadPoolExecutor(max_workers=2) as pool:
        resumed = list(pool.map(resume, ["a", "b"]))
    for folder, proc, lines in resumed:
        assert proc.returncode == 0, proc.stderr[-3000:]
        [again] = lines
        assert again["status"] == "ok" and again["resumed"] == 1 and again["steps"] == 256, again
        state = torch.load(folder / line["run_name"] / bk.STATE_FILE, weights_only=True)
        assert_same(state["state"]["rngs"], rngs_after_main(folder), "each rank's RNGs after the resume")
    (a, _, [line_a]), (b, _, [line_b]) = resumed
    assert line_a["losses"] == line_b["losses"] and line_a["mean_return"] == line_b["mean_return"]
    states = [torch.load(f / line["run_name"] / bk.STATE_FILE, weights_only=True)["state"] for f in (a, b)]
    assert_same(*states, "two resumes of one state")
    assert not torch.equal(states[0]["rngs"][0]["torch"], states[0]["rngs"][1]["torch"])  # each rank drew its own

    # the first state resumed at its total: each rank restores its RNGs and has nothing to do
    proc, lines = torchrun("--resume", str(first / line["run_name"]), tmp_path=first, program=program)
    assert proc.returncode == 0 and "already at its total" in proc.stdout and lines == [line], proc.stderr[-3000:]
    assert_same(rngs_after_main(first), rngs, "each rank's own RNGs, restored")

    proc, _ = run_script(DIST, "--resume", str(a / line["run_name"]), tmp_path=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"{DIST}.py: error: --resume: the run ran on 2 ranks: resume it on as many, not 1"
    ], proc.stderr


# ---------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def dist_module():
    return load_script(DIST)


@pytest.mark.parametrize(
    "flags,world_size,message",
    [
        (dict(num_envs=3), 2, "--num-envs 3 does not divide by the world size 2"),
        (dict(local_num_envs=0), 2, "--local-num-envs must be positive, got 0"),
        (dict(backend="nccl"), 1, "--backend 'nccl' is not available on this machine"),
        (dict(backend="mpi"), 2, "--backend 'mpi' is not available on this machine"),
        (dict(cudagraphs=True), 2, "--cudagraphs needs CUDA, and none is available"),
        (dict(num_envs=4, num_minibatches=3, num_steps=16), 2, "does not divide the batch of 32 steps per rank"),
        (dict(learning_rate=-1.0), 2, "--learning-rate must be positive, got -1.0"),
        (dict(results_file="."), 2, "--results-file . is a folder, not a file"),
        (
            dict(results_file=str(ROOT / "README.md" / "results.jsonl")),
            2,
            f"{ROOT / 'README.md'} is a file, not a folder",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_from_rank_0(dist_module, flags, world_size, message, monkeypatch, capsys):
    """Every rank sees the same flags and stops before joining the others (so none waits on the rest); rank 0
    alone prints the line."""
    for rank in range(world_size):
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        monkeypatch.setenv("RANK", str(rank))
        args = dist_module.Args(cuda=False, total_timesteps=1024, **flags)
        with pytest.raises(SystemExit) as exit_info:
            dist_module.main(args)
        assert exit_info.value.code == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        if rank == 0:
            assert len(err) == 1 and err[0].startswith(f"{DIST}.py: error: ") and message in err[0], err
        else:
            assert err == []


@pytest.mark.parametrize(
    "flags,message",
    [
        (dict(), "2 ranks on this machine but 1 GPUs: NCCL needs a GPU per rank"),
        (dict(backend="gloo", cudagraphs=True), "--cudagraphs needs the nccl backend"),
    ],
)
def test_bad_gpu_layout_exits_2_before_joining(dist_module, flags, message, monkeypatch, capsys):
    """On a (pretended) one-GPU machine, two NCCL ranks, or a CUDA-graphed gloo all-reduce, are refused up front."""
    monkeypatch.setattr(dist_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist_module.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist_module.dist, "is_backend_available", lambda backend: True)
    for name, value in dict(WORLD_SIZE="2", RANK="0", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        dist_module.check_args(dist_module.Args(total_timesteps=1024, **flags))
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and message in err[0], err


def test_bad_input_under_torchrun_stops_every_rank_with_one_line(tmp_path):
    start = time.time()
    proc, lines = torchrun("--num-envs", "3", "--num-steps", "16", "--total-timesteps", "128", tmp_path=tmp_path)
    assert proc.returncode != 0 and lines == []
    # torchrun adds its own report of the failed ranks; the script's line is there once, from rank 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith(f"{DIST}.py: error:")]
    assert ours == [f"{DIST}.py: error: --num-envs 3 does not divide by the world size 2"], ours
    assert "exitcode  : 2" in proc.stderr
    assert time.time() - start < 60


# ---------------------------------------------------------------- one process on the GPU path

# one process of 2 envs, 16 steps, 2 minibatches a iteration: 4 iterations, so the GAE graph (once an iteration,
# warmup=3) is captured and replayed too under --cudagraphs
ONE = ("--local-num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1")
ONE += ("--total-timesteps", "128", "--measure-burnin", "1")

# Every read of a tensor to the host in that run, by script line (as pinned for the twin in test_ppo_atari_envpool.py):
# the action of each env step, to step the envs (64; .numpy() of the host copy reads nothing more, counted on the
# same line); the logged numbers, once an iteration in one read, where the losses are checked (4); Adam's
# constructor's check of its tensor lr, once before the loop (1); numpy's view of the step upload's host buffer, made
# once (1: .numpy() of a host tensor, no sync).
DIST_HOST_READS = {
    "cpu at ppo_atari_envpool_distributed.py: env_groups[group].send(action.cpu().numpy())": 64,
    "numpy at ppo_atari_envpool_distributed.py: env_groups[group].send(action.cpu().numpy())": 64,
    "tolist at ppo_atari_envpool_distributed.py: *logged, explained_var = torch.cat(logged).tolist()": 4,
    "__bool__ at ppo_atari_envpool_distributed.py: optimizer = optim.Adam(": 1,
    "numpy at ppo_atari_envpool_distributed.py: host = staging.numpy()  # numpy's views of it, made once (a host "
    "tensor's: no sync)": 1,
}

# Its copies of host data to the device in that run, by line (tests/gpu_standin.py uploads()), as the twin's
# (test_ppo_atari_envpool.py): one copy an env step (64), the reset's obs (1); and, counted as made of host data though
# it stays on the host, numpy's RNG keys as a tensor when run.resume reads run.state (rngs_of_ranks) once (1)
DIST_UPLOADS = {
    f"non_blocking copy_ at {DIST}.py: received[step + 1, columns].copy_(staging[columns], non_blocking=True) from the "
    f"buffer made at {DIST}.py: staging = torch.zeros(received.shape[1:], dtype=torch.uint8, "
    'pin_memory=device.type == "cuda")': 64,
    f"from host data at {DIST}.py: obs[-1] = torch.as_tensor(np.concatenate([envs.reset()[0] for envs in env_groups]),"
    " device=device)": 1,
    "from host data at bookkeeping.py: state = dict(python=random.getstate(), numpy=(name, torch.from_numpy(keys."
    "astype(np.int64)), pos, has_gauss, gauss))": 1,
}


@pytest.fixture
def dist_settings():
    """The script switches argument validation off and TF32 on for the process: leave the other tests as they were."""
    validate, precision = torch.distributions.Distribution._validate_args, torch.get_float32_matmul_precision()
    yield load_script(DIST)
    torch.distributions.Distribution.set_default_validate_args(validate)
    torch.set_float32_matmul_precision(precision)


def test_one_process_keeps_the_host_read_budget_and_the_numbers_under_cuda_graphs(dist_settings, tmp_path):
    """World size 1 allows --cudagraphs: on the CPU stand-in (tests/gpu_standin.py) it gives the numbers of the run
    without graphs, each graph keeps the capture contract (only the indices copied in), and both runs make only the
    pinned host reads and copies of host data to the device (issue 40: one copy an env step)."""
    from gpu_standin import CONTRACTS, host_reads, run_main, uploads
    from test_gpu_path import same_run

    with host_reads() as plain_reads, uploads() as plain_copies:
        want = run_main(dist_settings, list(ONE), tmp_path / "plain")
    with host_reads() as graph_reads, uploads() as graph_copies:
        got = run_main(dist_settings, list(ONE), tmp_path / "graphs", cudagraphs=True)
    assert dict(plain_reads) == dict(graph_reads) == DIST_HOST_READS
    assert dict(plain_copies) == dict(graph_copies) == DIST_UPLOADS
    same_run(got, want)
    assert got[0]["world_size"] == 1 and got[0]["cudagraphs"] is True
    assert sorted(contract.name for contract in CONTRACTS) == ["advantages_and_returns", "policy_step", "update"]
    for contract in CONTRACTS:
        assert contract.captured_at == 3 and contract.calls > 3, contract
        assert contract.violations(max_bytes_in=16 * 8) == []  # the minibatch's 16 int64 indices at most


def test_one_rank_under_torchrun_joins_a_group_of_one_and_learns_what_one_process_learns(
    dist_settings, monkeypatch, tmp_path
):
    """torchrun with one rank (how one GPU checks NCCL): the rank joins a process group of one; each minibatch's update
    gathers the advantages' statistics and all-reduces the gradients over it, and the run learns what one process
    without torchrun learns, to float32 rounding."""
    (tmp_path / "alone").mkdir()
    alone, _ = main_in_process(dist_settings, list(ONE), tmp_path / "alone")
    calls = []
    for name in ("all_reduce", "all_gather_single"):
        collective = getattr(funcol, name)
        monkeypatch.setattr(funcol, name, lambda *a, c=collective, n=name, **kw: calls.append(n) or c(*a, **kw))
    launched = dict(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for key, value in launched.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "joined").mkdir()
    joined, _ = main_in_process(dist_settings, list(ONE), tmp_path / "joined")
    assert (alone["backend"], joined["backend"], joined["world_size"]) == (None, "gloo", 1)
    assert not dist.is_initialized()  # left at the run's end
    assert calls == ["all_gather_single", "all_reduce"] * 8  # 4 iterations of 2 minibatches
    assert (joined["steps"], joined["episodes"]) == (alone["steps"], alone["episodes"])
    for name, value in alone["losses"].items():
        assert joined["losses"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize("flags", [(), ("--compile",), ("--cudagraphs",), ("--compile", "--cudagraphs")])
def test_adam_is_capturable_on_cuda_whatever_the_flags(dist_settings, flags, monkeypatch, tmp_path):
    """Issue 16 item 8, as for the twin: on a (pretended) CUDA machine, one process with gloo, Adam is capturable
    with and without --compile."""
    import tyro

    seen = {}

    class Stop(Exception):
        pass

    def adam(params, **kwargs):
        seen.update(kwargs)
        raise Stop

    real_tensor = torch.tensor
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "pretended GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *args, **kwargs: self)  # the agent stays on the CPU
    monkeypatch.setattr(torch, "tensor", lambda data, device=None, **kwargs: real_tensor(data, **kwargs))
    monkeypatch.setattr(torch.optim, "Adam", adam)
    args = tyro.cli(dist_settings.Args, args=[*ONE, *flags, "--backend", "gloo"])
    args.results_file = str(tmp_path / "results.jsonl")
    with pytest.raises(Stop):
        dist_settings.main(args)
    assert seen["capturable"] is True and seen["fused"] is True


@pytest.mark.parametrize("preset", [None, "3"])
def test_nccl_watchdog_aborts_and_lets_the_rank_report(dist_settings, preset, monkeypatch):
    """With NCCL, a timed-out collective is aborted by PyTorch's watchdog and the rank raises (and writes its error
    line), instead of being torn down without one (PyTorch's default, 3): TORCH_NCCL_ASYNC_ERROR_HANDLING=2 is set
    before the process group is made, unless the user set it."""
    seen = {}

    class Stop(Exception):
        pass

    def init_process_group(backend, **kwargs):
        seen.update(backend=backend, mode=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"), **kwargs)
        raise Stop

    if preset is None:
        monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    else:
        monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", preset)
    monkeypatch.setattr(dist_settings.dist, "init_process_group", init_process_group)
    args = dist_settings.Args(backend="nccl", dist_timeout=7.0)
    with pytest.raises(Stop), dist_settings.process_group(args, 2, run=None):
        pass
    assert seen["backend"] == "nccl" and seen["mode"] == (preset or "2")
    assert seen["timeout"].total_seconds() == 7.0
