"""A training state is data, not code (issue 52): `--resume` and `--eval-checkpoint` load only tensors, numbers,
strings and containers of them. A state or checkpoint whose part carries a pickle that calls a function (the envs'
part, the networks, the optimizer, the replay memory, the RNGs; the envs as pickled bytes, as states held them
before) is refused with one line and exit 2, and the function never runs; the project's code loads files through no
other door (an AST check of leanrl/, benchmarks/ and plots/); the envs' state restored from data steps a MuJoCo env
with contacts exactly as the env never saved."""

import ast
import io
import pickle

import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_script

from leanrl import bookkeeping as bk

SHORT = ["--learning-starts", "100", "--total-timesteps", "300", "--train-frequency", "5", "--seed", "3"]
SHORT += ["--batch-size", "32", "--save-model"]


class Payload:
    """Pickled, a call of open(marker, "w"): a load that runs the file's code creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def pickled_bytes(obj):
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A DQN CartPole run's folder with its last training state and its checkpoint (--save-model)."""
    folder = tmp_path_factory.mktemp("run")
    proc, [line] = run_script("dqn", *SHORT, tmp_path=folder)
    assert proc.returncode == 0 and line["status"] == "ok", proc.stderr[-2000:]
    run_dir = folder / line["run_name"]  # the run folder sits beside the results file
    assert (run_dir / bk.STATE_FILE).is_file() and (run_dir / "dqn.pt").is_file()
    return run_dir


# each crafted state: what it puts where, and what the one line says
CRAFTED = {
    "the envs' part": (lambda blob, p: blob["state"].update(envs=(p, blob["state"]["envs"][1])), "more than data"),
    "the envs as pickled bytes": (
        lambda blob, p: blob["state"].update(envs=({"pickled_envs": pickled_bytes(p)}, blob["state"]["envs"][1])),
        "its envs does not fit this run's",
    ),
    "an older state (its envs pickled)": (
        lambda blob, p: blob.update(
            format=bk.OLD_STATE_FORMAT,
            state=dict(blob["state"], envs=({"pickled_envs": pickled_bytes(p)}, blob["state"]["envs"][1])),
        ),
        "written by an older leanrl",
    ),
    "the network": (lambda blob, p: blob["state"]["q_network"].update({"network.0.weight": p}), "more than data"),
    "the optimizer": (lambda blob, p: blob["state"]["optimizer"]["state"].update({0: p}), "more than data"),
    "the replay memory": (
        lambda blob, p: blob["state"].update(replay=(p, blob["state"]["replay"][1])),
        "more than data",
    ),
    "the RNGs": (lambda blob, p: blob["rng"].update(python=p), "more than data"),
    "a saved object named after a function": (
        lambda blob, p: blob["state"]["envs"][0]["env_data"].update(object="posix.system"),
        "its envs does not fit this run's",
    ),
}


def assert_refused(proc, lines, flag, message, marker):
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(err) == 1 and err[0].startswith(f"dqn.py: error: {flag} ") and message in err[0], err
    assert not marker.exists(), "the file's code ran"
    assert lines == [], "a refused run writes no results line"


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_state_is_refused_with_one_line_and_its_code_never_runs(case, finished, tmp_path):
    """Each crafted state.pt, resumed the way a user does (`python leanrl/dqn.py --resume FOLDER`): exit 2, one line
    naming --resume, no results line, and the marker its pickle would create is absent (the run is given 100 more
    steps, so that it restores its parts)."""
    craft, message = CRAFTED[case]
    marker, folder = tmp_path / "marker", tmp_path / "crafted"
    folder.mkdir()
    blob = torch.load(finished / bk.STATE_FILE, weights_only=True)
    craft(blob, Payload(marker))
    torch.save(blob, folder / bk.STATE_FILE)
    proc, lines = run_script("dqn", "--resume", str(folder), "--total-timesteps", "400", tmp_path=tmp_path)
    assert_refused(proc, lines, "--resume", message, marker)


def test_the_payload_runs_when_loaded_as_a_pickle(tmp_path):
    """What the tests above would catch: the crafted part loaded by pickle (as the envs' bytes were) or by torch.load
    without weights_only creates the marker."""
    for i, load in enumerate([pickle.loads, lambda data: torch.load(io.BytesIO(data), weights_only=False)]):
        marker = tmp_path / f"marker{i}"
        if i == 0:
            data = pickle.dumps(Payload(marker))
        else:
            torch.save({"q_network": Payload(marker)}, buffer := io.BytesIO())
            data = buffer.getvalue()
        load(data)
        assert marker.exists()


