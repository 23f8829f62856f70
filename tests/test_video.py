"""--capture-video (CleanRL's flag) in the ten gymnasium scripts: what it needs is checked before training (one
line, exit 2), env 0 and only env 0 films its episodes into the run folder's videos/, and the envpool scripts' --help
says why they have no such flag. No test renders a frame: moviepy, pygame and a GL backend are not test
dependencies."""

import importlib.machinery
import inspect
import sys
import types

import gymnasium as gym
import pytest
import torch
import tyro
from conftest import load_script

from leanrl import bookkeeping as bk

# each pair's cheapest env of its family, for make_envs
GYM_SCRIPTS = {
    "ppo": "CartPole-v1",
    "dqn": "CartPole-v1",
    "ppo_continuous_action": "InvertedPendulum-v4",
    "sac_continuous_action": "InvertedPendulum-v4",
    "td3_continuous_action": "InvertedPendulum-v4",
}
SCRIPTS = [name + twin for name in GYM_SCRIPTS for twin in ("", "_torchcompile")]
ENVPOOL_SCRIPTS = [
    name + twin
    for name in ("ppo_atari_envpool", "dqn_atari_envpool", "r2d2_atari_envpool")
    for twin in ("", "_torchcompile")
] + ["ppo_atari_envpool_distributed"]
MODULES = {name: load_script(name) for name in SCRIPTS}
SIGNATURES = {name: inspect.signature(module.make_envs) for name, module in MODULES.items()}


def env_of(name):
    return GYM_SCRIPTS[name.removesuffix("_torchcompile")]


def make_envs(name, num_envs, video_dir=None):
    """The script's own make_envs (PPO continuous's also takes gamma)."""
    extra = (0.99,) if "gamma" in SIGNATURES[name].parameters else ()
    return MODULES[name].make_envs(env_of(name), *extra, num_envs, video_dir)


@pytest.fixture
def moviepy_stub(monkeypatch):
    """An importable, empty moviepy: what RecordVideo imports when it is made (it writes a file only after a reset)."""
    for name in ("moviepy", "moviepy.video", "moviepy.video.io", "moviepy.video.io.ImageSequenceClip"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["moviepy.video.io.ImageSequenceClip"].ImageSequenceClip = None
    monkeypatch.delitem(sys.modules, "gymnasium.utils.save_video", raising=False)  # imported against the stub, then
    yield
    sys.modules.pop("gymnasium.utils.save_video", None)  # forgotten


def absent(monkeypatch, *packages):
    """The packages cannot be imported or found, whether or not this machine has them."""
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)


@pytest.fixture(autouse=True)
def one_torch_thread():
    torch.set_num_threads(1)


# ---------------------------------------------------------------- what filming needs, checked up front


@pytest.mark.parametrize("name", SCRIPTS)
def test_capture_video_without_moviepy_exits_2_naming_it(name, monkeypatch, capsys, tmp_path):
    absent(monkeypatch, "moviepy", "pygame")
    args = MODULES[name].Args(capture_video=True, cuda=False, results_file=str(tmp_path / "results.jsonl"))
    with pytest.raises(SystemExit) as exit_info:
        MODULES[name].main(args)
    # classic control draws with pygame, MuJoCo does not: the line names every missing package, and only those
    wanted = ["moviepy", "pygame"] if env_of(name) == "CartPole-v1" else ["moviepy"]
    err = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2
    assert err == [f"{name}.py: error: --capture-video needs {' and '.join(wanted)}, not installed: pip install "
                   f"{' '.join(wanted)}"]  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # neither a results line nor a run folder


def test_check_video_names_only_the_missing_packages(moviepy_stub, monkeypatch, capsys):
    absent(monkeypatch, "pygame")
    with pytest.raises(SystemExit) as exit_info:
        bk.check_video("dqn.py", "CartPole-v1")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "dqn.py: error: --capture-video needs pygame, not installed: pip install pygame\n"


def test_check_video_renders_a_frame_first(moviepy_stub, monkeypatch, capsys):
    """A MuJoCo env that cannot render (here: an unknown GL backend) fails before training, with the way out."""
    monkeypatch.setenv("MUJOCO_GL", "no-such-backend")
    with pytest.raises(SystemExit) as exit_info:
        bk.check_video("sac.py", "InvertedPendulum-v4")
    err = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("sac.py: error: --capture-video: InvertedPendulum-v4 renders no frame (")
    assert "MUJOCO_GL" in err[0] and err[0].endswith("set MUJOCO_GL=egl (or osmesa)")


