"""--num-seeds N in pqn_device_env.py (issue 49): N independent PQN agents in one process and one graph. The
counter-based RNG (splitmix64 against its uint64 definition, its draws uniform and independent across seeds and
counters, a frozen or repeating variant caught), seed k of a batch trained as seed k alone (params, losses, curve; a
variant that clips across seeds, or draws by batch position, caught), compiled against eager and captured against
uncaptured with N = 3, and the results line's per-seed figures and aggregate against the curves."""

import csv
import statistics

import numpy as np
import pytest
import torch
from conftest import load_script, main_args, main_in_process, strict_json
from gpu_standin import run_main
from test_gpu_path import same_run

script = load_script("pqn_device_env")
MASK64 = (1 << 64) - 1

# 4 iterations of 32 envs x 16 steps, 2 epochs of 4 minibatches; a gradient-norm bound (0.5) the updates reach, so
# that clipping acts (at the default, 10, it rarely does in 4 iterations and a cross-seed clip would go unseen)
TINY = ["--num-envs", "32", "--num-steps", "16", "--total-timesteps", str(4 * 32 * 16), "--update-epochs", "2",
        "--num-minibatches", "4", "--exploration-fraction", "0.5", "--max-grad-norm", "0.5",
        "--save-model"]  # fmt: skip


# ---------------------------------------------------------------- the counter-based RNG


def splitmix64_reference(z):
    """splitmix64's mixing function on a Python int as uint64 (Vigna's C code, written here)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_splitmix64_on_int64_tensors_is_the_uint64_function_bit_for_bit():
    """Random 64-bit words (half of them negative as int64, where an arithmetic shift would differ) and the edges."""
    g = np.random.default_rng(0)
    words = [int(w) for w in g.integers(0, 2**64, 2000, dtype=np.uint64)] + [0, 1, 2**63 - 1, 2**63, 2**64 - 1]
    signed = torch.tensor([w - 2**64 if w >= 2**63 else w for w in words], dtype=torch.int64)
    got = [int(v) & MASK64 for v in script.splitmix64(signed).tolist()]
    assert got == [splitmix64_reference(w) for w in words]


def uniformity_failures(draw, n=4096, counters=32, seeds=(1, 2, 3, 4)):
    """What fails in draw(seeds tensor, counter tensor, stream, n) -> (N, n) uniforms: the range, a chi-square of
    100 bins over all draws, the mean and variance, and the correlation between draws of two seeds (same counter),
    two consecutive counters (same seed), two streams and neighbouring draws. Each bound is 6 sigmas or more."""
    seeds_t = torch.tensor(seeds)
    u = torch.stack([draw(seeds_t, torch.tensor(c), 0, n) for c in range(counters)]).double()  # (C, S, n)
    other = torch.stack([draw(seeds_t, torch.tensor(c), 1, n) for c in range(counters)]).double()
    failures, total = [], u.numel()
    if not (u.min() >= 0 and u.max() < 1):
        failures.append("range")
    counts = torch.histc(u, bins=100, min=0, max=1)
    chi2 = float(((counts - total / 100) ** 2 / (total / 100)).sum())
    if chi2 > 200:  # 99 degrees of freedom: mean 99, sd 14; 200 is 7 sds out
        failures.append(f"chi2 {chi2:.0f}")
    if abs(float(u.mean()) - 0.5) > 6 * (1 / 12) ** 0.5 / total**0.5 or abs(float(u.var()) - 1 / 12) > 2e-3:
        failures.append("moments")

    def corr(a, b):
        a, b = a.flatten() - a.mean(), b.flatten() - b.mean()
        return float((a * b).sum() / (a.norm() * b.norm()))

    pairs = {
        "seeds": (u[:, :-1], u[:, 1:]),
        "counters": (u[:-1], u[1:]),
        "streams": (u, other),
        "neighbours": (u[..., :-1], u[..., 1:]),
    }
    for name, (a, b) in pairs.items():
        if abs(corr(a, b)) > 6 / a.numel() ** 0.5 or torch.equal(a, b):
            failures.append(name)
    # pairs of seeds' draws together: a 10 x 10 histogram of (seed s, seed s + 1) at the same counter and index
    joint = torch.histc((u[:, :-1] * 10).floor() * 10 + (u[:, 1:] * 10).floor(), bins=100, min=0, max=100)
    expected = u[:, :-1].numel() / 100
    if float(((joint - expected) ** 2 / expected).sum()) > 200:
        failures.append("joint")
    return failures


def test_the_counter_draws_are_uniform_and_independent_across_seeds_counters_and_streams():
    assert uniformity_failures(script.counter_uniform) == []


@pytest.mark.parametrize(
    "broken",
    [
        lambda seeds, counter, stream, n: script.counter_uniform(seeds, torch.tensor(0), stream, n),  # counter frozen
        lambda seeds, counter, stream, n: script.counter_uniform(seeds * 0 + 1, counter, stream, n),  # seed ignored
        lambda seeds, counter, stream, n: script.counter_uniform(seeds, counter % 4, stream, n),  # repeats every 4
        lambda seeds, counter, stream, n: script.counter_uniform(seeds, counter, 0, n),  # one stream for all
        lambda seeds, counter, stream, n: torch.full((len(seeds), n), 0.3),  # frozen draw
        lambda seeds, counter, stream, n: script.counter_uniform(seeds, counter, stream, n) * 0.98,  # off range
    ],
    ids=["counter-frozen", "seed-ignored", "period-4", "one-stream", "constant", "squeezed"],
)
def test_a_frozen_or_repeating_generator_fails_the_check(broken):
    assert uniformity_failures(broken)


def test_the_draws_of_a_seed_do_not_depend_on_the_batch():
    """Seed 7's draws at a counter are the same alone, first or last of a batch."""
    counter = torch.tensor(12345)
    alone = script.counter_bits(torch.tensor([7]), counter, 2, 100)
    for batch in ([7, 8, 9], [3, 5, 7], [7]):
        got = script.counter_bits(torch.tensor(batch), counter, 2, 100)
        assert torch.equal(got[batch.index(7)], alone[0]), batch


