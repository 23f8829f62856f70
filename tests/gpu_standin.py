"""The GPU path, checked on a CPU: a stand-in for CUDA-graph capture, the capture contract and a host-read counter.

No GPU exists on this project's machines, so `--cudagraphs` is tested here:

- `cuda_graphs_on_cpu()` makes tensordict's CudaGraphModule capture and replay on the CPU. At the capture call it runs
  the function once while recording its aten ops (a TorchDispatchMode), then undoes what a real capture would not
  have done (a CUDA capture records kernels without running them): every tensor that existed before the capture and
  was written during it gets its old bytes back, and so does the RNG. A host read during the capture (`.item()`,
  `nonzero`, ...) raises, as it does on CUDA. Later calls copy the inputs into the static buffers, replay the tape on
  the same tensors (outputs written into the captured ones) and clone the outputs: Python does not run again, exactly
  as a CUDA graph freezes it. A random op on the tape draws again at every replay, as CUDA's generator does in a
  captured graph (its philox offset moves on at each replay); `cuda_graphs_on_cpu(freeze_draws=True)` instead
  replays the values it drew at the capture: the fault a graph with a frozen seed would have, which
  benchmarks/gpu_check.py must catch. With `--compile`, use the `aot_eager` backend (`compile_through_dispatcher()`):
  inductor's CPU kernels bypass the dispatcher, so the tape would see nothing.
- The same context records the capture contract of every CudaGraphModule call (`CONTRACTS`): tensor inputs only,
  none requiring grad, the same shapes and dtypes each call, bytes copied in per call, and whether anything was
  compiled at or after the capture call.
- `host_reads()` counts every read of a tensor to the host by the script line that made it, and `uploads()` every
  copy of host data to the device.
"""

import contextlib
import importlib
import linecache
import sys
import traceback
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import tensordict.nn.cudagraphs as tensordict_cudagraphs
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

LEANRL = Path(__file__).resolve().parents[1] / "leanrl"

# aten ops that read a tensor to the host (what a CUDA capture refuses, and what stalls a GPU's stream)
HOST_SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.is_nonzero.default,
}


class HostReadDuringCapture(RuntimeError):
    """What a real CUDA capture raises when the captured code reads a tensor to the host."""


# ---------------------------------------------------------------- capture and replay


def _storage_key(t):
    return t.untyped_storage().data_ptr()


