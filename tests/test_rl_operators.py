"""benchmarks/rl_operators.py, timed by bench_rl_operators.py: every form of every operator against a float64 reference.

The references here are written from the definitions, scalar by scalar (plain Python loops over time),
in float64; gradients come from float64 autograd of the reference loss. Forms: the Python loop, every
vectorized candidate, and the compiled form (torch.compile with dynamic shapes, one compile per
operator, shared by both sizes: aot_eager in CI, inductor with -m slow). CUDA graphs need a GPU and are exercised
by the benchmark itself.
"""

import csv
import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from benchmarks import bench_rl_operators as bench
from benchmarks import rl_operators
from tests.reference import gae_reference, ppo_loss_reference

ROOT = Path(__file__).resolve().parents[1]
OPS = bench.operators()
GAMMA, LAM = 0.99, 0.95

# Two small sizes per operator, with episode ends. T=33 crosses a 32-step chunk and is no power of 2
# (the solvers are also checked alone at many T below); the second size changes B only, so that one
# dynamic-shape compile serves both (a new T means a new compile of the doubling loop).
SIZES = {
    "gae": ["T=33,B=3", "T=33,B=5"],
    "td_lambda": ["T=33,B=4", "T=33,B=2"],
    "qntd": ["T=3,B=4,N=5", "T=5,B=6,N=7"],
    "qntd_rescale": ["T=3,B=4,N=5", "T=5,B=6,N=7"],
    "dntd": ["T=3,B=4,N=5", "T=5,B=6,N=7"],
    "vtrace": ["T=33,B=3,N=4", "T=33,B=4,N=5"],
    "upgo": ["T=33,B=3,N=4", "T=33,B=4,N=5"],
    "vtrace_returns": ["T=33,B=3", "T=33,B=4"],
    "upgo_returns": ["T=33,B=3", "T=33,B=4"],
    "ppo": ["B=8,N=3", "B=20,N=6"],
    "lstm": ["seq_len=3,B=2", "seq_len=6,B=3"],
    "scatter": ["B=2,M=5,N=3", "B=3,M=12,N=4"],
}
SMALL_LSTM = {"input_size": 6, "hidden": 4, "layers": 2}


def f64(t):
    return t.double() if t.is_floating_point() else t


def inputs_for(op_name, size, seed=0):
    """(args, grad argnums, cotangent) as the benchmark builds them; the LSTM with small dimensions."""
    if op_name == "lstm":
        g = torch.Generator().manual_seed(seed)
        args, grad_argnums, cot = bench._lstm_inputs(bench.parse_size(size), g, **SMALL_LSTM)
        return args, grad_argnums, cot
    return bench.make_inputs(OPS[op_name], size, seed=seed)


# ---------------------------------------------------------------------------------------------------
# Independent float64 references
# ---------------------------------------------------------------------------------------------------


def lambda_returns_reference(rewards, values, dones, next_value, next_done, gamma, lam):
    """G_t = r_t + gamma (1 - d_{t+1}) ((1 - lam) V_{t+1} + lam G_{t+1}); G_T = V_T = next_value."""
    r, v, d = rewards.double().tolist(), values.double().tolist(), dones.double().tolist()
    nv, nd = next_value.double().tolist(), next_done.double().tolist()
    T, B = len(r), len(r[0])
    out = [[0.0] * B for _ in range(T)]
    for b in range(B):
        g = nv[b]
        for t in reversed(range(T)):
            v_next, d_next = (nv[b], nd[b]) if t == T - 1 else (v[t + 1][b], d[t + 1][b])
            g = r[t][b] + gamma * (1 - d_next) * ((1 - lam) * v_next + lam * g)
            out[t][b] = g
    return torch.tensor(out, dtype=torch.float64)


def td_lambda_reference(rewards, values, dones, next_value, next_done):
    returns = lambda_returns_reference(rewards, values, dones, next_value, next_done, GAMMA, LAM)
    v = f64(values).detach().requires_grad_(True)
    loss = 0.5 * ((returns - v) ** 2).mean()
    return (loss, returns), torch.autograd.grad(loss, [v])