# ---------------------------------------------------------------- seed k in a batch is seed k alone


def per_seed_updates(monkeypatch, module=script):
    """Record every update's per-seed statistics ((TD loss, mean Q), (2, N), here), as the module's eager update
    returns them."""
    calls, update = [], module.update

    def recorded(*args, **kwargs):
        out = update(*args, **kwargs)
        calls.append(out.detach().clone())
        return out

    monkeypatch.setattr(module, "update", recorded)
    return calls


def seed_curve(run_dir, seed):
    """[(step, return)] of one seed's episodes in a run's returns.csv (step,wall_s,return,seed)."""
    with open(run_dir / "returns.csv") as f:
        return [(int(r["step"]), float(r["return"])) for r in csv.DictReader(f) if int(r["seed"]) == seed]


def batch_and_alone(tmp_path, monkeypatch, flags=()):
    """Seeds 1, 2, 3 in one run and seed 2 alone (the same flags): for each, the results line, its run folder, its
    checkpoint and the per-seed update outputs."""
    out = {}
    for name, seed_flags in (("batch", ["--seed", "1", "--num-seeds", "3"]), ("alone", ["--seed", "2"])):
        (tmp_path / name).mkdir()
        calls = per_seed_updates(monkeypatch)
        line, _ = main_in_process(script, [*TINY, *flags, *seed_flags], tmp_path / name)
        run_dir = tmp_path / name / line["run_name"]
        checkpoint = torch.load(run_dir / "pqn_device_env.pt", weights_only=True)
        out[name] = dict(line=line, dir=run_dir, checkpoint=checkpoint, updates=torch.stack(calls))
        monkeypatch.undo()
    return out["batch"], out["alone"]


