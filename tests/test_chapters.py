"""Every chapter runs top to bottom under nbval (jupytext -> temporary .ipynb -> pytest --nbval-lax).

The chapters assert their own claims, so a chapter whose measured result stops holding fails here. They run
with the inline matplotlib backend a learner's Jupyter uses, and every chapter must draw its figures: the
nbval run reports each cell's outputs (tests/nbval_outputs.py), and a chapter that draws fewer figures than
listed below, or prints a wall of text (such as a model's repr), fails. How the chapters fare under other
seeds and another CPU instruction set: benchmarks/chapter_robustness.py.
"""

import importlib.util
from pathlib import Path

import jupytext
import pytest

from chapter_runner import CHAPTERS, run_chapter

# Figures (image outputs) each chapter draws when executed; the slider figure of chapter 3 counts once.
FIGURES = {"00_jax_primer": 2, "01_vit": 5, "02_moe_layer": 3, "03_vmoe_bpr": 4, "04_limoe": 8, "05_soft_moe": 3, "06_mod": 5,
           "07_scale": 7, "08_upcycling": 1}
MAX_OUTPUT_LINES = 60
# Sections that run only where an optional package is installed (chapter 2 compares its layer with the PyTorch
# twin). Without the package the chapter still runs and must pass; the test then skips, naming the section, so
# that the second stage of .ci/run (PyTorch added) runs the chapter again with it.
OPTIONAL_SECTIONS = {"02_moe_layer": "torch"}
# Chapters with no graded assignment (no solutions/NN_slug.py, hence no exercises/NN_slug.ipynb), and why. Their
# "## Exercises" cell holds small questions answered in collapsed <details> blocks instead; every other chapter
# has an assignment (tests/test_course_release.py).
WITHOUT_ASSIGNMENT = {"00_jax_primer": "a primer on the tools (JAX, Flax NNX) for PyTorch users, not on MoE"}
ROOT = Path(__file__).resolve().parent.parent


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/NN_*.py found"
    assert sorted(FIGURES) == [c.stem for c in CHAPTERS], "list every chapter's figure count in FIGURES"


@pytest.mark.parametrize("stem", sorted(WITHOUT_ASSIGNMENT))
def test_a_chapter_without_an_assignment_answers_its_exercises_inside(stem):
    assert stem in [c.stem for c in CHAPTERS], f"WITHOUT_ASSIGNMENT names {stem}, which is not a chapter"
    for made in (ROOT / "solutions" / f"{stem}.py", ROOT / "exercises" / f"{stem}.ipynb"):
        assert not made.exists(), f"{stem} has {made.relative_to(ROOT)}: take it out of WITHOUT_ASSIGNMENT"
    cells = [c.source for c in jupytext.read(ROOT / "chapters" / f"{stem}.py").cells if c.cell_type == "markdown"]
    exercises = next((text for text in cells if text.startswith("## Exercises")), "")
    questions = [line for line in exercises.splitlines() if line[:1].isdigit() and ". " in line[:4]]
    assert questions and exercises.count("<details>") == exercises.count("</details>") == len(questions), (
        f"{stem}: each numbered exercise is answered in a <details> block: {questions}")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes(chapter, tmp_path):
    run = run_chapter(chapter, tmp_path)
    assert run.returncode == 0, run.output
    images = sum(cell["images"] for cell in run.cells)
    assert images >= FIGURES[chapter.stem], f"{chapter.stem} drew {images} figures, expected {FIGURES[chapter.stem]}"
    walls = [cell for cell in run.cells if cell["longest_text"] > MAX_OUTPUT_LINES]
    assert not walls, f"cells printing more than {MAX_OUTPUT_LINES} lines: {walls}"
    package = OPTIONAL_SECTIONS.get(chapter.stem)
    if package and importlib.util.find_spec(package) is None:
        pytest.skip(f"{chapter.stem} passed without its {package} section: {package} is not installed")
