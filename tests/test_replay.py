"""benchmarks/replay.py: it drives each script's own buffer functions, and its report says what it measured."""

import json
import math

import pytest
import torch

from benchmarks import replay


def test_the_study_rows_are_read_as_numbers():
    study = replay.study_rates()
    assert study["DQN"]["buffer_items"] == 400_000 and study["DQN"]["add_items_per_s"] == 400
    assert study["SAC"]["sample_items_per_s"] == 138 and study["R2D2"]["item_bytes"] == 10e6
    for case in replay.CASES.values():
        assert case.study is None or case.study in study, case.name


@pytest.mark.parametrize("name", sorted(replay.CASES))
def test_each_buffer_is_driven_for_real(name):
    """What the benchmark times does the work: an add writes into the buffer, a sample returns a batch of the
    script's size made of what the buffer holds (frames: every frame of every rebuilt stack is a stored one)."""
    case = replay.CASES[name]
    for script in case.scripts:
        torch.manual_seed(0)
        bench = case.build(replay.load_script(script), min(case.quick_capacities), torch.device("cpu"), False)
        data = "frames" if "frames" in bench.storage else "obs"
        stored = bench.storage[data]
        if stored.dtype == torch.uint8:
            stored.copy_(torch.randint(0, 256, stored.shape, dtype=torch.uint8))
        else:
            stored.normal_()
        before = {key: value.clone() for key, value in bench.storage.items()}
        bench.add()
        assert any(not torch.equal(before[k], v) for k, v in bench.storage.items() if k != "count"), script
        batch = bench.sample()
        assert all(value.shape[0] == bench.sample_items for value in batch.values()), script
        items = stored.reshape(
            -1, *stored.shape[-1:] if data == "obs" else stored.shape[2:]
        )  # frames: (envs, slots, ...)
        drawn = batch["obs"].reshape(-1, *items.shape[1:])
        drawn = drawn[torch.randperm(len(drawn))[:128]]  # R2D2 draws 30k frames: a random 128 of them are checked
        assert drawn.abs().sum() > 0
        assert all((items == row).flatten(1).all(1).any() for row in drawn), f"{script}: a sampled row is not stored"


def test_quick_report_has_every_row_with_finite_rates_and_the_study_beside_it(tmp_path):
    argv = ["--quick", "--no-compile", "--budget", "0.02", "--out", str(tmp_path), "--threads", "1"]
    assert replay.main(argv) == 0
    report = json.loads((tmp_path / "replay_cpu_quick.json").read_text())
    md = (tmp_path / "replay_cpu_quick.md").read_text()
    assert report["quick"] is True and report["machine"]["device"] == "cpu"
    ops = {name: 3 if name.startswith("r2d2") else 2 for name in replay.CASES}  # prioritized replay: + update
    expected = sum(len(case.scripts) * len(case.quick_capacities) * ops[name] for name, case in replay.CASES.items())
    assert len(report["rows"]) == expected
    for row in report["rows"]:
        assert math.isfinite(row["items_per_s"]) and row["items_per_s"] > 0, row
        assert row["mb_per_s"] == pytest.approx(row["items_per_s"] * row["item_bytes"] / 1e6)
        if row["op"] == "add":
            assert row["item_bytes"] == row["stored_bytes_per_item"]
        if row["study"] and row["op"] != "update":  # the study gives add and sample rates only
            assert row["times_study"] == pytest.approx(row["items_per_s"] / row["study_items_per_s"])
    # the sampler comparison, at 1e4 slots only: each sampler checked and timed, its rows in the same report
    assert [(r["sampler"], r["capacity"], r["form"]) for r in report["samplers"]] == [
        (name, 10_000, "as written") for name in replay.SAMPLERS
    ]
    assert all(r["check"]["ok"] and r["step_us"] > 0 for r in report["samplers"]), report["samplers"]
    assert md.startswith("Measured on CPU only; CPU ") and md.count("\n| ") == expected + 1 + len(replay.SAMPLERS) + 1
    assert "| 10,000 | as written | sum tree: twin's `tree_sample`" in md and "| 10,000 | as written | cumsum: " in md


def test_frame_store_keeps_each_frame_once_and_samples_whole_stacks():
    rows = replay.run(replay.parse_args(["--quick", "--no-compile", "--budget", "0.01", "--buffers", "dqn_atari"]))
    for row in rows:
        # one 84x84 frame plus a few bytes of step data per transition: a quarter of a stored 4-frame stack
        assert 84 * 84 <= row["stored_bytes_per_item"] < 84 * 84 * 1.1, row
        if row["op"] == "sample":  # a sampled transition carries its rebuilt obs and next-obs stacks
            assert row["item_bytes"] >= 2 * 4 * 84 * 84, row


