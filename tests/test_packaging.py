"""The install story stays consistent: environment.yml mirrors pyproject, CI runs README's two commands, the
accelerator extras name real JAX extras."""

import ast
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIRRORED_EXTRAS = ("lab", "test")  # torch is left out of environment.yml: see its header


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def _extra(project: dict, name: str) -> set[str]:
    """An extra's requirements, with the project's own extras it names ("moe-course[docs]") expanded."""
    found = set()
    for requirement in map(_normalise, project["optional-dependencies"][name]):
        own = re.fullmatch(re.escape(project["name"]) + r"\[(\w+)\]", requirement)
        found |= _extra(project, own.group(1)) if own else {requirement}
    return found


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = set(map(_normalise, project["dependencies"]))
    for extra in MIRRORED_EXTRAS:
        expected |= _extra(project, extra)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == expected, f"only in environment.yml: {listed - expected}; only in pyproject: {expected - listed}"


def test_environment_yml_does_not_pull_torch():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_section = [d for d in env["dependencies"] if isinstance(d, str)]
    assert not [r for r in pip_section + conda_section if re.match(r"(py)?torch\b", r)]


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    return re.search(r"<!-- test-command -->\s*```(?:bash)?\n(.+?)\n```", readme, re.S).group(1).strip()


def _pytest_lines() -> list[str]:
    return [line for line in _ci_lines() if line.startswith("python -m pytest")]


def test_readme_test_command_is_what_ci_runs():
    """CI runs README command 2 in two stages, which split the suite without leaving anything out: the first
    records what it skipped or deselected, the second runs exactly that (tests/conftest.py)."""
    command = _readme_test_command()
    first, second = _pytest_lines()
    assert first.startswith(command + " ") and second.startswith(command + " "), (command, first, second)
    recorded = re.fullmatch(re.escape(command) + r' --record-unrun=(\S+)', first)
    replayed = re.fullmatch(re.escape(command) + r' --only-listed=(\S+)', second)
    assert recorded and replayed and recorded.group(1) == replayed.group(1), (first, second)


def test_ci_installs_what_readme_command_1_installs():
    readme = (ROOT / "README.md").read_text()
    command_1 = re.search(r"```bash\n(python3 -m venv .+?)\n```", readme).group(1)
    install = next(part.strip() for part in command_1.split("&&") if part.strip().startswith("pip install"))
    assert install in _ci_lines(), f"README command 1 installs with {install!r}; .ci/run does not"


def test_ci_runs_the_tests_in_the_readme_command_1_install_too():
    """README command 1 installs neither PyTorch nor nbgrader, so tests that need them must skip by name there:
    CI runs the whole suite, chapters and slow tests included, after that install, before adding the two."""
    lines = _ci_lines()
    install = lines.index('pip install -e ".[lab,test]"')
    extras = next(i for i, line in enumerate(lines) if line.startswith("pip install") and "torch" in line)
    between = [line for line in lines[install + 1:extras] if line.startswith("python -m pytest")]
    assert between == [_pytest_lines()[0]], lines[install:extras]
    options = between[0].removeprefix(_readme_test_command())
    assert not re.search(r"--ignore|--deselect|-m |-k ", options), between[0]  # nothing left out of stage 1


def test_accelerator_extras_name_real_jax_extras():
    """cuda12/cuda13/tpu ask for JAX's extra of that name, in the same version range as the core dependency."""
    from importlib.metadata import metadata

    jax_extras = set(metadata("jax").get_all("Provides-Extra"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core_range = next(r for r in project["dependencies"] if r.startswith("jax>")).removeprefix("jax")
    for name in ("cuda12", "cuda13", "tpu"):
        (requirement,) = project["optional-dependencies"][name]
        assert requirement == f"jax[{name}]{core_range}" and name in jax_extras, (requirement, sorted(jax_extras))


def test_console_script_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["moe-course"] == "moe_course.launch:main"


def test_readme_command_1_installs_no_torch_and_ci_adds_it():
    """A CPU machine following command 1 downloads no CUDA build of PyTorch; CI adds the CPU build so that the
    PyTorch twins' tests still run there."""
    readme = (ROOT / "README.md").read_text()
    command_1 = re.search(r"```bash\n(python3 -m venv .+?)\n```", readme).group(1)
    assert "torch" not in command_1, command_1
    torch_lines = [line for line in _ci_lines() if line.startswith("pip install") and "torch" in line]
    assert torch_lines == ['pip install torch==2.13.0 -e ".[torch,instructor,augment,tpu]"'], torch_lines


def test_nbgrader_is_instructor_only_and_ci_installs_it():
    """nbgrader's Lab extension adds instructor menus to every JupyterLab of its environment: a learner's
    install (README command 1: lab and test) has none; CI installs the instructor extra for the grading tests."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra in ("lab", "test"):
        assert not [r for r in _extra(project, extra) if r.startswith("nbgrader")], extra
    assert any(r.startswith("nbgrader") for r in _extra(project, "instructor"))
    assert any(line.startswith("pip install") and "instructor" in line for line in _ci_lines())


def _imports_torch(node) -> bool:
    names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
             else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
    return any(name == "torch" or name.startswith(("torch.", "moe_course.torch")) for name in names)


def _skips_without_torch(node) -> bool:
    return any(isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "importorskip" and call.args
               and getattr(call.args[0], "value", None) == "torch" for call in ast.walk(node))


def _unguarded_torch_imports(body, guarded: bool) -> list[int]:
    """Line numbers of imports of torch or moe_course.torch in ``body`` (and the functions in it) that no
    earlier ``pytest.importorskip("torch")`` of the same or an enclosing scope guards."""
    found = []
    for statement in body:
        if _imports_torch(statement) and not guarded:
            found.append(statement.lineno)
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            found += _unguarded_torch_imports(statement.body, guarded)
        elif _skips_without_torch(statement):
            guarded = True
    return found


def test_every_test_that_imports_torch_skips_by_name_without_it():
    """Without PyTorch (README command 1) the twins' tests skip with a reason instead of failing to import."""
    offenders = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        lines = _unguarded_torch_imports(ast.parse(path.read_text()).body, guarded=False)
        if lines:
            offenders[path.name] = lines
    assert not offenders, f"imports of torch before pytest.importorskip('torch'): {offenders}"


def test_the_wheel_carries_the_recorded_runs_the_chapters_read(tmp_path):
    """Chapters 3 and 5 read moe_course/results/ (``sweeps.RESULTS``); a chapter downloaded from the website
    installs the course from a wheel, so the runs must be in it."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from moe_course.analysis.sweeps import RESULTS

    recorded = sorted(p.name for p in RESULTS.glob("*.jsonl"))
    assert "glyphs.jsonl" in recorded
    # built from a copy of what the wheel is made of: setuptools' build/ folder is then the test's own, never the
    # checkout's (a build/bdist... folder another build left there fails the next one: "File exists")
    source = tmp_path / "source"
    shutil.copytree(ROOT / "moe_course", source / "moe_course", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, timeout=600)
    (wheel,) = tmp_path.glob("moe_course-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(f"moe_course/results/{name}" in names for name in recorded), names
