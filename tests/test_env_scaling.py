"""benchmarks/env_scaling.py: its ledger sums each phase of an iteration, and on a tiny run of each twin its figures
agree with stamps and counts this test takes itself, one wrapper further in (the benchmark's wrappers go around the
test's: its times contain the test's, less only the few microseconds between two adjacent clock reads)."""

import time

import numpy as np
import pytest

from benchmarks import env_scaling

NUM_ENVS, NUM_STEPS, ITERATIONS, WARMUP = 4, 8, 3, 1
SLACK_S = 5e-3  # a few wrapper calls between the two clocks, and a scheduler's hiccup; an iteration's rollout is >10 ms


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_ledger_sums_each_phase_after_the_warm_up():
    clock = FakeClock()
    ledger = env_scaling.Ledger(clock, cpu_clock=lambda: clock.now / 2)  # the process had half the wall time
    ledger.env("reset", 0.5)  # before the first iteration: kept apart
    for start in (10.0, 20.0, 40.0):  # three iterations, the first a warm-up
        clock.now = start
        ledger.begin()
        for _ in range(2):  # two steps: policy 0.1 s, env 0.3 s (send 0.1 + recv 0.2), 3 actions each
            ledger.policy(0.1)
            ledger.env("send", 0.1, actions=3)
            ledger.env("recv", 0.2)
        clock.now = start + 2.0
        ledger.targets()
        ledger.policy(9.0)  # a policy call in the update (the bootstrap's): not the rollout's
        ledger.env("recv", 0.25)  # an env call in the update: kept apart from the rollout's
        clock.now = start + 5.0
        ledger.end()
    s = ledger.summary(warmup=1)
    assert s["iterations"] == 2 and s["actions"] == 12
    assert s["rollout_s"] == pytest.approx(4.0) and s["update_s"] == pytest.approx(6.0)
    assert s["env_s"] == pytest.approx(1.2) and s["policy_s"] == pytest.approx(0.4)
    assert s["other_s"] == pytest.approx(4.0 - 1.2 - 0.4) and s["update_env_s"] == pytest.approx(0.5)
    assert s["rollout_sps"] == pytest.approx(3.0) and s["iteration_sps"] == pytest.approx(1.2)
    assert s["env_share"] == pytest.approx(0.3) and s["update_s_per_iteration"] == pytest.approx(3.0)
    assert s["env_calls"] == {"send": 4, "recv": 6}
    assert s["cpu_s"] == pytest.approx(5.0) and s["cpu_per_wall"] == pytest.approx(0.5)
    assert s["rollout_cpu_s"] == pytest.approx(2.0) and s["rollout_steps_per_cpu_s"] == pytest.approx(6.0)
    assert ledger.outside == {"reset": 0.5}
    with pytest.raises(ValueError):
        ledger.summary(warmup=3)


class Recorder:
    """The test's own stamps: iteration starts and ends, targets calls, and every env call (its interval, its
    actions), taken inside the benchmark's wrappers."""

    def __init__(self):
        self.starts, self.ends, self.targets, self.env_calls = [], [], [], []

    def wrap(self, module, targets_name, monkeypatch):
        make_env, targets, progress = module.make_env, getattr(module, targets_name), module.bk.Run.progress
        recorder = self

        class Env:
            def __init__(self, env):
                self.env = env

            def __getattr__(self, name):
                attr = getattr(self.env, name)
                if name not in env_scaling.ENV_METHODS:
                    return attr

                def call(*args, **kwargs):
                    t0 = time.perf_counter()
                    out = attr(*args, **kwargs)
                    actions = len(args[0]) if name in ("step", "send") else None
                    recorder.env_calls.append((name, t0, time.perf_counter(), actions))
                    return out

                return call

        def targets_stamped(*args, **kwargs):
            self.targets.append(time.perf_counter())
            return targets(*args, **kwargs)

        def progress_stamped(run, iterable):
            for item in progress(run, iterable):
                self.starts.append(time.perf_counter())
                yield item
                self.ends.append(time.perf_counter())

        monkeypatch.setattr(module, "make_env", lambda *a, **kw: Env(make_env(*a, **kw)))
        monkeypatch.setattr(module, targets_name, targets_stamped)
        monkeypatch.setattr(module.bk.Run, "progress", progress_stamped)


def async_cases():
    """Each twin synchronous; and with --async-envs where its Args has the flag (two groups of half the envs)."""
    cases = [("pqn", False), ("ppo", False)]
    for twin, (script, _) in env_scaling.TWINS.items():
        if "async_envs" in env_scaling.load_script(script).Args.__dataclass_fields__:
            cases.append((twin, True))
    return cases


@pytest.mark.parametrize("twin,async_envs", async_cases())
def test_a_tiny_run_is_accounted_for_by_the_tests_own_stamps(twin, async_envs, monkeypatch):
    script, targets_name = env_scaling.TWINS[twin]
    module = env_scaling.load_script(script)
    recorder = Recorder()
    recorder.wrap(module, targets_name, monkeypatch)
    row = env_scaling.twin_rollout(twin, NUM_ENVS, ITERATIONS, WARMUP, NUM_STEPS, async_envs=async_envs, module=module)

    # the iterations: every one started, reached its targets call once, ended
    assert len(recorder.starts) == len(recorder.ends) == len(recorder.targets) == ITERATIONS
    assert row["iterations"] == ITERATIONS - WARMUP and row["async_envs"] == async_envs
    # steps: num_envs x num_steps an iteration, and every action call gave each env of its group one action
    groups = 2 if async_envs else 1
    acted = [actions for _, _, _, actions in recorder.env_calls if actions is not None]
    assert acted and set(acted) == {NUM_ENVS // groups}
    assert sum(acted) == NUM_ENVS * NUM_STEPS * ITERATIONS
    assert row["actions"] == row["expected_actions"] == NUM_ENVS * NUM_STEPS * (ITERATIONS - WARMUP)

    # times: the measured iterations' rollout (start to targets) and update (targets to end), from the test's stamps
    measured = range(WARMUP, ITERATIONS)
    rollout = sum(recorder.targets[k] - recorder.starts[k] for k in measured)
    update = sum(recorder.ends[k] - recorder.targets[k] for k in measured)
    env = sum(
        t1 - t0
        for _, t0, t1, _ in recorder.env_calls
        if any(recorder.starts[k] <= t0 and t1 <= recorder.targets[k] for k in measured)
    )
    # the benchmark's stamps are outside the test's: its rollout can only be shorter, by a few calls' time; its update
    # starts and ends a few calls before the test's
    assert 0 <= rollout - row["rollout_s"] < SLACK_S
    assert abs(update - row["update_s"]) < SLACK_S
    # its env time contains the test's (its clock is read around the test's wrapper), and nothing more than calls cost
    assert 0 <= row["env_s"] - env < SLACK_S
    assert row["env_s"] + row["policy_s"] + row["other_s"] == pytest.approx(row["rollout_s"], rel=1e-12)
    assert row["env_s"] > 0 and row["policy_s"] > 0 and row["other_s"] > 0
    assert row["rollout_sps"] == pytest.approx(row["actions"] / rollout, rel=0.1)
    np.testing.assert_allclose(row["env_share"] + row["policy_share"] + row["other_share"], 1.0, rtol=1e-12)