def _whole_storage(t):
    """The tensor's entire storage as a flat uint8 tensor (views included)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class _Tape(TorchDispatchMode):
    """Records the aten ops of a capture; saves the bytes of every older tensor it writes, to undo the writes."""

    @classmethod
    def ignore_compile_internals(cls):
        return True  # let a compiled function run compiled (aot_eager: its aten ops still come through here)

    # a higher-order op (the invoke_subgraph of a nested compile region under aot_eager) comes here whole
    supports_higher_order_operators = True

    def __init__(self, freeze_draws=False):
        super().__init__()
        self.ops, self.saved, self.new, self.freeze_draws = [], {}, set(), freeze_draws

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.higher_order.invoke_subgraph:  # run the region's graph here, so its aten ops are taped
            subgraph, _identifier, *operands = args
            with self:
                return subgraph(*operands)
        if isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        if func in HOST_SYNC_OPS:
            raise HostReadDuringCapture(f"{func} reads a tensor to the host inside a CUDA-graph capture")
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = kwargs.get(argument.name) if argument.kwarg_only or index >= len(args) else args[index]
            for t in value if isinstance(value, list | tuple) else [value]:
                if (
                    isinstance(t, torch.Tensor)
                    and _storage_key(t) not in self.new
                    and _storage_key(t) not in self.saved
                ):
                    storage = _whole_storage(t)
                    self.saved[_storage_key(t)] = (storage, storage.clone())
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _storage_key(t) not in inputs:
                self.new.add(_storage_key(t))
        drawn = None  # a random op's values at the capture, replayed as they are where draws are frozen
        if self.freeze_draws and torch.Tag.nondeterministic_seeded in func.tags:
            drawn = [t.clone() if isinstance(t, torch.Tensor) else t for t in tree_flatten(out)[0]]
        self.ops.append((func, args, kwargs, out, drawn))
        return out

    def replay(self):
        with torch.no_grad():
            for func, args, kwargs, out, drawn in self.ops:
                again = drawn if drawn is not None else tree_flatten(func(*args, **kwargs))[0]
                for old, new in zip(tree_flatten(out)[0], again, strict=True):
                    if isinstance(old, torch.Tensor) and new is not old:
                        old.copy_(new)


class _Graph:
    """torch.cuda.CUDAGraph on a CPU: a tape of aten ops."""

    def __init__(self):
        self.tape = None

    def replay(self):
        self.tape.replay()


_FREEZE_DRAWS = [False]  # cuda_graphs_on_cpu(freeze_draws=...) while it is open


@contextlib.contextmanager
def _capture(graph, stream=None, **_):
    rng = torch.random.get_rng_state()
    tape = _Tape(_FREEZE_DRAWS[0])
    try:
        with tape:
            yield
    finally:
        for storage, old in tape.saved.values():  # a real capture runs nothing: undo what ran
            storage.copy_(old)
        torch.random.set_rng_state(rng)
    graph.tape = tape


class _Stream:
    def __init__(self, *_, **__):
        pass

    def wait_stream(self, _):
        pass


class _FakeCuda:
    """What CudaGraphModule uses of torch.cuda."""

    Stream = _Stream
    CUDAGraph = _Graph
    graph = staticmethod(_capture)

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def stream(_):
        return contextlib.nullcontext()

    @staticmethod
    def current_stream(device=None):
        return _Stream()

    @staticmethod
    def synchronize(device=None):
        pass


class _TorchWithFakeCuda:
    cuda = _FakeCuda

    def __getattr__(self, name):
        return getattr(torch, name)


# ---------------------------------------------------------------- the capture contract


@dataclass
class Contract:
    """What one CudaGraphModule saw over its calls."""

    name: str
    warmup: int
    calls: int = 0
    captured_at: int | None = None
    specs: list = field(default_factory=list)  # per call: ((shape, dtype), ...) of the tensor inputs
    bytes_in: list = field(default_factory=list)  # per call: bytes of the tensor inputs (copied in at a replay)
    non_tensor: list = field(default_factory=list)  # repr of non-tensor inputs, per call
    requires_grad: int = 0
    compiled_at_or_after_capture: int = 0

    def violations(self, max_bytes_in):
        found = []
        if self.non_tensor and any(self.non_tensor):
            found.append(f"{self.name}: non-tensor inputs {sorted(set(map(str, self.non_tensor)))[:3]}")
        if self.requires_grad:
            found.append(f"{self.name}: {self.requires_grad} inputs require grad")
        if len(set(self.specs)) > 1:
            found.append(f"{self.name}: input shapes or dtypes change between calls: {sorted(set(self.specs))[:2]}")
        if self.bytes_in and max(self.bytes_in) > max_bytes_in:
            found.append(f"{self.name}: {max(self.bytes_in)} bytes copied in per call, budget {max_bytes_in}")
        if self.compiled_at_or_after_capture:
            found.append(f"{self.name}: {self.compiled_at_or_after_capture} graphs compiled at or after the capture")
        return found


CONTRACTS = []


def _frames_compiled():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _watched_call(original):
    def call(self, *args, **kwargs):
        contract = self.__dict__.get("_contract")
        if contract is None:
            fn = getattr(self.module, "func", self.module)  # a functools.partial's function
            name = getattr(fn, "__name__", type(fn).__name__)
            contract = self._contract = Contract(name, self._warmup)
            CONTRACTS.append(contract)
        leaves = tree_flatten((args, kwargs))[0]
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        contract.calls += 1
        contract.specs.append(tuple((tuple(t.shape), t.dtype) for t in tensors))
        contract.bytes_in.append(sum(t.numel() * t.element_size() for t in tensors))
        contract.non_tensor.append(tuple(repr(x) for x in leaves if not isinstance(x, torch.Tensor)))
        contract.requires_grad += sum(t.requires_grad for t in tensors)
        capturing = contract.calls == self._warmup
        before = _frames_compiled()
        out = original(self, *args, **kwargs)
        if capturing:
            contract.captured_at = contract.calls
        if contract.captured_at is not None:
            contract.compiled_at_or_after_capture += _frames_compiled() - before
        return out

    return call


def _accept_cpu(cls, x):
    """CudaGraphModule's input check without its 'must be on CUDA' (the grad check stays)."""
    if isinstance(x, torch.Tensor) or hasattr(x, "apply"):
        if x.requires_grad:
            raise RuntimeError(cls._REQUIRES_GRAD_ERROR)
        return x.clone()
    return x


