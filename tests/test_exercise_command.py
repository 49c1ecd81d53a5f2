"""`moe-course exercise NN`: the handout is copied into mywork/ (git-ignored), never overwritten unasked, and the
printed check command works from any folder of the clone -- on a temporary copy of the course's layout."""

import shutil
import subprocess
from pathlib import Path

import pytest

from moe_course import exercise
from moe_course.cli import main

ROOT = Path(__file__).resolve().parents[1]
HANDOUTS = ("01_vit", "06_mod")


@pytest.fixture
def clone(tmp_path):
    """A folder laid out as a clone: chapters/, two handouts in exercises/, mywork/ with its README."""
    (tmp_path / "chapters").mkdir()
    (tmp_path / "exercises").mkdir()
    (tmp_path / "mywork").mkdir()
    for name in HANDOUTS:
        shutil.copy(ROOT / "exercises" / f"{name}.ipynb", tmp_path / "exercises")
    shutil.copy(ROOT / "mywork" / "README.md", tmp_path / "mywork")
    return tmp_path


@pytest.mark.parametrize("name", ["1", "01", "01_vit", "vit", "01_vit.ipynb"])
def test_any_form_of_the_name_copies_the_handout(clone, name, monkeypatch, capsys):
    monkeypatch.chdir(clone / "chapters")  # where JupyterLab's Terminal opens after README's steps
    assert main(["exercise", name]) == 0
    copy = clone / "mywork" / "01_vit.ipynb"
    assert copy.read_bytes() == (clone / "exercises" / "01_vit.ipynb").read_bytes()
    out = capsys.readouterr().out
    assert "moe-course check mywork/01_vit.ipynb" in out and "double-click 01_vit.ipynb" in out, out
    left = sorted(path.name for path in (clone / "mywork").iterdir())
    assert left == ["01_vit.ipynb", "README.md"], f"a temporary file is left: {left}"


def test_an_existing_copy_is_kept_unless_forced(clone, monkeypatch, capsys):
    monkeypatch.chdir(clone)
    assert main(["exercise", "06"]) == 0
    copy = clone / "mywork" / "06_mod.ipynb"
    copy.write_text("my answers")
    assert main(["exercise", "06"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mywork/06_mod.ipynb exists already" in err[0] and "--force" in err[0], err
    assert copy.read_text() == "my answers"
    assert main(["exercise", "mod", "--force"]) == 0
    assert copy.read_bytes() == (clone / "exercises" / "06_mod.ipynb").read_bytes()


@pytest.mark.parametrize("name", ["09", "7", "soft", "123"])
def test_an_unknown_exercise_names_the_value_and_the_allowed_ones(clone, name, monkeypatch, capsys):
    monkeypatch.chdir(clone)
    assert main(["exercise", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"moe-course exercise: error: exercise={name!r} is not an exercise of this course; give its "
                   f"number or name: 01 (01_vit), 06 (06_mod)")
    assert not list((clone / "mywork").glob("*.ipynb"))


def test_outside_a_clone_it_says_where_to_go(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["exercise", "01"]) == 2
    assert "is not inside a clone of the course" in capsys.readouterr().err


def test_the_check_command_works_from_a_subfolder(clone, monkeypatch, capsys):
    monkeypatch.chdir(clone / "chapters")
    exercise.copy_exercise("01")
    with pytest.raises(SystemExit, match="1"):  # the blank copy: found, run, nothing attempted yet
        main(["check", "mywork/01_vit.ipynb"])
    out = capsys.readouterr().out
    assert "not attempted" in out and "tasks passed (01_vit.ipynb)" in out, out


def test_every_handout_is_found_and_the_copies_are_git_ignored():
    names = exercise.handouts(ROOT)
    assert list(names) == [f"{i:02d}" for i in range(1, len(names) + 1)], names
    copies = [f"mywork/{path.name}" for path in names.values()]
    ignored = subprocess.run(["git", "check-ignore", *copies], cwd=ROOT, capture_output=True, text=True).stdout
    assert ignored.split() == copies