def test_bad_flags_exit_2(capsys):
    assert replay.main(["--buffers", "nope"]) == 2
    assert "--buffers" in capsys.readouterr().err


def test_priority_update_writes_the_sampled_leaves_of_the_sum_tree():
    """The R2D2 rows time a real write-back: after update(), the sampled slots' leaves hold priority ** alpha and the
    root is the sum of the leaves again."""
    for script in replay.CASES["r2d2_vector"].scripts:
        torch.manual_seed(0)
        bench = replay.CASES["r2d2_vector"].build(replay.load_script(script), 64, torch.device("cpu"), False)
        tree = bench.storage["tree"]
        leaves = tree.shape[0] // 2
        index = bench.sample()["index"]
        before = tree.clone()
        bench.update()
        assert not torch.equal(before[leaves + index], tree[leaves + index]), script
        torch.testing.assert_close(tree[1], tree[leaves:].sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(replay.SAMPLERS))
def test_each_sampler_draws_slots_in_proportion_to_priority_to_the_alpha(name):
    """The comparison is fair only if both samplers draw the same distribution: over 1e5 draws from 37 slots (one
    empty, a size the tree pads to 64) each slot's frequency matches priority ** alpha / sum within a chi-square
    bound, the empty slot is never drawn, and the same holds after an update rewrote the drawn slots."""
    torch.manual_seed(0)
    priorities = torch.rand(37) * torch.arange(1, 38) + 0.01
    priorities[11] = 0.0
    sampler = replay.SAMPLERS[name][1](
        replay.load_script(replay.SAMPLER_SCRIPT), 37, torch.device("cpu"), False, priorities
    )
    expected = priorities.double() ** replay.SAMPLER_ALPHA
    check = replay.chi_square_check(sampler.sample, expected, calls=1563, bins=37)
    assert check["ok"] and check["draws"] >= 100_000, check
    expected[sampler.step()[0]] = sampler.new.double() ** replay.SAMPLER_ALPHA
    torch.testing.assert_close(sampler.leaves().double(), expected, rtol=1e-6, atol=0)
    assert replay.chi_square_check(sampler.sample, expected, calls=1563, bins=37)["ok"]


def test_a_sampler_with_wrong_draws_is_reported_and_not_timed(tmp_path, monkeypatch):
    """The check has teeth (uniform draws, or draws one slot off, fail it), a failing sampler's row says FAIL and
    holds no times, and --only samplers writes its own file, never the full report."""
    priorities = replay.check_priorities(4096, torch.device("cpu"))
    uniform = lambda: (torch.randint(4096, (64,)), None)  # noqa: E731
    shifted = lambda: (((replay.cumsum_sample(priorities**0.9, 64, 0.6)[0] + 1) % 4096), None)  # noqa: E731
    for wrong in (uniform, shifted):
        assert not replay.chi_square_check(wrong, priorities**0.9)["ok"]

    def uniform_sampler(module, capacity, device, compiled, priorities):
        sampler = replay.cumsum_sampler(module, capacity, device, compiled, priorities)
        sampler.sample = lambda: (torch.randint(capacity, (64,)), torch.ones(64))
        return sampler

    monkeypatch.setattr(replay, "SAMPLER_QUICK_CAPACITIES", (4096,))
    monkeypatch.setitem(replay.SAMPLERS, "uniform", ("a broken one", uniform_sampler))
    argv = ["--quick", "--only", "samplers", "--no-compile", "--budget", "0.01", "--out", str(tmp_path)]
    assert replay.main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "replay_cpu_samplers_quick.json",
        "replay_cpu_samplers_quick.md",
    ]
    report = json.loads((tmp_path / "replay_cpu_samplers_quick.json").read_text())
    assert report["rows"] == [] and report["sections"] == ["samplers"]
    ok = {r["sampler"]: r["check"]["ok"] for r in report["samplers"]}
    assert ok == {"sum tree": True, "cumsum": True, "uniform": False}
    assert "step_us" not in report["samplers"][-1]
    md = (tmp_path / "replay_cpu_samplers_quick.md").read_text()
    assert "| FAIL | FAIL | FAIL |" in md and "| buffer |" not in md
    assert replay.main(["--only", "nope"]) == 2