@pytest.mark.parametrize("display", [None, ":0"])
def test_without_a_display_pygame_draws_off_screen(display, moviepy_stub, monkeypatch):
    """With no display SDL's dummy driver, so a filming run prints no 'XDG_RUNTIME_DIR is invalid' error; with one,
    SDL is left to choose; a driver the user set is kept."""
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(name, raising=False)
    if display:
        monkeypatch.setenv("DISPLAY", display)
    monkeypatch.setattr(bk.importlib.util, "find_spec", lambda name: object())  # moviepy and pygame are there
    probes = []
    monkeypatch.setattr(bk.subprocess, "run", lambda *a, **k: probes.append(k) or types.SimpleNamespace(returncode=0))
    bk.check_video("dqn.py", "CartPole-v1")
    assert len(probes) == 1 and bk.os.environ.get("SDL_VIDEODRIVER") == (None if display else "dummy")
    monkeypatch.setenv("SDL_VIDEODRIVER", "x11")
    bk.check_video("dqn.py", "CartPole-v1")
    assert bk.os.environ["SDL_VIDEODRIVER"] == "x11"


# ---------------------------------------------------------------- env 0, and only env 0, films


def wrappers_of(env):
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


@pytest.mark.parametrize("name", SCRIPTS)
def test_only_env_0_films_into_video_dir(name, moviepy_stub, tmp_path):
    video_dir = tmp_path / "run" / "videos"
    envs = make_envs(name, 3, video_dir)
    recorders = [[w for w in wrappers_of(env) if isinstance(w, gym.wrappers.RecordVideo)] for env in envs.envs]
    assert [len(r) for r in recorders] == [1, 0, 0]
    assert recorders[0][0].video_folder == str(video_dir) and video_dir.is_dir()
    assert [env.unwrapped.render_mode for env in envs.envs] == ["rgb_array", None, None]
    envs.close()

    envs = make_envs(name, 2)
    assert not any(isinstance(w, gym.wrappers.RecordVideo) for env in envs.envs for w in wrappers_of(env))
    assert [env.unwrapped.render_mode for env in envs.envs] == [None, None]
    envs.close()


def video_dir_given(name, monkeypatch, tmp_path, **fields):
    """Run main() up to its make_envs call and return the video_dir it passes."""
    module, seen = MODULES[name], []
    signature = SIGNATURES[name]  # the real make_envs', also when a spy stands in for it

    def spy(*args, **kwargs):
        seen.append(signature.bind(*args, **kwargs).arguments.get("video_dir"))
        raise KeyboardInterrupt  # the run ends there: status "interrupted", exit 130

    monkeypatch.setattr(module, "make_envs", spy)
    monkeypatch.setattr(bk, "check_video", lambda script, env_id: None)  # filming is not needed to get this far
    args = module.Args(cuda=False, results_file=str(tmp_path / "results.jsonl"), **fields)
    with pytest.raises(SystemExit) as exit_info:
        module.main(args)
    assert exit_info.value.code == 130 and len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_runs_film_into_the_run_folder(name, monkeypatch, tmp_path):
    assert video_dir_given(name, monkeypatch, tmp_path / "off") is None
    video_dir = video_dir_given(name, monkeypatch, tmp_path / "on", capture_video=True)
    (run_dir,) = [path for path in (tmp_path / "on").iterdir() if path.is_dir()]
    assert video_dir == run_dir / "videos" and (run_dir / "returns.csv").is_file()


@pytest.mark.parametrize("name", ["dqn", "dqn_torchcompile"])
def test_an_evaluation_films_beside_its_checkpoint(name, monkeypatch, tmp_path):
    module = MODULES[name]
    checkpoint = tmp_path / "run" / f"{name}.pt"
    checkpoint.parent.mkdir()
    bk.save_checkpoint(checkpoint, module.Args(), q_network=module.QNetwork(4, 2).state_dict())
    video_dir = video_dir_given(name, monkeypatch, tmp_path, eval_checkpoint=str(checkpoint), capture_video=True)
    assert video_dir == checkpoint.parent / "eval_videos"


# ---------------------------------------------------------------- envpool scripts: no flag, and --help says why


@pytest.mark.parametrize("name", ENVPOOL_SCRIPTS + SCRIPTS)
def test_help_shows_capture_video_or_why_not(name, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    module = MODULES.get(name) or load_script(name)
    with pytest.raises(SystemExit):
        tyro.cli(module.Args, args=["--help"])
    text = capsys.readouterr().out
    if name in ENVPOOL_SCRIPTS:
        assert "--capture-video, --no-capture-video" not in text
        (line,) = [line for line in text.splitlines() if "no --capture-video" in line.lower()]
        assert "RecordVideo cannot wrap envpool" in line and "ale-py" in line
    else:
        assert "--capture-video, --no-capture-video" in text and "no --capture-video" not in text.lower()
