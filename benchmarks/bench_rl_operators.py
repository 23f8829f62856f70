"""RL operators in plain PyTorch, checked against float64 and timed against HPC_RL's fused CUDA kernels.

HPC_RL (OpenDILab) hand-wrote CUDA kernels for the operators RL training repeats every iteration and
reported their speed on a 32 GB V100 (``benchmarks/hpc_rl_v100.csv``, which cites its source). The operators,
as Python loops and as vectorized tensor code, are in ``benchmarks/rl_operators.py``; this file is the harness:
it builds their inputs at HPC_RL's sizes, checks every form against a float64 reference (a form that fails is
reported as ``FAIL`` and not timed), times it as written, under ``torch.compile`` and, on CUDA, under a CUDA
graph, and writes the report.

Run::

    python benchmarks/bench_rl_operators.py [--quick] [--out benchmarks/results] [--device cpu|cuda] [--reps N]
                                [--ops gae,vtrace] [--budget SECONDS] [--threads N] [--no-compile]

It writes ``<out>/rl_ops_<device-tag>.md`` and ``.json``, stamped with the machine (device, CPU model,
cores, torch threads, load average, torch version). A full run goes to ``benchmarks/results/`` (committed);
a ``--quick`` run to ``runs/benchmarks/`` (git-ignored) as ``rl_ops_<device-tag>_quick``, and it never replaces
a full run's report, wherever ``--out`` points. ``--merge`` (no GPU needed) re-renders one table from the JSON
of runs made in parts with ``--ops`` and ``--tag`` (benchmarks/README.md: on a GPU machine whose commands run
10 minutes at most).

Forms
-----
* Timing covers the forward and, where the operator has a gradient, the backward
  (``torch.autograd.grad`` of the loss, or of the output with a fixed random cotangent).
* ``loop``: the straightforward eager code a careful RL user writes, with the Python loop that the
  operator's definition suggests: over time (GAE, TD(lambda), V-trace, UPGO, LSTM), over the n-step
  rewards (q-value TD) and the atoms (C51), over the batch (scatter). PPO has no loop: its baseline
  is CleanRL's eager code with ``torch.distributions.Categorical``.
* ``vectorized``: every vectorized candidate of the operator is checked and timed; the fastest correct
  one is reported (its name is in the variants column). The candidates (the recurrence solvers
  ``doubling``, ``chunked``, ``assoc``, GAE's ``cumsum``, C51's ``scatter`` and ``hat``) are described in
  ``benchmarks/rl_operators.py``.
* ``compiled``: a vectorized candidate under ``torch.compile`` (static shapes, one compile per size).
  On CPU the recurrences compile ``doubling`` and C51 ``scatter``; on CUDA ``doubling`` and ``assoc``
  (which inductor lowers to one Triton scan kernel), and C51 ``scatter`` and ``hat``, are all compiled
  and the fastest correct one is kept. The LSTM compiles its recurrent cell (the loop stays Python).
* ``compiled+cudagraph`` (CUDA only): the compiled step, forward and backward, captured once in a
  ``torch.cuda.CUDAGraph`` and replayed.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import rl_operators as ops  # noqa: E402  (the operators; this file times them)
from benchmarks.harness import (  # noqa: E402  (the timer, the machine stamp, the report policy)
    FULL_OUT,
    QUICK_OUT,
    ROOT,
    _load_average,
    device_tag,
    machine_info,
    machine_line,
    stopped_by_signal,
    time_call,
    write_or_refuse,
)

# HPC_RL's table (forward + backward, 32 GB V100), its source cited in the file: operator, size, PyTorch us,
# fused-kernel us. CSV_NAMES maps the file's operator names to this file's.
HPC_RL_CSV = Path(__file__).resolve().parent / "hpc_rl_v100.csv"
CSV_NAMES = {"td_lambda": "TD-lambda"}


def read_hpc_rl_table(path=HPC_RL_CSV):
    """[(operator, size, PyTorch us, fused us)] from HPC_RL's table (lines starting with # are comments)."""
    ours = {csv_name: name for name, csv_name in CSV_NAMES.items()}
    with open(path) as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        return [
            (ours.get(r["operator"], r["operator"]), r["size"], int(r["pytorch_us"]), int(r["hpc_rl_us"])) for r in rows
        ]