@contextlib.contextmanager
def cuda_graphs_on_cpu(freeze_draws=False):
    """CudaGraphModule captures and replays on the CPU, and records its contract (CONTRACTS) while this is open.

    Also lets optimizers take `capturable=True` on the CPU, as they do on CUDA. freeze_draws: a planted fault, every
    replay gives a random op the values it drew at the capture (a graph whose seed and offset were frozen)."""
    CONTRACTS.clear()
    module = tensordict_cudagraphs.CudaGraphModule
    supported = importlib.import_module("torch.optim.optimizer")._get_capturable_supported_devices
    with contextlib.ExitStack() as stack:
        _FREEZE_DRAWS[0] = freeze_draws
        stack.callback(_FREEZE_DRAWS.__setitem__, 0, False)
        stack.enter_context(mock.patch.object(tensordict_cudagraphs, "torch", _TorchWithFakeCuda()))
        stack.enter_context(mock.patch.object(module, "_check_device_and_clone", classmethod(_accept_cpu)))
        stack.enter_context(mock.patch.object(module, "_check_device_and_grad", classmethod(_accept_cpu)))
        stack.enter_context(mock.patch.object(module, "__call__", _watched_call(module.__call__)))
        for name in ("optimizer", "adam", "adamw", "radam"):
            optimizer_module = importlib.import_module(f"torch.optim.{name}")
            if hasattr(optimizer_module, "_get_capturable_supported_devices"):
                stack.enter_context(
                    mock.patch.object(
                        optimizer_module,
                        "_get_capturable_supported_devices",
                        lambda supports_xla=True: [*supported(supports_xla), "cpu"],
                    )
                )
        yield CONTRACTS


@contextlib.contextmanager
def compile_through_dispatcher():
    """torch.compile with the aot_eager backend (its aten ops pass the dispatcher, so a tape sees them)."""
    original = torch.compile

    def compile_aot_eager(fn=None, *, mode=None, options=None, backend=None, **kwargs):
        if fn is None:
            return lambda f: original(f, backend="aot_eager", **kwargs)
        return original(fn, backend="aot_eager", **kwargs)

    with mock.patch.object(torch, "compile", compile_aot_eager):
        yield


# ---------------------------------------------------------------- host reads


def _calling_line(root):
    """'file.py: source line' of the innermost frame in folder `root` (the scripts, with their bookkeeping)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.parent == root and frame.filename != __file__:
            return f"{path.name}: {linecache.getline(frame.filename, frame.lineno).strip()}"
    return None


READ_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


class _ScriptOps(TorchDispatchMode):
    """A dispatch mode that sees the aten ops a script runs, outside the compiler's own: `op` gets each."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    # a nested compile region's invoke_subgraph comes here whole (aot_eager), as on the tape: its graph runs here
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.higher_order.invoke_subgraph:
            subgraph, _identifier, *operands = args
            with self:
                return subgraph(*operands)
        if isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        return self.op(func, args, kwargs or {})


class _ReadsAtDispatch(_ScriptOps):
    """Counts the host-sync ops that no counted Tensor method made (nonzero, boolean-mask indexing, ...)."""

    def __init__(self, counts, depth, root):
        super().__init__()
        self.counts, self.depth, self.root = counts, depth, root

    def op(self, func, args, kwargs):
        reads = self.depth[0] == 0 and (func in HOST_SYNC_OPS or _masks(func, args))
        if reads and (where := _calling_line(self.root)):
            self.counts[f"{func.__name__.split('.')[0]} at {where}"] += 1
        return func(*args, **kwargs)


def _masks(func, args):
    """Indexing with a boolean mask: its shape depends on the mask's count, read to the host."""
    if func not in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if i is not None)


@contextlib.contextmanager
def host_reads(root=LEANRL):
    """Counter of host reads ('method at file.py: source line') made from code in `root` while this is open.

    A Tensor method that reads to the host (.item(), .tolist(), .cpu(), .numpy(), bool(), float(), int()) is counted
    once where it is called; nonzero, masked_select (boolean-mask indexing) and the like are counted at dispatch."""
    counts, depth = Counter(), [0]

    def wrap(name):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            if depth[0] == 0 and (where := _calling_line(root)):
                counts[f"{name} at {where}"] += 1
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        return method

    with contextlib.ExitStack() as stack:
        for name in READ_METHODS:
            stack.enter_context(mock.patch.object(torch.Tensor, name, wrap(name)))
        stack.enter_context(_ReadsAtDispatch(counts, depth, root))
        yield counts


# ---------------------------------------------------------------- uploads

TORCH = Path(torch.__file__).parent


def _script_line(root):
    """'file.py: source line' where the innermost frame outside torch and this file (the code that asked torch for
    the op: a script's line, or tensordict's, a compiled graph's) is a script's in `root`; else None."""
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path != Path(__file__) and TORCH not in path.parents:
            if path.parent != root:
                return None
            return f"{path.name}: {linecache.getline(str(path), frame.f_lineno).strip()}"
        frame = frame.f_back
    return None


