"""The checkers of tests/gpu_standin.py bite: a CPU capture gives the numbers of a run without CUDA graphs for a
correct step, and fails or differs for each fault a real CUDA graph would expose; the contract, host-read and upload
counters see what they claim to see."""

from functools import partial
from pathlib import Path

import pytest
import torch
from gpu_standin import HostReadDuringCapture, compile_through_dispatcher, cuda_graphs_on_cpu, host_reads, uploads
from tensordict.nn import CudaGraphModule

HERE = Path(__file__).resolve().parent


class Step:
    """A small training step with Adam on an lr tensor, as the twins write it: capturable, everything a tensor."""

    def __init__(self, fault=None, compile=False):
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
        self.lr = torch.tensor(0.05)
        self.optimizer = torch.optim.Adam([self.w], lr=self.lr, capturable=True, foreach=True)
        self.fault, self.count = fault, 0
        self.fn = torch.compile(self.step) if compile else self.step

    def step(self, x, y):
        self.count += 1
        noise = torch.randn_like(y) * 0.01  # RNG inside the step: replays draw anew, like the eager run
        loss = ((x @ self.w - y - noise) ** 2).mean()
        if self.fault == "float read":
            loss = loss * float(loss.detach())  # a host read inside the captured step
        if self.fault == "int at capture":
            loss = loss * int(y.argmax())
        if self.fault == "python counter":
            loss = loss * self.count  # frozen at its capture value by a graph
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def data(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)) for _ in range(n)]


def train(fault=None, graphs=False, compile=False, rebind_lr=False, steps=6, warmup=2):
    torch.manual_seed(0)
    step = Step(fault, compile)
    fn = CudaGraphModule(step.fn, warmup=warmup) if graphs else step.fn
    losses = []
    for i, (x, y) in enumerate(data(steps)):
        if rebind_lr and i == 4:
            step.optimizer.param_groups[0]["lr"] = 0.5  # a float: a captured graph keeps reading the old tensor
        elif i == 4:
            step.lr.fill_(0.5)  # the tensor written in place: a captured graph sees it
        losses.append(fn(x, y).clone())
    return torch.stack(losses), step.w.detach().clone()