def h_reference(x, eps=rl_operators.RESCALE_EPS):
    return math.copysign(math.sqrt(abs(x) + 1) - 1, x) + eps * x


def h_inverse_reference(y, eps=rl_operators.RESCALE_EPS):
    """The textbook closed form (with the cancellation the module avoids; fine in float64)."""
    s = (math.sqrt(1 + 4 * eps * (abs(y) + 1 + eps)) - 1) / (2 * eps)
    return math.copysign(s * s - 1, y)


def nstep_targets(next_n_q, next_n_action, reward, done, rescale):
    n, B = reward.shape
    targets = []
    for b in range(B):
        ret = sum(GAMMA**k * float(reward[k, b]) for k in range(n))
        boot = float(next_n_q[b, next_n_action[b]])
        if rescale:
            boot = h_inverse_reference(boot)
        target = ret + GAMMA**n * (1 - float(done[b])) * boot
        targets.append(h_reference(target) if rescale else target)
    return torch.tensor(targets, dtype=torch.float64)


def qntd_reference(q, next_n_q, action, next_n_action, reward, done, weight, rescale=False):
    target = nstep_targets(next_n_q, next_n_action, reward, done, rescale)
    q64 = f64(q).detach().requires_grad_(True)
    td = torch.stack([q64[b, action[b]] for b in range(len(action))]) - target
    loss = (f64(weight) * td**2).mean()
    return (loss, td), torch.autograd.grad(loss, [q64])


def c51_reference(
    probs, reward_sum, discount, atoms=bench.C51_ATOMS, v_min=rl_operators.C51_VMIN, v_max=rl_operators.C51_VMAX
):
    """Dopamine-style projection: split between floor and ceil; all mass on l when floor == ceil."""
    dz = (v_max - v_min) / (atoms - 1)
    B = len(reward_sum)
    out = torch.zeros(B, atoms, dtype=torch.float64)
    for b in range(B):
        for j in range(atoms):
            tz = min(max(float(reward_sum[b]) + float(discount[b]) * (v_min + j * dz), v_min), v_max)
            pos = (tz - v_min) / dz
            lo, hi = math.floor(pos), math.ceil(pos)
            p = float(probs[b, j])
            if lo == hi:
                out[b, lo] += p
            else:
                out[b, lo] += p * (hi - pos)
                out[b, hi] += p * (pos - lo)
    return out


def dntd_reference(dist, next_n_dist, action, next_n_action, reward, done, weight):
    n, B = reward.shape
    ret = torch.tensor([sum(GAMMA**k * float(reward[k, b]) for k in range(n)) for b in range(B)])
    nxt = torch.stack([f64(next_n_dist)[b, next_n_action[b]] for b in range(B)])
    target = c51_reference(nxt, ret, GAMMA**n * (1 - f64(done)))
    d64 = f64(dist).detach().requires_grad_(True)
    per_sample = torch.stack([-(target[b] * torch.log(d64[b, action[b]])).sum() for b in range(B)])
    loss = (f64(weight) * per_sample).mean()
    return (loss, per_sample), torch.autograd.grad(loss, [d64])


def log_softmax_reference(logits):
    return logits - torch.log(torch.exp(logits).sum(-1, keepdim=True))


def vtrace_targets_reference(log_rhos, rewards, values, dones, next_value, next_done):
    """IMPALA (Espeholt et al. 2018), eq. 1 with rho-bar = c-bar = lambda = 1, scalar by scalar:
    (vs, policy advantages) in float64."""
    T, B = rewards.shape
    lr, r, V = log_rhos.double().tolist(), rewards.double().tolist(), values.double().tolist()
    vs = torch.zeros(T, B, dtype=torch.float64)
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        disc = [GAMMA * (1 - float(dones[t + 1, b])) for t in range(T - 1)] + [GAMMA * (1 - float(next_done[b]))]
        value = [V[t][b] for t in range(T)] + [float(next_value[b])]
        following = 0.0  # vs_{t+1} - V_{t+1}
        for t in reversed(range(T)):
            rho = c = min(1.0, math.exp(lr[t][b]))
            following = rho * (r[t][b] + disc[t] * value[t + 1] - value[t]) + disc[t] * c * following
            vs[t, b] = value[t] + following
        for t in range(T):
            vs_next = float(next_value[b]) if t == T - 1 else float(vs[t + 1, b])
            adv[t, b] = min(1.0, math.exp(lr[t][b])) * (r[t][b] + disc[t] * vs_next - value[t])
    return vs, adv


