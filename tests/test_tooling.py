"""plots/plot.py turns results lines into the right table; .ci/run runs the README's test command; lint; a run forked
from tests/preloaded.py is the run a fresh process makes."""

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import PRELOADED, ROOT, SUMMARY, load_script, run_script, strict_json

plot = load_script("plots/plot.py")

HW = {"device": "cpu", "cpu": "Test CPU", "cpu_count": 2, "torch": "2.13.0", "commit": "abc1234"}


def result(script, sps, seed=1, compile=False, cudagraphs=False, status="ok", **extra):
    return {
        "script": script,
        "env_id": "Breakout-v5",
        "seed": seed,
        "compile": compile,
        "cudagraphs": cudagraphs,
        **HW,
        "steps": 1024,
        "sps": sps,
        "wall_s": 1.0,
        "mean_return": 2.0,
        "episodes": 3,
        "status": status,
        "run_name": f"run{seed}{compile}{sps}",
        **extra,
    }


def write_results(tmp_path, lines, command="./run.sh --quick"):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json (a run killed mid-write)\n")
    (tmp_path / "command.txt").write_text(command + "\n")
    return path


def test_variants_and_pairs_are_named_from_the_results_line():
    assert plot.variant_of(result("ppo_atari_envpool.py", 1)) == "eager"
    assert plot.variant_of(result("ppo_atari_envpool_torchcompile.py", 1)) == "twin"
    line = result("ppo_atari_envpool_torchcompile.py", 1, compile=True, cudagraphs=True)
    assert plot.variant_of(line) == "twin --compile --cudagraphs"
    assert plot.pair_of(line) == "ppo_atari_envpool"
    ranks = result("ppo_atari_envpool_distributed.py", 1, compile=True, world_size=2)
    assert plot.variant_of(ranks) == "twin --compile" and plot.pair_of(ranks) == "ppo_atari_envpool_distributed x2"


def test_table_means_seeds_keeps_latest_rerun_and_computes_speedup(tmp_path):
    lines = [
        result("ppo_atari_envpool.py", 999.0, seed=1),  # replaced by the re-run below
        result("ppo_atari_envpool.py", 100.0, seed=1),
        result("ppo_atari_envpool.py", 300.0, seed=2),
        result("ppo_atari_envpool_torchcompile.py", 500.0, seed=1, compile=True),
        result("ppo_atari_envpool_torchcompile.py", 700.0, seed=2, compile=True),
        result("ppo_atari_envpool_torchcompile.py", 0.0, seed=3, compile=True, status="diverged"),
        result("ppo_atari_envpool.py", 5.0, seed=1, mode="eval"),  # evaluation runs are no speed figures
    ]
    tables = plot.group_runs(plot.read_results(write_results(tmp_path, lines)))
    (hardware,) = tables
    assert "Test CPU (2 cores)" in hardware and "torch 2.13.0" in hardware
    cells = tables[hardware][("ppo_atari_envpool", "Breakout-v5")]
    assert sorted(cells["eager"].sps) == [100.0, 300.0]
    assert sorted(cells["twin --compile"].sps) == [500.0, 700.0]
    ratio, variant = plot.speedup(cells)
    assert ratio == pytest.approx(600.0 / 200.0) and variant == "twin --compile"
    table = plot.speed_markdown(tables, plot.failed_runs(plot.read_results(tmp_path / "results.jsonl")))
    assert "200 ± 141 (n=2)" in table and "3.00x (--compile)" in table
    assert "./run.sh --quick" in table and "diverged" in table


def test_table_names_every_run_sh_command_that_wrote_the_results(tmp_path):
    path = write_results(
        tmp_path, [result("ppo_atari_envpool.py", 90.0)], "./run.sh --quick\n./run.sh --quick --seeds 2\n"
    )
    table = plot.speed_markdown(plot.group_runs(plot.read_results(path)), [])
    assert "by `./run.sh --quick`, then `./run.sh --quick --seeds 2` at commit `abc1234`;" in table