HPC_RL_V100 = read_hpc_rl_table()

# leanrl's extra sizes: HPC_RL has no T=1024 row for these recurrences, and the 10x claim is at T=1024
# (B as in HPC_RL's GAE rows). vtrace_returns / upgo_returns are the recurrences alone (targets from
# given ratios and values, as IMPALA's from_importance_weights), without the softmax and the loss.
EXTRA_SIZES = [
    ("td_lambda", "T=1024,B=16"),
    ("td_lambda", "T=1024,B=64"),
    ("vtrace", "T=1024,B=16,N=16"),
    ("vtrace", "T=1024,B=64,N=16"),
    ("vtrace_returns", "T=1024,B=16"),
    ("vtrace_returns", "T=1024,B=64"),
    ("upgo", "T=1024,B=16,N=16"),
    ("upgo", "T=1024,B=64,N=16"),
    ("upgo_returns", "T=1024,B=16"),
    ("upgo_returns", "T=1024,B=64"),
]
QUICK_SIZES = [
    ("gae", "T=16,B=16"),
    ("gae", "T=64,B=8"),
    ("td_lambda", "T=16,B=16"),
    ("qntd", "T=4,B=16,N=8"),
    ("qntd_rescale", "T=4,B=16,N=8"),
    ("dntd", "T=4,B=16,N=8"),
    ("vtrace", "T=16,B=8,N=6"),
    ("vtrace_returns", "T=16,B=8"),
    ("upgo", "T=16,B=8,N=6"),
    ("upgo_returns", "T=16,B=8"),
    ("ppo", "B=16,N=16"),
    ("lstm", "seq_len=4,B=2"),
    ("scatter", "B=4,M=8,N=16"),
]

# Fixed problem dimensions where HPC_RL's table names none (from HPC_RL's own tests).
LSTM_INPUT, LSTM_HIDDEN, LSTM_LAYERS = 1792, 384, 3
C51_ATOMS = 51


# ---------------------------------------------------------------------------------------------------
# Operator registry: inputs, forms, candidates
# ---------------------------------------------------------------------------------------------------


@dataclass
class Operator:
    """How to build, run and differentiate one operator."""

    name: str
    loop: object
    candidates: dict  # vectorized variants, name -> function
    compile_candidates: tuple  # candidate names compiled on CPU
    cuda_compile_candidates: tuple  # candidate names compiled on CUDA
    make_inputs: object  # (dims, generator) -> (args tuple on CPU, grad argnums, cotangent or None)
    notes: str = ""
    # max-norm relative tolerance against float64; the LSTM's float32 rounding grows through 256 steps
    # of 1792-wide products (about 1e-4 of the largest value at 64 steps), so it gets 2e-3
    tol: float = 1e-4
    # the size at which forms are checked, when checking at the timed size would cost minutes (LSTM)
    check_size: object = None


def parse_size(size):
    """'T=16,B=128,N=128' -> {'T': 16, 'B': 128, 'N': 128}."""
    return {k: int(v) for k, v in (item.split("=") for item in size.split(","))}