class _Uploads(_ScriptOps):
    """Counts the script's copies of host data to the device (see uploads())."""

    def __init__(self, counts, root):
        super().__init__()
        self.counts, self.root, self.made_at = counts, root, {}

    def op(self, func, args, kwargs):
        out, aten = func(*args, **kwargs), torch.ops.aten
        if func is aten.lift_fresh.default:  # a tensor of numpy data or Python numbers
            kind = "from host data" if out.dim() else None  # a 0-dim one: CUDA kernels take it as an argument
        elif func is aten.copy_.default and (args[2:] or [kwargs.get("non_blocking")])[0]:
            kind = "non_blocking copy_"
        elif func is aten._to_copy.default:
            kind = "non_blocking to" if kwargs.get("non_blocking") else None
        else:  # a factory (it takes pin_memory): the line that made a buffer names it
            kind = "made" if "pin_memory" in kwargs and isinstance(out, torch.Tensor) else None
        if kind and (where := _script_line(self.root)):
            if kind == "made":
                # forgotten when the storage is freed: a later tensor at its address is not that buffer
                key = _storage_key(out)
                self.made_at[key] = where
                weakref.finalize(out.untyped_storage(), self.made_at.pop, key, None)
            elif kind == "non_blocking copy_":
                made_at = self.made_at.get(_storage_key(args[1]), "no script line")
                self.counts[f"{kind} at {where} from the buffer made at {made_at}"] += 1
            else:
                self.counts[f"{kind} at {where}"] += 1
        return out


@contextlib.contextmanager
def uploads(root=LEANRL):
    """Counter of a script's copies of host data to the device, by the line that asked for them. On a GPU each is a
    host-to-device copy; on this CPU they are found by what makes them:

    - 'from host data at LINE': a tensor made of numpy data or Python numbers (torch.as_tensor, torch.from_numpy,
      torch.tensor): pageable host memory, copied to the device (a copy the host waits for) where it is asked for
      there or sent there. A 0-dim one is left out (t[i] = 3 makes one): a CUDA kernel takes it as an argument;
    - 'non_blocking copy_ at LINE from the buffer made at LINE': an asynchronous copy_, with the line that allocated
      its source (its pin_memory=...: a copy from pageable memory is not asynchronous on CUDA); 'non_blocking to at
      LINE' likewise for .to(..., non_blocking=True).

    Copies made by tensordict (a CUDA graph's inputs) or inside a compiled graph are not the script's: not counted."""
    counts = Counter()
    with _Uploads(counts, root):
        yield counts


# ---------------------------------------------------------------- a script's main() in this process


def run_main(module, flags, tmp_path, cudagraphs=False, force_capturable=True, read=None):
    """module.main() with these command-line flags on the CPU, in this process, its optimizers capturable as on CUDA
    (force_capturable=False: as the script makes them); with `cudagraphs`, --cudagraphs under the stand-in, and with
    cudagraphs="uncaptured" the same code path (a twin may take its CUDA path with --cudagraphs), every
    CudaGraphModule calling its function directly. Returns (results line, [(step, return)] of returns.csv), or what
    read(tmp_path) returns where given (a resumed run: two results lines)."""
    from conftest import main_args, run_in

    args = main_args(module, flags, tmp_path)
    with as_on_cuda(module, args, cudagraphs, force_capturable):
        module.main(args)
    return (read or run_in)(tmp_path)


@contextlib.contextmanager
def as_on_cuda(module, args, cudagraphs=True, force_capturable=True, freeze_draws=False):
    """What run_main runs module.main(args) in (args: the script's parsed Args, on the CPU): the stand-in open,
    optimizers capturable, --compile through the dispatcher; open also after main returns, for a captured function
    to be called again (benchmarks/gpu_check.py's draws). freeze_draws: see cuda_graphs_on_cpu."""
    from leanrl import bookkeeping as bk

    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        if cudagraphs:
            args.cudagraphs = True
            check_flags = bk.check_flags

            def check_flags_as_on_cuda(script, args, *rest, **kwargs):
                args.cudagraphs = False  # the one check that needs a real GPU
                try:
                    return check_flags(script, args, *rest, **kwargs)
                finally:
                    args.cudagraphs = True

            stack.enter_context(mock.patch.object(bk, "check_flags", check_flags_as_on_cuda))
        stack.enter_context(cuda_graphs_on_cpu(freeze_draws))  # also lets capturable optimizers run on the CPU
        if cudagraphs == "uncaptured":
            stack.enter_context(mock.patch.object(module, "CudaGraphModule", lambda fn, **_: fn))
        if force_capturable:
            stack.enter_context(mock.patch.object(torch.optim, "Adam", _capturable(torch.optim.Adam)))
            stack.enter_context(mock.patch.object(torch.optim, "RAdam", _capturable(torch.optim.RAdam)))
            if hasattr(module, "make_radam"):  # a PQN twin's RAdam state, for torch.optim's functional radam
                stack.enter_context(mock.patch.object(module, "make_radam", _capturable(module.make_radam)))
        if getattr(args, "compile", False):  # eager scripts have no --compile
            stack.enter_context(compile_through_dispatcher())
        yield


def _capturable(adam):
    """torch.optim.Adam as a twin makes it on CUDA: capturable (the step count a device tensor)."""

    def make(*args, **kwargs):
        kwargs["capturable"] = True
        return adam(*args, **kwargs)

    return make