def test_a_crafted_checkpoint_is_refused_with_one_line_and_its_code_never_runs(finished, tmp_path):
    """--eval-checkpoint of a checkpoint whose network carries the pickled call: exit 2, one line, no marker."""
    marker = tmp_path / "marker"
    checkpoint = torch.load(finished / "dqn.pt", weights_only=True)
    checkpoint["q_network"]["network.0.weight"] = Payload(marker)
    torch.save(checkpoint, tmp_path / "crafted.pt")
    proc, lines = run_script("dqn", "--eval-checkpoint", str(tmp_path / "crafted.pt"), tmp_path=tmp_path)
    assert_refused(proc, lines, "--eval-checkpoint", "more than data", marker)


def test_the_envs_state_is_data_a_weights_only_load_takes(finished):
    """The saved envs' part is tagged data (tensors, numbers, strings): the CartPole sub-env's physics and its RNG are
    there as values, and nothing in the file is a pickle of its own (a uint8 tensor that unpickles)."""
    blob = torch.load(finished / bk.STATE_FILE, weights_only=True)
    assert blob["format"] == bk.STATE_FORMAT
    [sub_env] = blob["state"]["envs"][0]["env_data"]["vars"]["envs"]["list"]
    while sub_env["vars"].get("env"):
        sub_env = sub_env["vars"]["env"]
    assert sub_env["object"].endswith("CartPoleEnv") and sub_env["vars"]["state"]["ndarray"].dtype == torch.float64
    assert sub_env["vars"]["_np_random"]["generator"]["dict"]["bit_generator"] == "PCG64"

    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value
        for part in value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ():
            yield from tensors(part)

    for tensor in tensors(blob):
        if tensor.dtype == torch.uint8 and tensor.numel() > 2:
            with pytest.raises(Exception):  # noqa: B017 (any error: not a pickle)
                pickle.loads(tensor.numpy().tobytes())


def test_a_mujoco_env_restored_from_data_steps_as_the_env_never_saved():
    """Ant-v4 (contacts; its step reads the torso's position before it integrates), two sub-envs in PPO continuous's
    wrapper stack (normalisation statistics, episode counters): stepped 40 steps, saved as data, restored into envs
    made anew and stepped otherwise; then both take the same 300 random actions: the same obs, rewards, ends and
    action-space draws, bit for bit. A restore of positions and velocities alone fails it (tried: the body positions
    read before the first step are the new env's)."""
    ppo = load_script("ppo_continuous_action")
    rng = np.random.default_rng(0)
    envs = ppo.make_envs("Ant-v4", 0.99, 2)
    envs.reset(seed=1)
    for _ in range(40):
        envs.step(rng.uniform(-1, 1, envs.action_space.shape))
    buffer = io.BytesIO()
    torch.save({"envs": bk.pack(envs)}, buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)["envs"]
    again = ppo.make_envs("Ant-v4", 0.99, 2)
    again.reset(seed=7)
    again.step(rng.uniform(-1, 1, again.action_space.shape))
    assert bk.unpack(again, saved) is again
    for step in range(300):
        actions = rng.uniform(-1, 1, envs.action_space.shape)
        for a, b in zip(envs.step(actions)[:4], again.step(actions)[:4]):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
        if step % 50 == 0:
            np.testing.assert_array_equal(envs.action_space.sample(), again.action_space.sample())


# what loads a file and may run what is in it; torch.load only inside bookkeeping.load_data, with weights_only=True
UNSAFE = {"pickle.load", "pickle.loads", "pickle.Unpickler", "marshal.load", "marshal.loads", "shelve.open"}
UNSAFE |= {"cloudpickle.load", "cloudpickle.loads", "yaml.load", "yaml.unsafe_load", "torch.jit.load", "eval", "exec"}
UNSAFE |= {"torch.serialization.add_safe_globals", "torch.serialization.safe_globals"}


def dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def calls(tree, function=""):
    """(call node, the name of the innermost function it is in) for every call in the tree."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Call):
            yield node, function
        yield from calls(node, node.name if isinstance(node, ast.FunctionDef) else function)


def test_the_project_loads_files_through_no_door_that_runs_their_code():
    """Every call in leanrl/, benchmarks/ and plots/: no unpickling, eval or exec; torch.load only in bookkeeping's
    load_data and with weights_only=True; np.load never with allow_pickle=True. (A torch.load(path) added to a script
    fails it, naming the line.)"""
    found, loads = [], []
    for folder in ("leanrl", "benchmarks", "plots"):
        for path in sorted((ROOT / folder).glob("*.py")):
            for node, function in calls(ast.parse(path.read_text())):
                name, where = dotted(node.func), f"{path.relative_to(ROOT)}:{node.lineno}"
                keywords = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
                if name in UNSAFE or name in ("np.load", "numpy.load") and keywords.get("allow_pickle") is True:
                    found.append(f"{where} {name}")
                if name == "torch.load":
                    loads.append((where, function, keywords.get("weights_only")))
    assert found == [], found
    assert [(function, weights_only) for _, function, weights_only in loads] == [("load_data", True)], loads