def mismatches(batch, alone):
    """What of seed 2 differs between the batch (its second seed) and the run of seed 2 alone."""
    found = []
    if seed_curve(batch["dir"], 2) != seed_curve(alone["dir"], 2):
        found.append("curve")
    if not torch.allclose(batch["updates"][:, :, 1], alone["updates"][:, :, 0], rtol=1e-4, atol=1e-5):
        found.append("losses")
    models = batch["checkpoint"]["models"]
    for key, value in alone["checkpoint"]["model"].items():
        if not torch.allclose(models[key][1], value, rtol=1e-4, atol=1e-5):
            found.append(f"params {key}")
            break
    return found


def test_seed_2_of_seeds_1_2_3_is_trained_as_seed_2_alone(tmp_path, monkeypatch):
    """4 iterations (32 updates): seed 2's return curve is the same episode for episode, its TD losses and mean Qs at
    every update and its final parameters equal the one-seed run's to float32 rounding (batched matmuls), and the
    other seeds learned something else."""
    batch, alone = batch_and_alone(tmp_path, monkeypatch)
    assert batch["updates"].shape == (32, 2, 3) and alone["updates"].shape == (32, 2, 1)
    assert mismatches(batch, alone) == []
    assert len(seed_curve(alone["dir"], 2)) > 50
    assert seed_curve(batch["dir"], 1) != seed_curve(batch["dir"], 2) != seed_curve(batch["dir"], 3)
    assert not torch.allclose(batch["updates"][:, 0, 0], batch["updates"][:, 0, 1], rtol=1e-2)
    # the checkpoint's "model" is the first seed's network, its stacked "models" every seed's
    assert batch["checkpoint"]["seeds"] == [1, 2, 3] and alone["checkpoint"]["seeds"] == [2]
    for key, value in batch["checkpoint"]["model"].items():
        assert torch.equal(value, batch["checkpoint"]["models"][key][0]), key


def clip_across_seeds(params, max_norm):
    """A wrong clip: one norm over every seed's gradients, as nn.utils.clip_grad_norm_ on the stacked parameters."""
    torch.nn.utils.clip_grad_norm_(params, max_norm)


def draws_by_position(seeds, counter, stream, n, counter_bits=script.counter_bits):
    """A wrong RNG: a seed's draws keyed by its position in the batch, not by its seed."""
    return counter_bits(torch.arange(len(seeds)), counter, stream, n)


WRONG = [("clip_grad_norm_per_seed", clip_across_seeds), ("counter_bits", draws_by_position)]


@pytest.mark.parametrize("name,wrong", WRONG, ids=["clip-across", "draw-by-position"])
def test_a_batch_that_ties_the_seeds_together_fails_the_comparison(name, wrong, tmp_path, monkeypatch):
    """The comparison above can fail: clipping by the norm of all seeds' gradients, or drawing by batch position,
    makes seed 2 of the batch differ from seed 2 alone."""
    calls, original = [], getattr(script, name)

    def patched(*args, **kwargs):
        calls.append(1)
        return wrong(*args, **kwargs)

    (tmp_path / "batch").mkdir()
    (tmp_path / "alone").mkdir()
    monkeypatch.setattr(script, name, patched)
    batch_line, _ = main_in_process(script, [*TINY, "--seed", "1", "--num-seeds", "3"], tmp_path / "batch")
    monkeypatch.setattr(script, name, original)
    alone_line, _ = main_in_process(script, [*TINY, "--seed", "2"], tmp_path / "alone")
    assert calls
    batch_dir, alone_dir = tmp_path / "batch" / batch_line["run_name"], tmp_path / "alone" / alone_line["run_name"]
    models = torch.load(batch_dir / "pqn_device_env.pt", weights_only=True)["models"]
    model = torch.load(alone_dir / "pqn_device_env.pt", weights_only=True)["model"]
    differs = [key for key, value in model.items() if not torch.allclose(models[key][1], value, rtol=1e-4, atol=1e-5)]
    assert differs


