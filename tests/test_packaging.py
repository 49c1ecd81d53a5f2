"""The install story stays consistent: environment.yml mirrors pyproject, README's test command is CI's."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIRRORED_EXTRAS = ("lab", "test", "torch")


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = set(map(_normalise, project["dependencies"]))
    for extra in MIRRORED_EXTRAS:
        expected |= set(map(_normalise, project["optional-dependencies"][extra]))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == expected, f"only in environment.yml: {listed - expected}; only in pyproject: {expected - listed}"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci_lines = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_command = re.search(r"<!-- test-command -->\s*```(?:bash)?\n(.+?)\n```", readme, re.S).group(1).strip()
    assert test_command in ci_lines


def test_console_script_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["moe-course"] == "moe_course.cli:main"