def vtrace_reference(target_logits, behaviour_logits, actions, rewards, values, dones, next_value, next_done):
    logits = f64(target_logits).detach().requires_grad_(True)
    v64 = f64(values).detach().requires_grad_(True)
    logp = log_softmax_reference(logits)
    logp_a = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    blogp_a = log_softmax_reference(f64(behaviour_logits)).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    vs, adv = vtrace_targets_reference(logp_a.detach() - blogp_a, rewards, values, dones, next_value, next_done)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    loss = -(logp_a * adv).mean() + 0.5 * 0.5 * ((vs - v64) ** 2).mean() - 0.01 * entropy
    return (loss, vs, adv), torch.autograd.grad(loss, [logits, v64])


def upgo_returns_reference(rewards, values, dones, next_value, next_done):
    """AlphaStar's UPGO: G_t = r_t + gamma_t (G_{t+1} if Q_{t+1} >= V_{t+1} else V_{t+1}), scalar by scalar."""
    T, B = rewards.shape
    r, v = rewards.double().tolist(), values.double().tolist()
    returns = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        # gamma_t (zero when obs[t + 1] starts a new episode) and V_t for t = 0..T (V_T = next_value)
        disc = [GAMMA * (1 - float(dones[t + 1, b])) for t in range(T - 1)] + [GAMMA * (1 - float(next_done[b]))]
        value = [v[t][b] for t in range(T)] + [float(next_value[b])]
        g = value[T]
        for t in reversed(range(T)):
            follow = t == T - 1 or r[t + 1][b] + disc[t + 1] * value[t + 2] >= value[t + 1]
            g = r[t][b] + disc[t] * (g if follow else value[t + 1])
            returns[t, b] = g
    return returns


def upgo_reference(target_logits, rhos, actions, rewards, values, dones, next_value, next_done):
    returns = upgo_returns_reference(rewards, values, dones, next_value, next_done)
    logits = f64(target_logits).detach().requires_grad_(True)
    logp_a = log_softmax_reference(logits).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    loss = -(f64(rhos) * (returns - f64(values)) * logp_a).mean()
    return (loss, returns), torch.autograd.grad(loss, [logits])


def ppo_reference(logits, old_logits, actions, newvalue, oldvalue, advantages, returns):
    """Values from tests/reference.ppo_loss_reference; gradients from a float64 per-sample autograd twin."""
    lg = f64(logits).detach().requires_grad_(True)
    nv = f64(newvalue).detach().requires_grad_(True)
    logp, old_logp = log_softmax_reference(lg), log_softmax_reference(f64(old_logits))
    newlogprob = torch.stack([logp[i, actions[i]] for i in range(len(actions))])
    oldlogprob = torch.stack([old_logp[i, actions[i]] for i in range(len(actions))])
    entropy = -(logp.exp() * logp).sum(-1)
    stats = ppo_loss_reference(
        newlogprob, oldlogprob, entropy, nv, oldvalue, advantages, returns, 0.2, 0.01, 0.5, True, True
    )
    adv = f64(advantages)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    terms = []
    for i in range(len(actions)):
        ratio = torch.exp(newlogprob[i] - oldlogprob[i])
        policy = torch.max(-adv[i] * ratio, -adv[i] * ratio.clamp(0.8, 1.2))
        v_clip = float(oldvalue[i]) + (nv[i] - float(oldvalue[i])).clamp(-0.2, 0.2)
        value = 0.5 * torch.max((nv[i] - float(returns[i])) ** 2, (v_clip - float(returns[i])) ** 2)
        terms.append(policy - 0.01 * entropy[i] + 0.5 * value)
    loss = torch.stack(terms).mean()
    assert math.isclose(float(loss.detach()), stats["loss"], rel_tol=1e-9, abs_tol=1e-12)
    names = ("loss", "policy", "value", "entropy", "approx_kl", "clipfrac")
    values = tuple(torch.tensor(stats[k], dtype=torch.float64) for k in names)
    return values, torch.autograd.grad(loss, [lg, nv])