# ---------------------------------------------------------------- the results line


def test_the_results_line_gives_each_seed_and_the_aggregate_of_the_curves(tmp_path):
    """Seeds 4..8: each seed's last-100 mean and episode count, and their mean, std, interquartile mean and fraction
    at 475, computed here from returns.csv; mean_return is the mean over seeds."""
    line, _ = main_in_process(script, [*TINY, "--seed", "4", "--num-seeds", "5"], tmp_path)
    with open(tmp_path / line["run_name"] / "returns.csv") as f:
        rows = list(csv.DictReader(f))
    by_seed = {s: [float(r["return"]) for r in rows if int(r["seed"]) == s] for s in range(4, 9)}
    means = [statistics.fmean(by_seed[s][-100:]) for s in range(4, 9)]
    assert line["seeds"]["seed"] == [4, 5, 6, 7, 8]
    assert line["seeds"]["episodes"] == [len(by_seed[s]) for s in range(4, 9)] and line["episodes"] == len(rows)
    assert line["seeds"]["mean_return"] == pytest.approx(means)
    middle = sorted(means)[1:4]  # 5 seeds: one cut from each end (a quarter of 5, rounded down)
    agg = line["aggregate"]
    assert agg["mean"] == pytest.approx(statistics.fmean(means)) == pytest.approx(line["mean_return"])
    assert agg["std"] == pytest.approx(statistics.pstdev(means))
    assert agg["iqm"] == pytest.approx(statistics.fmean(middle))
    assert agg["solved_at"] == 475.0 and agg["solved"] == sum(m >= 475 for m in means) / 5 and agg["num_seeds"] == 5
    assert len(set(means)) == 5  # five different agents


# ---------------------------------------------------------------- compiled and captured, N = 3

SEEDS3 = [*TINY, "--seed", "5", "--num-seeds", "3", "--learning-rate", "2.5e-4"]


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_three_seeds_compiled_equal_three_seeds_eager(backend, tmp_path, monkeypatch):
    """--compile with --num-seeds 3: the curve (every seed's episodes) is the eager run's, the losses to rounding
    (inductor: the counter-based draws are integer math, the same numbers compiled)."""
    (tmp_path / "eager").mkdir()
    (tmp_path / "compiled").mkdir()
    plain, _ = main_in_process(script, SEEDS3, tmp_path / "eager")
    torch._dynamo.reset()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compile_(fn, **{**kwargs, "backend": backend}))
    compiled, _ = main_in_process(script, [*SEEDS3, "--compile"], tmp_path / "compiled")
    curves = [(tmp_path / d / line["run_name"] / "returns.csv").read_text().splitlines() for d, line in
              (("eager", plain), ("compiled", compiled))]  # fmt: skip
    drop_wall = lambda rows: [row.split(",")[::2] + row.split(",")[3:] for row in rows]  # noqa: E731
    assert drop_wall(curves[0]) == drop_wall(curves[1]) and plain["episodes"] > 150
    assert compiled["seeds"]["mean_return"] == plain["seeds"]["mean_return"]
    # the losses to float32 rounding grown over 32 updates (capturable RAdam's float32 bias corrections, see
    # test_pqn_device_env.py); the mean Q over seeds is near 0, so its bound is absolute (measured: 1.6e-4 on 0.13)
    assert compiled["losses"]["td_loss"] == pytest.approx(plain["losses"]["td_loss"], rel=1e-3)
    assert compiled["losses"]["q_values"] == pytest.approx(plain["losses"]["q_values"], abs=1e-3)
    print({key: (plain["losses"][key], compiled["losses"][key]) for key in plain["losses"]})