def test_capture_on_cpu_gives_the_numbers_of_the_run_without_graphs():
    with cuda_graphs_on_cpu() as contracts:
        want = train()
        got = train(graphs=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (contract,) = contracts
    assert contract.calls == 6 and contract.captured_at == 2 and contract.violations(max_bytes_in=10**6) == []


def test_the_capture_runs_no_python_at_replay():
    """Proof that replays replay: a step whose Python changes each call (a counter) gives other numbers."""
    with cuda_graphs_on_cpu():
        want = train("python counter")
        got = train("python counter", graphs=True)
    assert not torch.allclose(got[1][0], want[1][0])
    assert torch.equal(got[0][:2], want[0][:2])  # the same until the capture


@pytest.mark.parametrize("fault", ["float read", "int at capture"])
def test_a_host_read_inside_the_capture_raises(fault):
    with cuda_graphs_on_cpu(), pytest.raises(HostReadDuringCapture):
        train(fault, graphs=True)


def test_an_lr_rebound_as_a_float_changes_the_numbers():
    with cuda_graphs_on_cpu():
        want = train(rebind_lr=True)
        got = train(graphs=True, rebind_lr=True)
    assert torch.equal(got[0][:5], want[0][:5]) and not torch.allclose(got[1], want[1])


def test_the_capture_undoes_its_writes_and_its_rng():
    """The captured call runs once for real (tensordict runs the function on copies first) and once on tape: the
    parameters and the RNG after it are those of one step, not two."""
    with cuda_graphs_on_cpu():
        torch.manual_seed(0)
        step = Step()
        fn = CudaGraphModule(step.step, warmup=1)
        x, y = data(1)[0]
        fn(x, y)
        after_capture = step.w.detach().clone(), torch.rand(1)
        torch.manual_seed(0)
        plain = Step()
        plain.step(x, y)
        after_one_step = plain.w.detach().clone(), torch.rand(1)
    torch.testing.assert_close(after_capture, after_one_step, rtol=0, atol=0)


def draws(x, out):
    """A captured function of random ops, in place and not: noise (randn_like), coins (rand), indices (randint)."""
    out.uniform_()
    return x + torch.randn_like(x), torch.rand(3) < 0.5, torch.randint(2**62, (4,)) % 7, out.clone()


@pytest.mark.parametrize("freeze", [False, True], ids=["fresh", "frozen"])
def test_replays_draw_anew_as_cuda_graphs_do_and_frozen_repeat_the_capture(freeze):
    """Each replay draws new numbers from the generator (a CUDA graph moves its philox offset on at each replay); with
    freeze_draws, the planted fault of benchmarks/gpu_check.py's test, every replay gives the capture's draws."""
    with cuda_graphs_on_cpu(freeze_draws=freeze):
        torch.manual_seed(0)
        fn, x, out = CudaGraphModule(draws, warmup=1), torch.zeros(5), torch.zeros(6)
        calls = [fn(x, out) for _ in range(7)]  # a warm-up call, the capture, then replays
    replays = calls[2:]
    for a, b in zip(replays, replays[1:]):
        same = [torch.equal(u, v) for u, v in zip(a, b, strict=True)]
        assert same == ([True] * 4 if freeze else [False, same[1], same[2], False]), same
    if not freeze:  # coins and indices may repeat by chance between two replays, never over all five
        assert len({tuple(c[1].tolist()) + tuple(c[2].tolist()) for c in replays}) > 1
    with cuda_graphs_on_cpu():  # the fault ends with its context
        fn = CudaGraphModule(draws, warmup=1)
        *_, second, third = (fn(x, out)[0] for _ in range(4))
    assert not torch.equal(second, third)


def test_compiled_through_the_dispatcher_the_tape_sees_the_ops():
    with compile_through_dispatcher(), cuda_graphs_on_cpu() as contracts:
        torch._dynamo.reset()
        want = train(compile=True)
        torch._dynamo.reset()
        got = train(graphs=True, compile=True, warmup=3)
        torch._dynamo.reset()
        train(graphs=True, compile=True, warmup=2)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # Adam makes its state at the first step, so the second call recompiles: capture at call 3, not 2
    assert [c.compiled_at_or_after_capture for c in contracts] == [0, 1]


@torch.compiler.nested_compile_region
def tanh_cell(w, h, x):
    return torch.tanh(h @ w + x)


def unroll_and_learn(w, optimizer, xs):
    """Five steps of a nested compile region, a loss on every step's output, one Adam step: the R2D2 twin's shape."""
    h, outputs = torch.zeros(xs.shape[1], 3), []
    for x in xs:
        h = tanh_cell(w, h, x)
        outputs.append(h)
    loss = (torch.stack(outputs) - 0.3).square().mean()
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()
    return loss.detach()


def learn_a_recurrence(graphs):
    torch._dynamo.reset()
    w = torch.nn.Parameter(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)) * 0.5)
    optimizer = torch.optim.Adam([w], lr=torch.tensor(0.05), capturable=True, foreach=True)
    fn = torch.compile(partial(unroll_and_learn, w, optimizer))
    fn = CudaGraphModule(fn, warmup=2) if graphs else fn
    xs = torch.randn(5, 4, 3, generator=torch.Generator().manual_seed(2))
    losses = [fn(xs.clone()).clone() for _ in range(6)]
    return torch.stack(losses), w.detach().clone()


def test_a_nested_compile_region_is_taped_and_replayed():
    """Under aot_eager a nested compile region runs as one higher-order op (invoke_subgraph): the tape records the ops
    of its graph, forward and backward, so the replays after the capture keep learning as the run without graphs."""
    with compile_through_dispatcher(), cuda_graphs_on_cpu():
        want = learn_a_recurrence(graphs=False)
        got = learn_a_recurrence(graphs=True)
    torch.testing.assert_close(got, want)
    assert want[0][-1] < want[0][2]  # the replays (calls 3 to 6) went on learning