def layer_norm_reference(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def lstm_reference(x, h0, c0, *params, cotangent):
    """HPC_RL's LN-LSTM, float64, with LayerNorm written out; gradients of <output, cotangent>."""
    leaves = [f64(x).detach().requires_grad_(True)] + [f64(p).detach().requires_grad_(True) for p in params]
    inp, ps = leaves[0], leaves[1:]
    hs, cs = [], []
    for layer in range(len(ps) // 7):
        wx, wh, bias, gxw, gxb, ghw, ghb = ps[layer * 7 : layer * 7 + 7]
        h, c = f64(h0[layer]), f64(c0[layer])
        out = []
        for t in range(inp.shape[0]):
            gates = layer_norm_reference(inp[t] @ wx, gxw, gxb) + layer_norm_reference(h @ wh, ghw, ghb) + bias
            H = wh.shape[0]
            i, f, o, u = (gates[:, k * H : (k + 1) * H] for k in range(4))
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
            h = torch.sigmoid(o) * torch.tanh(c)
            out.append(h)
        inp = torch.stack(out)
        hs.append(h)
        cs.append(c)
    grads = torch.autograd.grad(inp, leaves, grad_outputs=f64(cotangent))
    return (inp, torch.stack(hs), torch.stack(cs)), grads


def scatter_reference(features, locations, cotangent):
    B, M, N = features.shape
    out = torch.zeros(B, N, rl_operators.SCATTER_H, rl_operators.SCATTER_W, dtype=torch.float64)
    grad = torch.zeros(B, M, N, dtype=torch.float64)
    for b in range(B):
        for m in range(M):
            y, x = int(locations[b, m, 0]), int(locations[b, m, 1])
            out[b, :, y, x] += f64(features[b, m])
            grad[b, m] = f64(cotangent[b, :, y, x])  # the adjoint of an add is a gather
    return (out,), (grad,)


def reference(op_name, args, cotangent):
    """(outputs, gradients) of the independent reference for operator op_name."""
    if op_name == "gae":
        return (gae_reference(*args, GAMMA, LAM),), ()
    if op_name == "td_lambda":
        return td_lambda_reference(*args)
    if op_name in ("qntd", "qntd_rescale"):
        return qntd_reference(*args, rescale=op_name == "qntd_rescale")
    if op_name == "lstm":
        return lstm_reference(*args, cotangent=cotangent)
    if op_name == "scatter":
        return scatter_reference(*args, cotangent)
    if op_name == "vtrace_returns":
        return vtrace_targets_reference(*args), ()
    if op_name == "upgo_returns":
        return (upgo_returns_reference(*args),), ()
    return {"dntd": dntd_reference, "vtrace": vtrace_reference, "upgo": upgo_reference, "ppo": ppo_reference}[op_name](
        *args
    )


# ---------------------------------------------------------------------------------------------------
# Every form of every operator
# ---------------------------------------------------------------------------------------------------

_COMPILED = {}


def compiled_form(op_name, backend):
    """The CPU compiled form, compiled once per operator and backend with dynamic shapes (both sizes share it)."""
    if (op_name, backend) not in _COMPILED:
        bench.configure_compile()
        op = OPS[op_name]
        _COMPILED[op_name, backend] = bench.compile_form(op, op.compile_candidates[0], dynamic=True, backend=backend)
    return _COMPILED[op_name, backend]


# The compiled form through aot_eager in CI: Dynamo's graphs of the candidate, with dynamic shapes, and AOTAutograd's
# backward, run with eager's kernels. Through inductor (the form the benchmark times) with -m slow: building its
# kernels for every operator took about 175 s in a cold CI run on 2 cores. The benchmark itself checks every form,
# the compiled one included, against the float64 reference before it times it (a failing form is not timed).
COMPILED_FORMS = {"compiled": "aot_eager", "compiled-inductor": "inductor"}


def forms_of(op_name):
    op = OPS[op_name]
    forms = [("loop", lambda: op.loop)]
    forms += [(name, lambda fn=fn: fn) for name, fn in op.candidates.items()]
    forms += [(form, lambda b=backend: compiled_form(op_name, b)) for form, backend in COMPILED_FORMS.items()]
    return forms


CASES = [(op, size, form) for op in SIZES for size in SIZES[op] for form, _ in forms_of(op)]
CASE_PARAMS = [
    pytest.param(*case, marks=[pytest.mark.slow] if case[2] == "compiled-inductor" else [], id="-".join(case))
    for case in CASES
]


def check_against_reference(op_name, size, fn):
    args, grad_argnums, cotangent = inputs_for(op_name, size)
    ref_outputs, ref_grads = reference(op_name, args, cotangent)
    results = bench.make_step(fn, args, grad_argnums, cotangent)()
    outputs, grads = results[: len(results) - len(grad_argnums)], results[len(results) - len(grad_argnums) :]
    assert len(outputs) >= len(ref_outputs)
    for i, (got, want) in enumerate(zip(outputs, ref_outputs)):
        torch.testing.assert_close(got, want.to(got.dtype), rtol=2e-5, atol=2e-5, msg=lambda m, i=i: f"output {i}: {m}")
    assert len(grads) == len(ref_grads)
    for i, (got, want) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(got, want.to(got.dtype), rtol=2e-5, atol=2e-5, msg=lambda m, i=i: f"grad {i}: {m}")


@pytest.mark.parametrize("op_name,size,form", CASE_PARAMS)
def test_form_matches_float64_reference(op_name, size, form):
    fn = dict(forms_of(op_name))[form]()
    check_against_reference(op_name, size, fn)


def test_inputs_have_episode_ends_and_are_not_trivial():
    for op_name in ("gae", "td_lambda", "vtrace", "upgo", "vtrace_returns", "upgo_returns"):
        for size in SIZES[op_name]:
            args, _, _ = inputs_for(op_name, size)
            dones = args[-3]
            assert 0 < dones.sum() < dones.numel()
            assert args[-1].sum() > 0  # some next_done too
            assert all(a.abs().sum() > 0 for a in args if a.is_floating_point())


def test_ppo_stats_match_reference_fields():
    """approx_kl and clipfrac are compared too (they are outputs 4 and 5)."""
    args, _, _ = inputs_for("ppo", "B=20,N=6")
    outs = rl_operators.ppo_vectorized(*args)
    ref, _ = ppo_reference(*args)
    assert 0 < float(ref[5]) < 1  # some samples clipped, some not
    for got, want in zip(outs, ref):
        torch.testing.assert_close(got.detach(), want.float(), rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------------------------
# Solvers, value rescaling, C51 projection
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 3, 31, 32, 33, 70])
@pytest.mark.parametrize("solver", ["doubling", "chunked", "assoc"])
def test_reverse_scan_solvers(T, solver):
    g = torch.Generator().manual_seed(T)
    a = torch.rand(T, 3, 2, generator=g) * (torch.rand(T, 3, 2, generator=g) > 0.2)  # zeros = episode ends
    b, last = torch.randn(T, 3, 2, generator=g), torch.randn(3, 2, generator=g)
    want = torch.zeros(T, 3, 2, dtype=torch.float64)
    x = last.double()
    for t in reversed(range(T)):
        x = b[t].double() + a[t].double() * x
        want[t] = x
    torch.testing.assert_close(rl_operators.SCANS[solver](a, b, last), want.float())


def test_gae_cumsum_refuses_underflow():
    rewards, values, dones, nv, nd = (torch.zeros(4000, 2),) * 3 + (torch.zeros(2),) * 2
    with pytest.raises(ValueError, match="underflow"):
        rl_operators.gae_cumsum(rewards, values, dones, nv, nd, gamma=0.5, gae_lambda=0.5)


def test_value_rescale_and_exact_inverse():
    xs = [0.0, 1e-8, -1e-6, 0.3, -1.0, 2.5, -17.0, 123.0, -4.5e3, 1e6, -3e7]
    x = torch.tensor(xs, dtype=torch.float64)
    h = rl_operators.value_rescale(x)
    torch.testing.assert_close(h, torch.tensor([h_reference(v) for v in xs], dtype=torch.float64))
    torch.testing.assert_close(rl_operators.inverse_value_rescale(h), x, rtol=1e-12, atol=1e-12)
    ys = torch.linspace(-300, 300, 2001, dtype=torch.float64)
    want = torch.tensor([h_inverse_reference(float(y)) for y in ys], dtype=torch.float64)
    torch.testing.assert_close(rl_operators.inverse_value_rescale(ys), want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        rl_operators.value_rescale(rl_operators.inverse_value_rescale(ys)), ys, rtol=1e-12, atol=1e-12
    )
    # float32: the stable root keeps small values accurate
    y32 = torch.tensor([1e-4, -1e-3, 0.01, 5.0, -80.0])
    torch.testing.assert_close(
        rl_operators.value_rescale(rl_operators.inverse_value_rescale(y32)), y32, rtol=1e-5, atol=1e-6
    )


PROJECTORS = [rl_operators.c51_project, rl_operators.c51_project_hat, rl_operators.c51_project_loop]


@pytest.mark.parametrize("project", PROJECTORS, ids=lambda f: f.__name__)
def test_c51_projection_conserves_mass_and_matches_reference(project):
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(9, 51, generator=g, dtype=torch.float64), -1)
    reward = torch.tensor([0.0, 0.4, -0.4, 3.0, -25.0, 25.0, 9.9, 0.123, -7.77], dtype=torch.float64)
    discount = torch.tensor([0.99, 0.0, 1.0, 0.5, 0.99, 0.99, 0.3, 1.0, 0.0], dtype=torch.float64)
    got = project(probs, reward, discount)
    torch.testing.assert_close(got.sum(1), torch.ones(9, dtype=torch.float64))
    torch.testing.assert_close(got, c51_reference(probs, reward, discount))