@pytest.mark.parametrize("flags", [[], ["--compile"]], ids=["cudagraphs", "compile-cudagraphs"])
def test_three_seeds_captured_give_the_numbers_of_the_run_without(flags, tmp_path):
    """--cudagraphs with --num-seeds 3 on the CPU stand-in (tests/gpu_standin.py): the captured iteration replayed
    draws fresh numbers (its counter moves on in the graph) and gives the uncaptured run's curve and losses."""
    want = run_main(script, [*SEEDS3, *flags], tmp_path / "plain", cudagraphs="uncaptured")
    got = run_main(script, [*SEEDS3, *flags], tmp_path / "graphs", cudagraphs=True)
    same_run(got, want)
    assert got[0]["seeds"] == want[0]["seeds"] and len(set(got[0]["seeds"]["mean_return"])) == 3


# ---------------------------------------------------------------- --resume with N seeds


def test_three_seeds_stopped_by_sigterm_and_resumed_give_the_numbers_of_the_run_never_stopped(tmp_path):
    """SEEDS3 (4 iterations) once through, and stopped by SIGTERM at the end of iteration 2 then resumed: the same
    per-seed means and episodes, aggregate, losses, curve (every seed's), stacked networks and RNG counter."""
    from test_resume import assert_same, results, run_folder, sigterm_at

    [whole] = run_main(script, SEEDS3, tmp_path / "whole", read=results)
    with sigterm_at(2 * 32 * 16), pytest.raises(SystemExit):
        run_main(script, SEEDS3, tmp_path / "stopped", read=results)
    run_dir = run_folder(tmp_path / "stopped")
    state = torch.load(run_dir / "state.pt", weights_only=True)
    assert state["state"]["rng"]["counter"].tolist() == [2 * (16 + 2)]  # 16 steps and 2 epochs an iteration
    assert len(state["run"]["seed_returns"]) == 3
    last = run_main(script, ["--resume", str(run_dir)], tmp_path / "stopped", read=results)[-1]
    assert last["resumed"] == 1 and last["status"] == "ok"
    for key in ("steps", "episodes", "mean_return", "losses", "seeds", "aggregate"):
        assert last[key] == whole[key], key
    whole_dir = run_folder(tmp_path / "whole")
    drop_wall = lambda d: [r.split(",")[::2] + r.split(",")[3:] for r in (d / "returns.csv").read_text().split()]  # noqa: E731
    assert drop_wall(run_dir) == drop_wall(whole_dir)
    models = [torch.load(d / "pqn_device_env.pt", weights_only=True)["models"] for d in (whole_dir, run_dir)]
    assert_same(*models, where="the stacked networks")


def test_eval_seed_plays_that_seeds_network_and_an_absent_seed_exits_2(tmp_path, monkeypatch, capsys):
    """--eval-checkpoint of a run of seeds 4, 5 with --eval-seed 5 loads the second stacked network (and says so in
    its results line); --eval-seed 9, a seed the checkpoint lacks: one line, exit 2."""
    line, _ = main_in_process(script, [*TINY, "--seed", "4", "--num-seeds", "2"], tmp_path)
    path = tmp_path / line["run_name"] / "pqn_device_env.pt"
    models = torch.load(path, weights_only=True)["models"]
    loaded, load = [], script.QNetwork.load_state_dict
    monkeypatch.setattr(script.QNetwork, "load_state_dict", lambda net, sd: loaded.append(sd) or load(net, sd))
    script.main(main_args(script, ["--eval-checkpoint", str(path), "--eval-seed", "5", "--eval-episodes", "1"],
                          tmp_path))  # fmt: skip
    [state_dict] = loaded
    assert all(torch.equal(state_dict[key], models[key][1]) for key in models)
    assert strict_json((tmp_path / "results.jsonl").read_text().splitlines()[-1])["eval_seed"] == 5
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        script.main(main_args(script, ["--eval-checkpoint", str(path), "--eval-seed", "9"], tmp_path))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--eval-seed 9" in err, err