def test_contract_violations_are_reported():
    def fn(x, scale):
        return x * scale

    with cuda_graphs_on_cpu() as contracts:
        module = CudaGraphModule(fn, warmup=2)
        module(torch.ones(3), 2.0)  # a Python number: frozen by the graph
        module(torch.ones(3, requires_grad=False), 2.0)
        module(torch.ones(3), 2.0)
        other = CudaGraphModule(torch.compile(lambda x: x + 1, backend="eager"), warmup=1)
        other(torch.ones(1000))  # compiled at the capture call, and 4000 bytes in
    first, second = contracts
    assert any("non-tensor inputs" in v for v in first.violations(max_bytes_in=10**6))
    found = second.violations(max_bytes_in=100)
    assert any("4000 bytes" in v for v in found) and any("compiled at or after" in v for v in found)


def test_contract_sees_changing_shapes_and_inputs_that_require_grad():
    with cuda_graphs_on_cpu() as contracts:
        module = CudaGraphModule(lambda x: x * 2, warmup=3)
        module(torch.ones(3))
        module(torch.ones(4))
        with pytest.raises(RuntimeError):
            module(torch.ones(3, requires_grad=True))
    found = contracts[0].violations(max_bytes_in=10**6)
    assert any("shapes or dtypes change" in v for v in found) and any("require grad" in v for v in found)


def test_host_reads_are_counted_by_line():
    x = torch.arange(6.0)
    with host_reads(root=HERE) as counts:
        for _ in range(3):
            x.sum().item()
        float(x[0])
        x[x > 2].sum()  # boolean-mask indexing: a read of the mask's count
        x.tolist()
        x.nonzero()
    assert counts["item at test_gpu_standin.py: x.sum().item()"] == 3
    assert counts["__float__ at test_gpu_standin.py: float(x[0])"] == 1
    assert counts["tolist at test_gpu_standin.py: x.tolist()"] == 1
    assert counts["nonzero at test_gpu_standin.py: x.nonzero()"] == 1
    assert any("x[x > 2].sum()" in key for key in counts), counts
    assert sum(counts.values()) == 7, counts


def test_uploads_are_counted_by_line_with_the_line_that_made_their_source():
    """Host data made into tensors (numpy arrays, lists; not 0-dim ones) and non_blocking copies, by line, the copy_
    with the line that allocated its source; a CUDA graph's input copies (tensordict's) and a compiled graph's ops are
    not the script's."""
    import numpy as np

    rows, device_rows, device_frames = np.ones((2, 3), np.float32), torch.zeros(2, 3), torch.zeros(100, 1000)
    with cuda_graphs_on_cpu(), compile_through_dispatcher(), uploads(root=HERE) as counts:
        staging = torch.zeros(2, 3, pin_memory=False)
        for _ in range(3):
            device_rows.copy_(staging, non_blocking=True)
        torch.as_tensor(rows).to("cpu")
        freed = torch.zeros(100, 1000, pin_memory=False)
        del freed  # a tensor made later where it was (the allocator often hands a large block out again) is not it
        later = device_frames + 1.0
        device_frames.copy_(later, non_blocking=True)
        torch.tensor([1.0, 2.0]), torch.tensor(3.0)  # a 0-dim tensor: not counted
        device_rows.to(torch.float64, non_blocking=True)
        graph = CudaGraphModule(lambda x: x * 2, warmup=1)
        for _ in range(3):
            graph(device_rows)  # copies its input in: tensordict's copy, not this file's
        torch.compile(lambda x: x.to(torch.float64, non_blocking=True) + torch.tensor([1.0]))(device_rows)
    made_at = "test_gpu_standin.py: staging = torch.zeros(2, 3, pin_memory=False)"
    assert dict(counts) == {
        "non_blocking copy_ at test_gpu_standin.py: device_rows.copy_(staging, non_blocking=True) from the buffer "
        f"made at {made_at}": 3,
        'from host data at test_gpu_standin.py: torch.as_tensor(rows).to("cpu")': 1,
        "non_blocking copy_ at test_gpu_standin.py: device_frames.copy_(later, non_blocking=True) from the buffer "
        "made at no script line": 1,
        "from host data at test_gpu_standin.py: torch.tensor([1.0, 2.0]), torch.tensor(3.0)  # a 0-dim tensor: not "
        "counted": 1,
        "non_blocking to at test_gpu_standin.py: device_rows.to(torch.float64, non_blocking=True)": 1,
    }
