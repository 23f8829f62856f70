"""The GPU path of every twin, on a CPU (tests/gpu_standin.py): `--cudagraphs` and `--compile --cudagraphs` give the
numbers of the same run without CUDA graphs, every CudaGraphModule keeps the capture contract, and the host reads
of a run (and where a pair's test file pins them, its uploads) are the ones its pair's test file pins, line by line."""

import contextlib
import importlib

import pytest
from conftest import load_script
from gpu_standin import CONTRACTS, host_reads, run_main, uploads
from regression import PAIRS

TWINS = [f"{pair}_torchcompile" for pair in PAIRS]

# bytes copied into a captured function per call, at the tiny settings of tests/regression.py: observations and
# indices only (replay buffers and frame stores are bound in, never inputs)
MAX_BYTES_IN = {
    "ppo_torchcompile": 32 * 8,  # the update's 32 int64 minibatch indices (policy step 8, GAE 0)
    "ppo_atari_envpool_torchcompile": 32 * 8,  # the update's minibatch indices (32 int64); the policy step's: 8 bytes
    "ppo_continuous_action_torchcompile": 32 * 8,  # the update's 32 int64 minibatch indices (policy step 8, GAE 0)
    "dqn_torchcompile": 20,  # the policy step: one env's obs 16, epsilon 4 (the update: count 8)
    "dqn_atari_envpool_torchcompile": 4 * 84 * 84 + 4,  # the policy step: one env's obs stack, epsilon (float32)
    "sac_continuous_action_torchcompile": 48,  # update: count 8, tau 4, obs 12, action 4, reward 4, next obs 12, end 4
    "td3_continuous_action_torchcompile": 44,  # the update: count 8, one transition (obs 3, act, rew, next obs 3, term)
    "r2d2_atari_envpool_torchcompile": 644,  # the policy step of 4 envs: obs, last action and reward, first, h, c, eps
    "pqn_atari_envpool_torchcompile": 32 * 8,  # the update's minibatch indices (32 int64); the policy step's: 8 bytes
    "pqn_torchcompile": 32 * 8,  # the update's 32 int64 minibatch indices (policy step 8, returns: next obs, done 80)
}


def twin_and_flags(name):
    return load_script(name), list(PAIRS[name.removesuffix("_torchcompile")])


def same_run(got, want):
    (line, curve), (want_line, want_curve) = got, want
    assert line["status"] == want_line["status"] == "ok"
    assert (line["steps"], line["episodes"], curve) == (want_line["steps"], want_line["episodes"], want_curve)
    assert line["losses"] == want_line["losses"]


# the twins whose --compile (aot_eager) run differs from their plain run in the last bits: their --compile --cudagraphs
# run is compared with a --compile run; the others' with the plain run, which both cases share
NOT_BITWISE_COMPILED = {
    "ppo_continuous_action_torchcompile",
    "dqn_torchcompile",
    "r2d2_atari_envpool_torchcompile",
    "pqn_atari_envpool_torchcompile",
}


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """plain_runs(name): the twin's run without --compile and CUDA graphs (its CUDA path, every CudaGraphModule
    calling its function directly), made once."""
    made = {}

    def plain_run(name):
        if name not in made:
            module, flags = twin_and_flags(name)
            made[name] = run_main(module, flags, tmp_path_factory.mktemp("plain"), cudagraphs="uncaptured")
        return made[name]

    return plain_run


@pytest.mark.parametrize("compile", [False, True], ids=["cudagraphs", "compile-cudagraphs"])
@pytest.mark.parametrize("name", TWINS)
def test_cudagraphs_give_the_numbers_of_the_run_without_them(name, compile, tmp_path, plain_runs):
    module, flags = twin_and_flags(name)
    flags += ["--compile"] if compile else []
    if compile and name in NOT_BITWISE_COMPILED:
        want = run_main(module, flags, tmp_path / "plain", cudagraphs="uncaptured")
    else:
        want = plain_runs(name)
    # the pair's test file pins the reads (where they differ with these flags: DQN's device policy, the compiler
    # reading 0-d CPU tensors as it traces); PPO Atari's, PQN Atari's and SAC's files count runs of their own. R2D2's
    # pins the copies of host data to the device too (issue 42: one upload a step)
    pair_tests = importlib.import_module(f"test_{name.removesuffix('_torchcompile')}")
    counted = hasattr(pair_tests, "pinned_uploads")
    counting = uploads() if counted else contextlib.nullcontext()
    with host_reads() as reads, counting as copies:
        got = run_main(module, flags, tmp_path / "graphs", cudagraphs=True)
    same_run(got, want)
    graph_flags = ["--compile", "--cudagraphs"] if compile else ["--cudagraphs"]
    if hasattr(pair_tests, "pinned_host_reads"):
        assert dict(reads) == pair_tests.pinned_host_reads(graph_flags)
    if counted:
        assert dict(copies) == pair_tests.pinned_uploads(graph_flags)
    assert CONTRACTS, "no CudaGraphModule was called"
    for contract in CONTRACTS:
        assert contract.captured_at is not None, f"{contract.name} was never captured in this run"
        assert contract.violations(MAX_BYTES_IN[name]) == []