def _rollout(T, B, g):
    rewards = torch.randn(T, B, generator=g)
    values = torch.randn(T, B, generator=g)
    dones = (torch.rand(T, B, generator=g) < 0.1).float()
    dones[T // 2, ::2] = 1.0  # make sure every size has episode ends
    next_value = torch.randn(B, generator=g)
    next_done = (torch.rand(B, generator=g) < 0.1).float()
    next_done[::3] = 1.0
    return rewards, values, dones, next_value, next_done


def _gae_inputs(d, g):
    return _rollout(d["T"], d["B"], g), (), None


def _td_lambda_inputs(d, g):
    return _rollout(d["T"], d["B"], g), (1,), None


def _nstep_inputs(d, g, atoms=None):
    n, B, N = d["T"], d["B"], d["N"]
    if atoms is None:
        q, next_q = torch.randn(B, N, generator=g), torch.randn(B, N, generator=g)
    else:
        q = torch.softmax(torch.randn(B, N, atoms, generator=g), -1)
        next_q = torch.softmax(torch.randn(B, N, atoms, generator=g), -1)
    action = torch.randint(N, (B,), generator=g)
    next_action = torch.randint(N, (B,), generator=g)
    reward = torch.randn(n, B, generator=g)
    done = (torch.rand(B, generator=g) < 0.2).float()
    done[::4] = 1.0
    weight = torch.rand(B, generator=g) + 0.5
    return (q, next_q, action, next_action, reward, done, weight), (0,), None


def _vtrace_inputs(d, g):
    T, B, N = d["T"], d["B"], d["N"]
    logits = torch.randn(T, B, N, generator=g)
    behaviour = logits + 0.5 * torch.randn(T, B, N, generator=g)  # ratios on both sides of 1
    actions = torch.randint(N, (T, B), generator=g)
    return (logits, behaviour, actions, *_rollout(T, B, g)), (0, 4), None


def _vtrace_returns_inputs(d, g):
    T, B = d["T"], d["B"]
    log_rhos = 0.5 * torch.randn(T, B, generator=g)  # ratios on both sides of 1
    return (log_rhos, *_rollout(T, B, g)), (), None


def _upgo_rollout(T, B, g):
    """A rollout whose 'r_{t+1} + gamma_{t+1} V_{t+2} >= V_{t+1}' tests are clear of ties, so float32 and
    the float64 reference take the same branch (the returns are discontinuous there)."""
    rewards, values, dones, next_value, next_done = _rollout(T, B, g)
    discount = 0.99 * (1 - torch.cat([dones[1:], next_done[None]]))
    following_v = torch.cat([values[1:], next_value[None]])
    margin = rewards[1:] + discount[1:] * following_v[1:] - values[1:]
    rewards[1:] += torch.where(margin >= 0, 2e-3, -2e-3) * (margin.abs() < 1e-3)
    return rewards, values, dones, next_value, next_done


def _upgo_returns_inputs(d, g):
    return _upgo_rollout(d["T"], d["B"], g), (), None


def _upgo_inputs(d, g):
    T, B, N = d["T"], d["B"], d["N"]
    logits = torch.randn(T, B, N, generator=g)
    rhos = torch.exp(0.3 * torch.randn(T, B, generator=g)).clamp(max=1.0)
    actions = torch.randint(N, (T, B), generator=g)
    rewards, values, dones, next_value, next_done = _upgo_rollout(T, B, g)
    return (logits, rhos, actions, rewards, values, dones, next_value, next_done), (0,), None


def _ppo_inputs(d, g):
    B, N = d["B"], d["N"]
    logits = torch.randn(B, N, generator=g)
    old_logits = logits + 0.3 * torch.randn(B, N, generator=g)  # some ratios clipped, some not
    actions = torch.randint(N, (B,), generator=g)
    newvalue = torch.randn(B, generator=g)
    oldvalue = newvalue + 0.3 * torch.randn(B, generator=g)
    advantages, returns = torch.randn(B, generator=g), torch.randn(B, generator=g)
    return (logits, old_logits, actions, newvalue, oldvalue, advantages, returns), (0, 3), None


def _lstm_inputs(d, g, input_size=LSTM_INPUT, hidden=LSTM_HIDDEN, layers=LSTM_LAYERS):
    T, B = d["seq_len"], d["B"]
    x = torch.randn(T, B, input_size, generator=g)
    h0 = 0.1 * torch.randn(layers, B, hidden, generator=g)
    c0 = 0.1 * torch.randn(layers, B, hidden, generator=g)
    params = ops.lstm_params(input_size, hidden, layers, g)
    cotangent = torch.randn(T, B, hidden, generator=g)
    return (x, h0, c0, *params), tuple([0] + list(range(3, 3 + len(params)))), cotangent


def _lstm_check_size(size):
    """Check the LSTM over its first 16 steps: the float64 loop at 256 steps alone takes a minute on CPU."""
    d = parse_size(size)
    return f"seq_len={min(d['seq_len'], 16)},B={d['B']}"


def _scatter_inputs(d, g):
    B, M, N = d["B"], d["M"], d["N"]
    features = torch.randn(B, M, N, generator=g)
    locations = torch.stack(
        [torch.randint(ops.SCATTER_H, (B, M), generator=g), torch.randint(ops.SCATTER_W, (B, M), generator=g)], dim=-1
    )
    cotangent = torch.randn(B, N, ops.SCATTER_H, ops.SCATTER_W, generator=g)
    return (features, locations), (0,), cotangent


def _scan_candidates(fn, extra=None):
    candidates = {name: functools.partial(fn, scan=name) for name in ("doubling", "chunked", "assoc")}
    candidates.update(extra or {})
    return candidates


def operators():
    """The benchmarked operators, by name (built on call so that importing does no work)."""
    table = [
        Operator(
            "gae", ops.gae_loop, _scan_candidates(ops.gae_vectorized, {"cumsum": ops.gae_cumsum}),
            ("doubling",), ("doubling", "assoc"), _gae_inputs, "forward only",
        ),
        Operator(
            "td_lambda", ops.td_lambda_loop, _scan_candidates(ops.td_lambda_vectorized),
            ("doubling",), ("doubling", "assoc"), _td_lambda_inputs,
        ),
        Operator("qntd", ops.qntd_loop, {"matvec": ops.qntd_vectorized}, ("matvec",), ("matvec",), _nstep_inputs),
        Operator(
            "qntd_rescale", ops.qntd_rescale_loop, {"matvec": ops.qntd_rescale_vectorized},
            ("matvec",), ("matvec",), _nstep_inputs,
        ),
        Operator(
            "dntd", ops.dntd_loop,
            {p: functools.partial(ops.dntd_vectorized, project=p) for p in ("scatter", "hat")},
            ("scatter",), ("scatter", "hat"), functools.partial(_nstep_inputs, atoms=C51_ATOMS),
        ),
        Operator(
            "vtrace", ops.vtrace_loop, _scan_candidates(ops.vtrace_vectorized),
            ("doubling",), ("doubling", "assoc"), _vtrace_inputs,
        ),
        Operator(
            "vtrace_returns", ops.vtrace_returns_loop, _scan_candidates(ops.vtrace_returns_vectorized),
            ("doubling",), ("doubling", "assoc"), _vtrace_returns_inputs, "recurrence only, forward",
        ),
        Operator(
            "upgo", ops.upgo_loop, _scan_candidates(ops.upgo_vectorized),
            ("doubling",), ("doubling", "assoc"), _upgo_inputs,
        ),
        Operator(
            "upgo_returns", ops.upgo_returns_loop, _scan_candidates(ops.upgo_returns_vectorized),
            ("doubling",), ("doubling", "assoc"), _upgo_returns_inputs, "recurrence only, forward",
        ),
        Operator(
            "ppo", ops.ppo_loop, {"log_softmax": ops.ppo_vectorized}, ("log_softmax",), ("log_softmax",), _ppo_inputs
        ),
        Operator(
            "lstm", ops.lstm_loop, {"hoisted": ops.lstm_vectorized}, ("hoisted",), ("hoisted",), _lstm_inputs,
            f"input {LSTM_INPUT}, hidden {LSTM_HIDDEN}, {LSTM_LAYERS} layers", tol=2e-3, check_size=_lstm_check_size,
        ),
        Operator(
            "scatter", ops.scatter_loop, {"scatter_add": ops.scatter_vectorized}, ("scatter_add",), ("scatter_add",),
            _scatter_inputs, f"{ops.SCATTER_H}x{ops.SCATTER_W} map, add",
        ),
    ]  # fmt: skip
    return {op.name: op for op in table}


def make_inputs(op, size, device="cpu", seed=0):
    """(args on device, grad argnums, cotangent) for operator `op` at size string `size`."""
    g = torch.Generator().manual_seed(seed)
    args, grad_argnums, cotangent = op.make_inputs(parse_size(size), g)
    args = tuple(a.to(device) for a in args)
    return args, grad_argnums, None if cotangent is None else cotangent.to(device)


def make_step(fn, args, grad_argnums, cotangent=None):
    """A no-argument closure: one forward and, where the operator has a gradient, one backward.

    Returns the forward's tensors followed by the gradients (in grad_argnums order).
    """
    if grad_argnums:
        args = tuple(a.detach().requires_grad_(i in grad_argnums) for i, a in enumerate(args))
        leaves = [args[i] for i in grad_argnums]

    def step():
        outputs = fn(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if not grad_argnums:
            return outputs
        grads = torch.autograd.grad(outputs[0], leaves, grad_outputs=cotangent)
        return tuple(o.detach() for o in outputs) + tuple(grads)

    return step


def to_float64(args, cotangent):
    cast = lambda t: t.double() if t is not None and t.is_floating_point() else t
    return tuple(cast(a) for a in args), cast(cotangent)


def compare(outputs, reference, tol=1e-4):
    """Max-norm relative error check of every output against the float64 reference.

    Returns (ok, worst relative error). A tensor passes when max|out - ref| <= tol * max(|ref|),
    so float32 rounding over long sums passes and a wrong value anywhere does not.
    """
    if len(outputs) != len(reference):
        return False, math.inf
    worst = 0.0
    for out, ref in zip(outputs, reference):
        if out.shape != ref.shape:
            return False, math.inf
        scale = ref.abs().max().item() if ref.numel() else 0.0
        err = (out.double() - ref).abs().max().item() if ref.numel() else 0.0
        if not math.isfinite(err):
            return False, math.inf
        worst = max(worst, err / max(scale, 1e-30))
    return worst <= tol, worst


# ---------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------


def cuda_graph_step(step):
    """Capture step (forward + backward) in a CUDA graph; returns (replay, the graph's static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as capture requires
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = step()
    return graph.replay, static_outputs


def configure_compile():
    """One compiled entry per (function, shape): never fall back to eager silently when the cache fills."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def compile_form(op, name, dynamic=False, backend="inductor"):
    """The compiled form of candidate `name` of operator `op`."""
    if op.name == "lstm":  # compile the recurrent cell; the loop over time stays in Python
        cell = torch.compile(ops.lstm_cell, dynamic=dynamic, backend=backend)
        return functools.partial(ops.lstm_vectorized, cell=cell)
    return torch.compile(op.candidates[name], dynamic=dynamic, backend=backend)


# ---------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------


def benchmark_sizes(quick, names):
    if quick:
        rows = [(op, size, None, None) for op, size in QUICK_SIZES]
    else:
        rows = [(op, size, pt, fused) for op, size, pt, fused in HPC_RL_V100]
        rows += [(op, size, None, None) for op, size in EXTRA_SIZES]
        order = list(operators())
        rows.sort(key=lambda r: (order.index(r[0]), math.prod(parse_size(r[1]).values())))
    return [r for r in rows if names is None or r[0] in names]


@dataclass
class Checker:
    """Checks a form against the float64 reference, then times it only if it passes."""

    reference: tuple
    device: torch.device
    budget_s: float
    max_reps: int
    tol: float

    def __call__(self, variant, check_run, timed_run=None, outputs=None):
        """Run check_run and compare its outputs (or `outputs`, a CUDA graph's static ones after the
        run); then time timed_run (default: check_run, when the check is at the timed size)."""
        try:
            result = check_run()
            ok, err = compare(result if outputs is None else outputs, self.reference, self.tol)
        except Exception as exc:  # a form that raises is a failing form, reported, not a crash
            return {"variant": variant, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        if not ok:
            return {"variant": variant, "ok": False, "error": f"max relative error {err:.2e} > {self.tol:g}"}
        us, reps = time_call(timed_run or check_run, self.device, self.budget_s, self.max_reps)
        return {"variant": variant, "ok": True, "us": us, "reps": reps, "max_rel_err": err}


def _best(results):
    ok = [r for r in results if r.get("ok")]
    return min(ok, key=lambda r: r["us"]) if ok else (results[0] if results else None)


def run_row(op, size, device, args, compiled_cache):
    """Check and time every form of operator op at one size; returns {form: result}."""
    check_size = op.check_size(size) if op.check_size else size
    built = {s: make_inputs(op, s, device, seed=args.seed) for s in dict.fromkeys([check_size, size])}
    ref_args, ref_cot = to_float64(built[check_size][0], built[check_size][2])
    check = Checker(
        make_step(op.loop, ref_args, built[check_size][1], ref_cot)(), device, args.budget, args.reps, op.tol
    )

    def steps_of(fn):
        """(step at the check size, step at the timed size, or None where the sizes are the same)."""
        check_step = make_step(fn, *built[check_size])
        return check_step, (make_step(fn, *built[size]) if size != check_size else None)

    forms = {"loop": check("loop", *steps_of(op.loop))}
    candidates = [check(name, *steps_of(fn)) for name, fn in op.candidates.items()]
    forms["vectorized"] = dict(_best(candidates), candidates=candidates)
    if args.no_compile:
        return forms
    names = op.cuda_compile_candidates if device.type == "cuda" else op.compile_candidates
    compiled, steps = [], {}
    for name in names:
        if (op.name, name) not in compiled_cache:
            compiled_cache[op.name, name] = compile_form(op, name)
        steps[name] = steps_of(compiled_cache[op.name, name])
        t0 = time.perf_counter()
        result = check(name, *steps[name])
        result["compile_check_time_s"] = time.perf_counter() - t0
        compiled.append(result)
    best = _best(compiled)
    forms["compiled"] = dict(best, candidates=compiled)
    if device.type == "cuda" and best["ok"]:
        forms["cudagraph"] = _cudagraph_result(check, steps[best["variant"]], best["variant"])
    return forms


def _cudagraph_result(check, steps, variant):
    """The compiled step captured in a CUDA graph: a replay checked at the check size, replays timed."""
    check_step, timed_step = steps
    try:
        check_replay, static_outputs = cuda_graph_step(check_step)
        timed_replay = cuda_graph_step(timed_step)[0] if timed_step is not None else None
    except Exception as exc:
        return {"variant": variant, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return check(variant, check_replay, timed_replay, outputs=static_outputs)


def summarize(op_name, size, pt, fused, forms):
    timed = {k: v for k, v in forms.items() if v and v.get("ok")}
    best_form = min(timed, key=lambda k: timed[k]["us"]) if timed else None
    best_us = timed[best_form]["us"] if best_form else None
    loop_us = timed["loop"]["us"] if "loop" in timed else None
    return {
        "operator": op_name,
        "size": size,
        "hpc_rl_v100_pytorch_us": pt,
        "hpc_rl_v100_fused_us": fused,
        "extra_size": pt is None,
        "forms": forms,
        "best_form": best_form,
        "best_us": best_us,
        "best_speedup_vs_loop": loop_us / best_us if best_us and loop_us else None,
        "hpc_rl_fused_over_best": fused / best_us if best_us and fused else None,
    }


FORM_COLUMNS = [
    ("loop", "loop"),
    ("vectorized", "vectorized"),
    ("compiled", "compiled"),
    ("cudagraph", "compiled+cudagraph"),
]


def _us(x):
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _cell(form):
    if form is None:
        return "n/a"
    return _us(form["us"]) if form.get("ok") else "FAIL"


def to_markdown(report):
    info, rows = report["machine"], report["rows"]
    lines = [
        machine_line(info),
        "",
        *([f"Stopped {report['stopped']}.", ""] if report.get("stopped") else []),  # a partial run says so
        "Times in microseconds per call (forward + backward where the operator has a gradient), median after "
        "warm-up; HPC_RL's figures are theirs, on a 32 GB V100. Every form was checked against a float64 "
        "reference first; FAIL = wrong result, not timed; n/a = not run on this device. "
        "Extra sizes (no HPC_RL figure) are leanrl's, to measure the recurrences at T=1024; vtrace_returns and "
        "upgo_returns are V-trace's and UPGO's recurrences alone (targets from given ratios and values, forward "
        "only), without the softmax over actions and the loss that dominate the full operators at B x N = 64 x 16.",
        "",
        "| operator | size | HPC_RL V100 PyTorch us | HPC_RL V100 fused us | "
        + " | ".join(f"{title} us" for _, title in FORM_COLUMNS)
        + " | best / loop | HPC_RL fused / best | variants |",
        "|" + "---|" * (4 + len(FORM_COLUMNS) + 3),
    ]
    known = operators()
    for r in rows:
        forms = r["forms"]
        variants = ", ".join(f"{k}: {forms[k]['variant']}" for k in ("vectorized", "compiled") if forms.get(k))
        notes = known[r["operator"]].notes if r["operator"] in known else ""
        variants += f"; {notes}" if notes else ""
        lines.append(
            f"| {r['operator']} | {r['size']}{' (extra)' if r['extra_size'] else ''} | "
            f"{_us(r['hpc_rl_v100_pytorch_us'])} | {_us(r['hpc_rl_v100_fused_us'])} | "
            + " | ".join(_cell(forms.get(key)) for key, _ in FORM_COLUMNS)
            + f" | {_ratio(r['best_speedup_vs_loop'])} | {_ratio(r['hpc_rl_fused_over_best'])} | {variants} |"
        )
    lines += ["", "Vectorized and compiled candidates (us; FAIL = wrong result):", ""]
    lines += ["| operator | size | form | candidates |", "|---|---|---|---|"]
    for r in rows:
        for key in ("vectorized", "compiled"):
            form = r["forms"].get(key)
            if form and len(form.get("candidates", [])) > 1:
                cands = ", ".join(f"{c['variant']} {_cell(c)}" for c in form["candidates"])
                lines.append(f"| {r['operator']} | {r['size']} | {key} | {cands} |")
    lines += ["", f"Command: `{report['command']}`; total {report['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def _ratio(x):
    if x is None:
        return "—"
    return f"{x:.2g}x" if x < 1 else (f"{x:.1f}x" if x < 100 else f"{x:,.0f}x")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few small sizes per operator")
    p.add_argument(
        "--out", default=None, help=f"folder for rl_ops_<tag>.md/.json (default {FULL_OUT}; --quick: {QUICK_OUT})"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--reps", type=int, default=100, help="most timed repetitions per form")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of timed repetitions aimed at per form")
    p.add_argument("--ops", default=None, help="comma-separated operators (default: all)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled forms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--tag", default=None, help="file suffix (default: the device, e.g. cpu; cpu_quick with --quick)")
    p.add_argument("--merge", nargs="+", default=None, help="combine these JSON reports (parts of one run) instead")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / (QUICK_OUT if args.quick else FULL_OUT))
    return args


def merge_reports(paths):
    """One report from several parts of a run (e.g. --ops splits on a GPU with a per-command time limit)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    devices = {part["machine"]["device"] for part in parts}
    if len(devices) != 1:
        raise ValueError(f"--merge: parts come from different devices {sorted(devices)}")
    order = {(op, size): i for i, (op, size, *_) in enumerate(benchmark_sizes(False, None))}
    rows = sorted(
        (row for part in parts for row in part["rows"]), key=lambda r: order.get((r["operator"], r["size"]), 1e9)
    )
    return {
        "machine": parts[0]["machine"],
        "quick": any(part.get("quick", False) for part in parts),
        "command": " + ".join(part["command"] for part in parts),
        "wall_s": sum(part["wall_s"] for part in parts),
        "rows": rows,
        "stopped": "; ".join(f"part {i + 1} {part['stopped']}" for i, part in enumerate(parts) if part.get("stopped"))
        or None,
    }


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        report = merge_reports(args.merge)
        tag = args.tag or Path(args.merge[0]).stem.removeprefix("rl_ops_").split("_part")[0]
        return write_or_refuse(report, args.out, tag, "rl_ops", to_markdown)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available on this machine", file=sys.stderr)
        return 2
    known = operators()
    names = None if args.ops is None else args.ops.split(",")
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        print(f"--ops: unknown operator(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    configure_compile()
    start = time.perf_counter()
    info = machine_info(device)
    print(machine_line(info), file=sys.stderr)
    rows, compiled_cache = [], {}
    report = {
        "machine": info,
        "quick": args.quick,
        "command": "python benchmarks/bench_rl_operators.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "rows": rows,
    }
    with stopped_by_signal(report):
        for op_name, size, pt, fused in benchmark_sizes(args.quick, names):
            t0 = time.perf_counter()
            forms = run_row(known[op_name], size, device, args, compiled_cache)
            rows.append(summarize(op_name, size, pt, fused, forms))
            cells = "  ".join(f"{key}={_cell(forms.get(key))}" for key, _ in FORM_COLUMNS)
            print(f"{op_name:13s} {size:20s} {cells}  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    report["wall_s"] = time.perf_counter() - start
    report["machine"]["load_average_at_end"] = _load_average()
    print(f"total {report['wall_s']:.0f} s", file=sys.stderr)
    tag = args.tag or device_tag(device) + ("_quick" if args.quick else "")
    return write_or_refuse(report, args.out, tag, "rl_ops", to_markdown)


if __name__ == "__main__":
    sys.exit(main())