@pytest.mark.parametrize("project", PROJECTORS, ids=lambda f: f.__name__)
def test_c51_projection_exact_atom_targets_lose_no_mass(project):
    """Targets exactly on atoms (floor == ceil): the classic bug drops their mass; here it stays on the atom."""
    probs = torch.softmax(torch.randn(4, 51, dtype=torch.float64), -1)
    # discount 0: every atom lands on the reward; 0.4 = atom 26, -10 = atom 0, 10 = atom 50 (edges)
    reward = torch.tensor([0.4, -10.0, 10.0, 0.0], dtype=torch.float64)
    got = project(probs, reward, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    for row, atom in enumerate([26, 0, 50]):
        torch.testing.assert_close(got[row], F.one_hot(torch.tensor(atom), 51).double())
    torch.testing.assert_close(got[3], probs[3])  # r = 0, discount 1: every atom onto itself
    # float32 too: positions that round to exact integers keep all their mass
    got32 = project(probs.float(), reward.float(), torch.tensor([0.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(got32.sum(1), torch.ones(4))


# ---------------------------------------------------------------------------------------------------
# The benchmark itself
# ---------------------------------------------------------------------------------------------------


def test_hpc_rl_table_is_in_the_repository_with_its_source():
    """The V100 figures the benchmark compares against live in the repository (a clone has no ../shared)."""
    text = bench.HPC_RL_CSV.read_text()
    assert bench.HPC_RL_CSV.parent == ROOT / "benchmarks"
    assert "Source: HPC_RL" in text and "32 GB V100" in text
    assert len(bench.HPC_RL_V100) == 56 and all(pt > 0 and fused > 0 for *_, pt, fused in bench.HPC_RL_V100)
    assert ("gae", "T=1024,B=64", 65850, 240) in bench.HPC_RL_V100  # the spec's GAE target row
    assert ("vtrace", "T=128,B=128,N=128", 11095, 459) in bench.HPC_RL_V100  # and its V-trace one
    assert {op for op, *_ in bench.HPC_RL_V100} | {"vtrace_returns", "upgo_returns"} == set(OPS)


def test_hpc_rl_table_matches_the_anchor_csv():
    """The repository's copy is the anchors file unchanged (checked where ../shared sits beside the checkout)."""
    path = ROOT.parent / "shared" / "anchors" / "hpc_rl_v100.csv"
    if not path.exists():
        pytest.skip("anchors csv not beside the checkout (the repository's copy is checked above)")
    with path.open() as fh:
        rows = [(r["operator"], r["size"], int(r["pytorch_us"]), int(r["hpc_rl_us"])) for r in csv.DictReader(fh)]
    ours = [(bench.CSV_NAMES.get(op, op), size, pt, fused) for op, size, pt, fused in bench.HPC_RL_V100]
    assert sorted(ours) == sorted(rows)
    data_lines = [line for line in bench.HPC_RL_CSV.read_text().splitlines() if not line.startswith("#")]
    assert data_lines == path.read_text().splitlines()


def test_every_benchmark_size_builds_valid_inputs():
    """Full-size rows parse and map to operators; inputs are built for the cheap ones."""
    for op_name, size, _, _ in bench.benchmark_sizes(quick=False, names=None):
        dims = bench.parse_size(size)
        assert op_name in OPS and dims
    args, _, _ = bench.make_inputs(OPS["dntd"], "T=16,B=128,N=128")
    assert args[0].shape == (128, 128, 51)


def test_quick_run_writes_well_formed_table_and_json(tmp_path):
    assert bench.main(["--quick", "--out", str(tmp_path), "--no-compile", "--budget", "0.02", "--reps", "5"]) == 0
    check_outputs(tmp_path, expected_rows=len(bench.QUICK_SIZES), compiled=False, tag="cpu_quick")


def test_quick_runs_go_to_scratch_and_never_replace_a_full_report(tmp_path, capsys):
    # from any working directory, a quick run's default folder is the git-ignored runs/, a full run's the committed one
    assert Path(bench.parse_args(["--quick"]).out) == ROOT / "runs" / "benchmarks"
    assert Path(bench.parse_args([]).out) == ROOT / "benchmarks" / "results"
    full = {"machine": {"device": "cpu"}, "quick": False, "command": "full", "wall_s": 851.0, "rows": []}
    for name in ("rl_ops_cpu.json", "rl_ops_cpu_quick.json"):
        (tmp_path / name).write_text(json.dumps(full))
    (tmp_path / "rl_ops_cpu.md").write_text("the full table\n")
    quick = ["--quick", "--out", str(tmp_path), "--no-compile", "--budget", "0.02", "--reps", "1", "--ops", "gae"]
    assert bench.main([*quick, "--tag", "cpu"]) == 2
    assert bench.main(quick) == 2  # a full run saved under the quick name is not replaced either
    assert "holds a full run" in capsys.readouterr().err
    assert json.loads((tmp_path / "rl_ops_cpu.json").read_text()) == full
    assert (tmp_path / "rl_ops_cpu.md").read_text() == "the full table\n"
    # a quick report may replace a quick one
    assert bench.main([*quick, "--tag", "cpu_scratch"]) == 0
    assert bench.main([*quick, "--tag", "cpu_scratch"]) == 0
    assert json.loads((tmp_path / "rl_ops_cpu_scratch.json").read_text())["quick"] is True


def test_quick_run_with_compile_in_parts_then_merged(tmp_path):
    common = ["--quick", "--out", str(tmp_path), "--budget", "0.02", "--reps", "5", "--threads", "1"]
    assert bench.main([*common, "--ops", "gae", "--tag", "cpu_part1"]) == 0
    assert bench.main([*common, "--ops", "scatter", "--tag", "cpu_part2"]) == 0
    parts = [str(tmp_path / f"rl_ops_cpu_part{i}.json") for i in (1, 2)]
    assert bench.main(["--merge", *parts, "--out", str(tmp_path)]) == 0
    check_outputs(tmp_path, expected_rows=3, compiled=True)
    report = json.loads((tmp_path / "rl_ops_cpu.json").read_text())
    assert [r["operator"] for r in report["rows"]] == ["gae", "gae", "scatter"]
    assert report["machine"]["torch_threads"] == 1


def check_outputs(out, expected_rows, compiled, tag="cpu"):
    md = (out / f"rl_ops_{tag}.md").read_text().splitlines()
    report = json.loads((out / f"rl_ops_{tag}.json").read_text())
    assert md[0].startswith("Measured on CPU only; CPU ") and "torch " in md[0] and "cores" in md[0]
    header = next(line for line in md if line.startswith("| operator | size | HPC_RL"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:4] == ["operator", "size", "HPC_RL V100 PyTorch us", "HPC_RL V100 fused us"]
    assert {"loop us", "vectorized us", "compiled us", "compiled+cudagraph us", "best / loop"} <= set(columns)
    start = md.index(header) + 2
    body = md[start : start + expected_rows]
    assert all(len(line.strip("|").split("|")) == len(columns) for line in body)
    assert len(report["rows"]) == expected_rows
    assert {"device", "cpu", "cpu_count", "torch"} <= set(report["machine"])
    for row in report["rows"]:
        assert row["forms"]["loop"]["ok"] and row["forms"]["vectorized"]["ok"], row
        assert row["best_us"] > 0 and row["best_speedup_vs_loop"] > 0
        assert ("compiled" in row["forms"]) == compiled
        if compiled:
            assert row["forms"]["compiled"]["ok"], row["forms"]["compiled"]
        assert "FAIL" not in "".join(body)


def test_bad_flags_exit_2(capsys):
    assert bench.main(["--ops", "nope"]) == 2
    assert "--ops" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bench.main(["--device", "cuda"]) == 2
        assert "CUDA" in capsys.readouterr().err


def test_import_does_no_work(tmp_path):
    code = "import sys; sys.path.insert(0, sys.argv[1]); import benchmarks.bench_rl_operators as m; "
    code += "print(len(vars(m)) > 10)"
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "True" and not proc.stderr.strip()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script, prefix", [("bench_rl_operators.py", "rl_ops"), ("replay.py", "replay")])
def test_a_benchmark_stopped_by_sigterm_still_writes_the_rows_it_measured(script, prefix, tmp_path):
    """A GPU command's time is limited (`timeout` sends SIGTERM): the rows measured before the signal are written,
    and the report says it stopped early (on 2026-11-28 both benchmarks were killed on an H200 and wrote nothing)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--no-compile", "--budget", "0.02"]
    cmd += ["--out", str(tmp_path), "--tag", "stopped"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    printed = 0
    for line in proc.stderr:  # each measured row ends with its seconds, "(3 s)"
        printed += bool(re.search(r"\(\d+ s\)$", line.strip()))
        if printed == 2:
            proc.send_signal(signal.SIGTERM)
            break
    proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and printed == 2
    report = json.loads((tmp_path / f"{prefix}_stopped.json").read_text())
    measured = report["rows"] + report.get("samplers", [])
    assert report["stopped"] and len(measured) >= 2
    assert "Stopped by a signal" in (tmp_path / f"{prefix}_stopped.md").read_text()


def test_the_gpu_wrappers_dry_run_covers_every_operator_in_its_parts_and_every_buffer(tmp_path):
    """benchmarks/gpu_benchmarks.sh --dry-run: its three operator parts merged hold every operator (a part left out of
    the wrapper's list fails it), the replay report holds the buffers and the samplers, the distributed PPO ran as one
    rank in a process group of one (its results line), at most 7 files come back."""
    out = tmp_path / "out"
    proc = subprocess.run([str(ROOT / "benchmarks" / "gpu_benchmarks.sh"), "--dry-run", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    ops = json.loads((out / "rl_ops_cpu.json").read_text())
    assert {row["operator"] for row in ops["rows"]} == set(bench.operators()) and not ops["stopped"]
    replay_report = json.loads((out / "replay_cpu.json").read_text())
    assert replay_report["rows"] and replay_report["samplers"] and not replay_report["stopped"]
    [nccl] = [json.loads(line) for line in (out / "nccl.jsonl").read_text().splitlines()]
    assert (nccl["status"], nccl["backend"], nccl["world_size"], nccl["steps"]) == ("ok", "gloo", 1, 64)
    assert len(list(out.iterdir())) <= 7