def test_a_table_names_the_commits_of_its_runs_and_one_run_on_uncommitted_changes_is_not_published(tmp_path, capsys):
    eager, twin = result("ppo_atari_envpool.py", 90.0), result("ppo_atari_envpool_torchcompile.py", 95.0, compile=True)
    table = lambda *lines: plot.speed_markdown(plot.group_runs(plot.read_results(write_results(tmp_path, lines))), [])
    assert "by `./run.sh --quick` at commits `abc1234`, `def5678`;" in table(eager, dict(twin, commit="def5678"))
    unnamed = {k: v for k, v in twin.items() if k != "commit"}  # a results line from before the field
    assert "at commit `abc1234`, and runs from before commits were recorded" in table(eager, unnamed)
    readme = tmp_path / "docs.md"
    readme.write_text("x\n<!-- speed-table:start -->\nold\n<!-- speed-table:end -->\n")
    results = write_results(tmp_path, [eager, dict(twin, commit="abc1234 + uncommitted changes")])
    where = ["--results", str(results), "--readme", str(readme), "--plots-dir", str(tmp_path / "plots")]
    with pytest.raises(SystemExit) as exit:
        plot.main([*where, "--publish"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "abc1234 + uncommitted changes" in err and len(err.splitlines()) == 1
    assert "old" in readme.read_text() and not (tmp_path / "plots").exists()


def test_machines_never_share_a_table(tmp_path):
    gpu = dict(result("ppo_atari_envpool.py", 900.0), device="NVIDIA H100 80GB HBM3", cpu_count=16)
    tables = plot.group_runs(plot.read_results(write_results(tmp_path, [result("ppo_atari_envpool.py", 90.0), gpu])))
    assert len(tables) == 2


def test_splice_replaces_only_between_markers():
    text = "head\n<!-- t:start -->\nold\n<!-- t:end -->\ntail\n"
    assert plot.splice(text, "t", "new") == "head\n<!-- t:start -->\nnew\n<!-- t:end -->\ntail\n"
    with pytest.raises(SystemExit):
        plot.splice("no markers", "t", "new")


def test_plot_main_writes_table_charts_and_readme(tmp_path):
    run_dir = tmp_path / "run1False100.0"
    run_dir.mkdir()
    (run_dir / "returns.csv").write_text("step,wall_s,return\n10,0.5,1.0\n20,1.0,3.0\n")
    results = write_results(
        tmp_path,
        [result("ppo_atari_envpool.py", 100.0), result("ppo_atari_envpool_torchcompile.py", 150.0, compile=True)],
    )
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- speed-table:start -->\n<!-- speed-table:end -->\n")
    published = ["--publish", "--plots-dir", str(tmp_path / "published")]  # only --publish splices the README
    plot.main(["--results", str(results), "--out", str(tmp_path / "plots"), "--readme", str(readme), *published])
    assert "1.50x" in readme.read_text()
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == ["returns_cpu-test-cpu-2-cores-torch-2-13-0.png", "speed_cpu-test-cpu-2-cores-torch-2-13-0.png"]


def test_a_steady_table_measured_on_uncommitted_changes_is_not_published(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- steady-table:start -->\nold\n<!-- steady-table:end -->\n")
    steady = tmp_path / "steady.md"
    steady.write_text("Sides: new = 22e55d46985a + uncommitted changes.\n\n| run | side |\n")
    with pytest.raises(SystemExit) as exit:
        plot.main(["--steady", str(steady), "--readme", str(readme)])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.splitlines()) == 1 and "uncommitted changes" in err
    assert "old" in readme.read_text()
    steady.write_text("Sides: new = 22e55d46985a.\n\n| run | side |\n")
    plot.main(["--steady", str(steady), "--readme", str(readme)])
    assert "22e55d46985a." in readme.read_text() and "old" not in readme.read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- test-command:start -->")[1].split("<!-- test-command:end -->")[0]
    command = [line for line in block.strip().splitlines() if not line.startswith("```")]
    install = "python3 -m pip install -e . -r requirements/requirements-dev.txt -c requirements/constraints.txt"
    assert command == [f"{install} && python3 tests/run_all.py"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and 'eval "$test_command"' in ci
    # in a fresh virtual environment, never the machine's python, with torch at the constraints' pin
    assert 'python3 -m venv "$tmp/venv"' in ci and '. "$tmp/venv/bin/activate"' in ci
    assert "python -m pip install -q torch -c requirements/constraints.txt" in ci


def test_run_all_runs_each_file_and_fails_when_one_file_fails(tmp_path, monkeypatch, capsys):
    """The suite's runner (the README's test command): every file in a process of its own, the files that run every
    pair first, then the larger first, each file's output whole, and exit code 1 when any file fails; a file with no
    test selected is no failure."""
    import run_all

    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2\n" + "# padding\n" * 50)
    (tmp_path / "test_none.py").write_text("import pytest\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n")
    monkeypatch.setattr(run_all, "TESTS", tmp_path)
    monkeypatch.setattr(run_all, "EVERY_PAIR", ("test_ok.py",))  # as if it ran every pair's scripts
    assert run_all.main(["--jobs", "1", "-p", "no:cacheprovider", "-m", "not slow"]) == 1
    out = capsys.readouterr().out
    # one at a time, in the order they start: the every-pair file, then the larger file first
    assert out.index("===== test_ok.py") < out.index("===== test_bad.py") < out.index("===== test_none.py")
    assert "assert 1 == 2" in out and "1 passed" in out
    summary = out.split("3 test files, 1 at a time")[1]
    assert re.search(r"FAILED +\d+ s  test_bad.py", summary) and re.search(r"passed +\d+ s  test_ok.py", summary)
    assert re.search(r"passed +\d+ s  test_none.py", summary)
    (tmp_path / "test_bad.py").unlink()
    assert run_all.main(["--jobs", "2", "-p", "no:cacheprovider", "-m", "not slow"]) == 0
    assert "2 test files, 2 at a time" in capsys.readouterr().out


def pins(path):
    """name -> version of each `name==version` line of a requirements or constraints file (names normalised)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.]+)", line)
            assert m, f"{path.name}: {line!r} is no exact pin (name==version)"
            found[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return found


def test_constraints_pin_every_required_package_and_the_readme_installs_with_them():
    """requirements/constraints.txt, the environment CI ran, pins every package that pyproject.toml (extras
    included) and requirements-dev.txt name, inside their ranges; the test tools are pinned exactly and alike in
    both; torch carries no local label (pins() takes no +cpu), so a CUDA build of its version satisfies it too;
    and the README's install commands use the file."""
    import tomllib

    from packaging.requirements import Requirement

    constraints = pins(ROOT / "requirements" / "constraints.txt")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, dynamic = pyproject["project"], pyproject["tool"]["setuptools"]["dynamic"]
    assert project["dynamic"] == ["dependencies"]
    assert dynamic["dependencies"]["file"] == ["requirements/requirements.txt"]
    lines = (ROOT / "requirements" / "requirements.txt").read_text().splitlines()
    dependencies = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    required = [Requirement(r) for r in dependencies]
    required += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    dev = pins(ROOT / "requirements" / "requirements-dev.txt")
    assert {"pytest", "hypothesis", "ruff"} <= set(dev)
    for name, version in dev.items():
        assert constraints.get(name) == version, f"requirements-dev.txt pins {name}=={version}, constraints.txt not"
    for req in required:
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in constraints, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(constraints[name], prereleases=True), (req, constraints[name])
    assert "wandb" in constraints and not any(r.name == "wandb" for r in map(Requirement, dependencies))
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start")[1].split("```bash")[1].split("```")[0]
    assert "python -m pip install -e . -c requirements/constraints.txt" in quick_start
    cpu_torch = f"python -m pip install torch=={constraints['torch']} --index-url https://download.pytorch.org/whl/cpu"
    assert cpu_torch in quick_start, "the README's CPU torch is not the one constraints.txt pins"


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff not installed")
def test_ruff_clean():
    for cmd in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_tricks_section_is_generated_from_the_twins():
    tricks = load_script("plots/tricks.py")
    for twin in (ROOT / "leanrl").glob("*_torchcompile.py"):
        assert tricks.find_tricks(twin), f"{twin.name} has no '# trick:' comment"
    assert tricks.main(["--check"]) == 0, "README catalogue or docs/tricks.md is stale: run python plots/tricks.py"


def test_tricks_check_covers_the_readme_catalogue_and_docs(tmp_path):
    tricks = load_script("plots/tricks.py")
    readme, docs = tmp_path / "README.md", tmp_path / "docs" / "tricks.md"
    readme.write_text("x\n<!-- tricks:start -->\n<!-- tricks:end -->\n")
    paths = ["--readme", str(readme), "--docs", str(docs)]
    assert tricks.main(["--check", *paths]) == 1  # neither is generated yet
    assert tricks.main(paths) == 0
    assert tricks.main(["--check", *paths]) == 0
    for stale, mark in ((readme, "|"), (docs, "](")):
        good = stale.read_text()
        stale.write_text(good.replace(mark, "/", 3))
        assert tricks.main(["--check", *paths]) == 1, stale
        stale.write_text(good)
    table, unused = tricks.catalogue()
    assert not unused, f"catalogue rows that no script's diff uses: {unused}"
    names = [script.name for script, _ in tricks.scripts()]
    assert table.splitlines()[0].count("|") == len(names) + 3  # a column per script
    # docs/tricks.md lists each distinct comment once, however many scripts carry it, in lines one can read
    lines = docs.read_text().splitlines()
    assert max(len(line) for line in lines) < 120
    items = "\n".join(line for line in lines if line.startswith(("- ", "  "))).split("\n- ")
    listed = [" ".join(item.removeprefix("- ").split()).rsplit(" ([", 1)[0] for item in items]
    comments = {" ".join(c.split()) for s, _ in tricks.scripts() for _, c in tricks.find_tricks(s)}
    assert sorted(listed) == sorted(comments)
    carried = sum(len(tricks.find_tricks(ROOT / "leanrl" / name)) for name in names)
    assert docs.read_text().count("](../leanrl/") == carried  # and links every line that carries one


def test_tricks_check_fails_on_a_diff_hunk_that_no_trick_comment_explains(tmp_path, monkeypatch, capsys):
    """The README says each hunk of a pair's diff has a `# trick:` comment: --check holds every twin (and the
    distributed file) to it. A planted hunk fails it, naming its line, until a pointer to a trick explains it."""
    tricks = load_script("plots/tricks.py")
    assert tricks.unexplained_hunks() == [], "hunks without a trick comment: add one, or a `# (trick: ...)` pointer"
    shutil.copytree(ROOT / "leanrl", tmp_path / "leanrl", ignore=shutil.ignore_patterns("__pycache__"))
    twin = tmp_path / "leanrl" / "dqn_torchcompile.py"
    good = twin.read_text()
    assert tricks.unexplained_hunks(tmp_path) == []
    end = '\nif __name__ == "__main__":'
    twin.write_text(good.replace(end, "\nPLANTED = 1" + end))
    (hunk,) = tricks.unexplained_hunks(tmp_path)
    line = twin.read_text().splitlines().index("PLANTED = 1") + 1
    assert hunk == f"dqn_torchcompile.py:{line}: no trick comment explains this hunk: PLANTED = 1"
    monkeypatch.setattr(tricks, "ROOT", tmp_path)  # --check reads the scripts there, the real README and docs
    paths = ["--readme", str(ROOT / "README.md"), "--docs", str(ROOT / "docs" / "tricks.md")]
    assert tricks.main(["--check", *paths]) == 1 and capsys.readouterr().err == hunk + "\n"
    twin.write_text(good.replace(end, "\nPLANTED = 1  # (trick: a pointer)" + end))
    assert tricks.unexplained_hunks(tmp_path) == [] and tricks.main(["--check", *paths]) == 0
    twin.write_text(good.replace("\n        envs.close()\n", "\n"))  # a deletion is a hunk too
    (hunk,) = tricks.unexplained_hunks(tmp_path)
    assert hunk.startswith("dqn_torchcompile.py:") and "(deleted)" in hunk, hunk


def test_readme_quick_start_runs_as_pasted_on_a_cpu_with_the_cuda_line_beside_it():
    """A newcomer pastes the first training line on a laptop: it must not ask for CUDA (--cudagraphs exits 2 there)
    and must show learning in minutes (a CartPole run, not Breakout's, whose CPU budget shows none); the GPU line is
    there too."""
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start")[1].split("```bash")[1].split("```")[0]
    runs = [line for line in quick_start.splitlines() if line.startswith("python leanrl/")]
    assert len(runs) == 2 and "--cudagraphs" not in runs[0] and "--cudagraphs" in runs[1], runs
    first, gpu = (run.split("#")[0].split() for run in runs)
    assert load_script(first[1]).Args().env_id == "CartPole-v1" and "--env-id" not in first
    assert (ROOT / gpu[1]).exists()


CURRENT_DOCS = ["docs/gpu-checks.md", "docs/cpu-speed.md", "benchmarks/README.md"]  # each opens with the answer


def anchors_of(page):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, -1, -2 on
    repeats."""
    seen, anchors = {}, set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_readme_is_short_and_its_links_resolve():
    """The README under 15 KB; each doc that answers a speed question (the history in docs/archive/) at most 12 KB;
    every link of the README, the benchmarks' pages and docs/ (the archive too) to a file resolves, and so does its
    anchor (#section) where it names one."""
    readme = ROOT / "README.md"
    assert readme.stat().st_size < 15_000, f"README.md is {readme.stat().st_size} bytes: move write-ups to docs/"
    for doc in CURRENT_DOCS:
        size = (ROOT / doc).stat().st_size
        assert size <= 12_000, f"{doc} is {size} bytes: move its history to docs/archive/"
    docs = [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "archive").glob("*.md"))]
    docs += sorted((ROOT / "docs" / "gpu-runs").glob("*.md"))
    assert len(list((ROOT / "docs" / "archive").glob("*.md"))) >= 10, "the dated history of the current docs"
    for page in [readme, *sorted((ROOT / "benchmarks").glob("*.md")), *docs]:
        for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if not target and not anchor:
                continue
            path = page.parent / target if target else page
            assert path.exists(), f"{page.relative_to(ROOT)} links to missing {target}"
            if anchor and path.suffix == ".md":
                assert anchor in anchors_of(path), f"{page.relative_to(ROOT)} links to missing {target}#{anchor}"


def test_the_current_docs_tables_are_what_plot_renders_from_the_committed_runs():
    """No figure typed in: the GPU sessions of docs/gpu-checks.md (the runs its command names) and the README's cut
    of the first, the steady table of docs/cpu-speed.md and the README (one file), the operator and replay cuts of
    benchmarks/README.md are plot.py's renderings of the committed results; two calls on one machine, two tables."""
    block = lambda text, marker: text.split(f"<!-- {marker}:start -->")[1].split(f"<!-- {marker}:end -->")[0].strip()
    readme, gpu_doc = (ROOT / "README.md").read_text(), (ROOT / "docs" / "gpu-checks.md").read_text()
    command = gpu_doc[gpu_doc.index("```bash") : gpu_doc.index("--readme docs/gpu-checks.md")]
    paths = re.findall(r"docs/gpu-runs/[\w.-]+\.jsonl", command)
    sessions = [[json.loads(raw) for raw in (ROOT / path).read_text().splitlines() if raw.strip()] for path in paths]
    assert (
        len(sessions) == 2
        and block(gpu_doc, "gpu-sessions") == plot.gpu_markdown(sum(sessions, []), checks=False).strip()
    )
    assert block(gpu_doc, "gpu-sessions").count("### NVIDIA H200") == 2 and "host syncs" not in gpu_doc.split("##")[1]
    assert block(readme, "gpu-table") == plot.gpu_markdown(sessions[0], brief=True).strip()
    many = plot.read_results(ROOT / "plots" / "many-agents" / "results.jsonl")
    assert block(readme, "many-agents") == plot.many_agents_markdown(many).strip() and len(many) == 2
    steady_dir = ROOT / "benchmarks" / "results"
    steady = (steady_dir / "steady_cpu.md").read_text()
    cpu_doc = (ROOT / "docs" / "cpu-speed.md").read_text()
    parts = [(p.read_text(), f"../benchmarks/results/{p.name}") for p in sorted(steady_dir.glob("steady_cpu_*.md"))]
    want = plot.steady_brief(steady, "../benchmarks/results/steady_cpu.md", parts)
    assert block(cpu_doc, "steady-table") == want.strip()
    bench = (ROOT / "benchmarks" / "README.md").read_text()
    for marker, brief, name in (
        ("rl-ops", plot.rl_ops_brief, "rl_ops_cpu.md"),
        ("replay", plot.replay_brief, "replay_cpu.md"),
    ):
        whole = (ROOT / "benchmarks" / "results" / name).read_text()
        assert block(bench, marker) == brief(whole, f"results/{name}").strip()
        rows = lambda text: {line for line in text.splitlines() if line.startswith("| ") and "---" not in line}
        assert rows(block(bench, marker)) < rows(whole)  # a cut: each row as the whole report has it


def test_benchmark_tables_are_spliced_into_the_benchmarks_readme(tmp_path):
    table = tmp_path / "rl_ops_cpu.md"
    table.write_text("Measured on CPU only; the operator table\n")
    readme, bench = tmp_path / "README.md", tmp_path / "bench.md"
    readme.write_text("x\n<!-- speed-table:start -->\nold\n<!-- speed-table:end -->\n")
    bench.write_text("y\n<!-- rl-ops:start -->\n<!-- rl-ops:end -->\n<!-- replay:start -->\n<!-- replay:end -->\n")
    plot.main(["--rl-ops", str(table), "--readme", str(readme), "--benchmarks-readme", str(bench)])
    assert "the operator table" in bench.read_text() and "old" in readme.read_text()


def test_trick_comments_are_collected_with_their_continuation_lines(tmp_path):
    script = tmp_path / "x_torchcompile.py"
    script.write_text(
        '"""every hunk has a `# trick:` comment"""\n'  # quoted in a docstring: not a trick
        "# trick: keep it on the device\n# so no copies\n"
        "b = 2  # trick: fuse | ops\n# an ordinary comment after an inline trick\n"
        "if b:\n    # trick: indented\n    # goes on\n# back out: ends it\n"
    )
    tricks = load_script("plots/tricks.py")
    assert tricks.find_tricks(script) == [
        (2, "keep it on the device so no copies"),
        (4, "fuse | ops"),
        (7, "indented goes on"),
    ]


def test_results_lines_are_read_strictly():
    assert strict_json('{"sps": null, "mean_return": 1.5}') == {"sps": None, "mean_return": 1.5}
    for constant in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(ValueError, match="not strict JSON"):
            strict_json(f'{{"losses": {{"loss": {constant}}}}}')


def test_summary_line_pattern():
    line = (
        "dqn.py: diverged: 5000 steps, 812 steps/s, mean return -21.3 over 40 episodes; "
        "results: runs/results.jsonl, run folder: runs/CartPole-v1__dqn__1__1763855000"
    )
    m = SUMMARY.match(line)
    assert m and m["status"] == "diverged" and m["steps"] == "5000" and m["mean_return"] == "-21.3"
    assert m["run_dir"] == "runs/CartPole-v1__dqn__1__1763855000"
    assert SUMMARY.match(line.replace("812 steps/s", "n/a steps/s").replace("-21.3", "n/a"))
    assert not SUMMARY.match(line.replace("diverged", "failed"))


# ---------------------------------------------------------------- the scripts read like CleanRL's

# SPEC/issue 15: an eager script at most 1.3x its CleanRL counterpart (R2D2, which CleanRL lacks: 650), its first
# network before line 150, and the twin's diff against it no larger than it was before the rewrite (changed lines)
EAGER_MAX_LINES = {
    "ppo": 405,  # CleanRL's ppo.py: 312 lines
    "ppo_atari_envpool": 450,
    "ppo_continuous_action": 460,
    "sac_continuous_action": 420,
    "td3_continuous_action": 410,
    "dqn": 320,
    "dqn_atari_envpool": 350,
    "r2d2_atari_envpool": 650,
    "pqn": 322,  # CleanRL's pqn.py: 248 lines
    "pqn_atari_envpool": 378,  # CleanRL's pqn_atari_envpool.py: 291 lines
}
TWIN_MAX_DIFF = {  # changed lines (difflib, no context) at 0efbb5a, the commit before the rewrite
    "ppo": 263,  # at its first commit (issue 49): PPO continuous's tricks on CleanRL's ppo.py
    "ppo_atari_envpool": 277,  # 204, then --env-threads, --async-envs and FAST_FLAGS (issue 40)
    "ppo_continuous_action": 264,  # 224, then the one-graph update with Adam as tensor ops, SAC's and TD3's (issue 28),
    # then the training state's T + 1 storage row (issue 41)
    "sac_continuous_action": 209,  # 206, then the reset obs in the step upload's layout (one graph; issue 42)
    "td3_continuous_action": 201,  # 196, then one pinned upload a step, as SAC's, the reset obs in its layout (42)
    "dqn": 127,
    "dqn_atari_envpool": 121,
    "r2d2_atari_envpool": 150,  # 129, then one pinned upload a step (issue 42: one pinned upload a step)
    "pqn": 149,  # at its first commit with tests (issue 24)
    "pqn_atari_envpool": 241,  # 164 at its first commit with tests (issue 24), then --env-threads, --async-envs and
    # FAST_FLAGS (issue 40)
}


def changed_lines(a, b):
    import difflib

    return sum(line[:1] in "+-" and line[:3] not in ("+++", "---") for line in difflib.unified_diff(a, b, n=0))


def test_scripts_read_like_cleanrl(capsys):
    rows = []
    for pair, max_lines in EAGER_MAX_LINES.items():
        eager = (ROOT / "leanrl" / f"{pair}.py").read_text().splitlines()
        twin = (ROOT / "leanrl" / f"{pair}_torchcompile.py").read_text().splitlines()
        first_network = [
            next(i for i, line in enumerate(lines, 1) if re.match(r"class \w+\((nn\.)?Module\)", line))
            for lines in (eager, twin)
        ]
        diff = changed_lines(eager, twin)
        rows.append((pair, len(eager), max_lines, len(twin), diff, TWIN_MAX_DIFF[pair], *first_network))
    with capsys.disabled():
        print("\npair: eager lines (max) / twin lines / twin diff (max) / first network eager, twin")
        for row in rows:
            print("{}: {} ({}) / {} / {} ({}) / {}, {}".format(*row))
    for pair, eager_lines, max_lines, _, diff, max_diff, first_eager, first_twin in rows:
        assert eager_lines <= max_lines, f"{pair}.py has {eager_lines} lines, more than {max_lines}"
        assert diff <= max_diff, f"{pair}: the twin's diff is {diff} changed lines, more than {max_diff}"
        assert first_eager < 150 and first_twin < 150, f"{pair}: first network at line {first_eager} / {first_twin}"
    for third in ("pqn_device_env.py", "ppo_device_env.py"):  # the third files read in the same order
        lines = (ROOT / "leanrl" / third).read_text().splitlines()
        first = next(i for i, line in enumerate(lines, 1) if re.match(r"class \w+\((nn\.)?Module\)", line))
        assert first < 150, f"{third}: first network at line {first}"


def test_no_script_keeps_a_copy_of_the_bookkeeping():
    """The run bookkeeping lives in leanrl/bookkeeping.py: no script defines its own results writer, summary line,
    failure exit, steps/s meter, strict-JSON cleaner or MuJoCo warning filter again."""
    bookkeeping = re.compile(
        r"^(def (fail|write_results|summary|summary_line|finite_or_none|cpu_name|machine|append_line|speed|sps_since"
        r"\w*|first_non_finite|mujoco_\w+|finished_episodes|game_returns)\(|class Diverged\b)"
    )
    for path in sorted((ROOT / "leanrl").glob("*.py")):
        if path.name in ("bookkeeping.py", "__init__.py"):
            continue
        found = [line for line in path.read_text().splitlines() if bookkeeping.match(line)]
        assert not found, f"{path.name} defines {found}"


def test_a_run_forked_from_the_preloaded_process_is_the_run_a_fresh_process_makes(tmp_path):
    """The same exit code, stderr and numbers (a seeded run) as a process of its own (a variable of the test's own
    gives it one); a traceback for an uncaught error; a run past its timeout killed, the next one served."""
    fresh = {"LEANRL_TEST_FRESH_PROCESS": "1"}
    tiny = ("--learning-starts", "200", "--total-timesteps", "600", "--train-frequency", "10", "--seed", "4")
    keep = ("status", "steps", "episodes", "mean_return", "losses")
    for i, env in enumerate([None, fresh]):
        served = PRELOADED.forked
        bad, _ = run_script("dqn_torchcompile", "--total-timesteps", "-5", tmp_path=tmp_path, env=env)
        assert bad.returncode == 2 and bad.stderr.strip().endswith("--total-timesteps must be positive, got -5")
        (tmp_path / str(i)).mkdir()
        run, lines = run_script("dqn", *tiny, tmp_path=tmp_path / str(i), env=env)
        assert run.returncode == 0 and run.stdout.startswith("dqn.py: ok: 600 steps"), run.stderr[-2000:]
        assert PRELOADED.forked - served == (2 if env is None else 0)
        if env is None:
            forked = {key: lines[0][key] for key in keep}
        else:
            assert {key: lines[0][key] for key in keep} == forked and forked["losses"]
    error, _ = run_script("dqn", "--eval-checkpoint", str(tmp_path / "no.pt"), tmp_path=tmp_path)
    assert error.returncode == 2 and "Traceback" not in error.stderr  # bookkeeping's one line
    (tmp_path / "crash.py").write_text("print('before')\n1 / 0\n")
    crash = PRELOADED.run([sys.executable, str(tmp_path / "crash.py")], PRELOADED.env, tmp_path, timeout=60)
    assert crash.returncode == 1 and crash.stdout == "before\n" and "ZeroDivisionError" in crash.stderr.splitlines()[-1]
    with pytest.raises(subprocess.TimeoutExpired):
        PRELOADED.run([sys.executable, str(ROOT / "leanrl" / "dqn.py"), "--no-cuda"], PRELOADED.env, tmp_path, 3)
    served = PRELOADED.forked  # two threads at once: one run forked, the other in a process of its own
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    bad = lambda i: run_script("dqn_torchcompile", "--total-timesteps", f"-{i}", tmp_path=tmp_path / "ab"[i - 1])[0]
    with ThreadPoolExecutor(max_workers=2) as pool:
        both = list(pool.map(bad, [1, 2]))
    assert [proc.stderr.strip()[-2:] for proc in both] == ["-1", "-2"] and {proc.returncode for proc in both} == {2}
    assert 1 <= PRELOADED.forked - served <= 2


# words of a machine lent for a limited time, or of folders outside the repository: the product's own files describe
# running on the user's machine after the README's install (a clone has no ../shared, no kit, no lease)
NOT_THE_PRODUCTS_WORDS = {
    "a folder outside the repository": r"\.\./shared|(?<![\w.-])shared/|kit\.sh|/work/|/tmp/",
    "a lent machine": r"\blent\b|\blease\b|\bgive_back\b|\bfiles_at\b|\bbudget_left",
    "a limit of a lent machine": r"\bc[oa]mes? back\b|\bcall's (minutes|limit|time)\b|\bdevice time left\b",
}


def words_of_elsewhere(name, text):
    """['name:line: what (the words)'] for each outside folder or lent machine's limit that the text names."""
    return [
        f"{name}:{number}: {what} ({m.group(0)})"
        for number, line in enumerate(text.splitlines(), 1)
        for what, pattern in NOT_THE_PRODUCTS_WORDS.items()
        for m in re.finditer(pattern, line, re.IGNORECASE)
    ]


def test_the_docs_speak_of_the_users_machine_only():
    """README, docs/ (archive and GPU runs' pages included) and benchmarks/ (markdown, shell, Python) name no folder
    outside the repository and no lent machine or its limits. The check finds each kind of word in a planted text
    and passes its honest neighbours ('shared lanes', 'came in', 'talented')."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    paths += [p for ext in ("md", "sh", "py") for p in sorted((ROOT / "benchmarks").rglob(f"*.{ext}"))]
    assert [hit for p in paths for hit in words_of_elsewhere(p.relative_to(ROOT), p.read_text())] == []
    planted = "Install with ../shared/gpu/kit.sh on the lent machine.\nAt most 7 files come back; the lease ends.\n"
    planted += "A call's minutes are few; results in /tmp/x.\nFigures from shared lanes; it came in; a talented run.\n"
    assert [hit.split(" (")[0] for hit in words_of_elsewhere("planted", planted)] == [
        "planted:1: a folder outside the repository",  # ../shared (its shared/ is the same words)
        "planted:1: a folder outside the repository",  # kit.sh
        "planted:1: a lent machine",
        "planted:2: a lent machine",
        "planted:2: a limit of a lent machine",
        "planted:3: a folder outside the repository",
        "planted:3: a limit of a lent machine",
    ]
