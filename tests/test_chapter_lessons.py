"""Every chapter is a lesson: tasks for the learner inside it, and a Summary, Exercises and References at its end.

A task is a markdown cell that opens with one of the bold labels below (docs/course.md, "How a chapter asks you
to work"). A "predict, then run" prompt stands before the code cell that settles it; that cell computes and prints
but asserts nothing (an assertion would state the outcome before the learner has guessed), and the answer follows
it, collapsed in a <details> block, so the learner sees the output before the answer; the chapter's assertion of
the claim sits in a cell after the answer. Every other task carries its collapsed answer in its own cell or in the
markdown cell right after it.
"""

import ast
import re
from pathlib import Path

import jupytext
import pytest

from chapter_runner import CHAPTERS

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("Predict, then run.", "Explore.", "Explain the plot.", "Change one thing.", "Implement.")
ENDING = ("## Summary", "## Exercises", "## References")
ARXIV_LINK = re.compile(r"\[arXiv:(\d{4}\.\d{4,5})\]\(https://arxiv\.org/abs/\1\)")


def _cells(chapter: Path) -> list[dict]:
    return [{"type": c.cell_type, "text": c.source.strip()} for c in jupytext.read(chapter).cells]


def _kind(cell: dict) -> str | None:
    if cell["type"] != "markdown":
        return None
    return next((kind for kind in KINDS if cell["text"].startswith(f"**{kind}**")), None)


def _asserts(code: str) -> bool:
    """Whether a code cell holds an ``assert`` statement anywhere (IPython magics and shell lines ignored)."""
    python = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    return any(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(python)))


def _answer(cells: list[dict], i: int) -> str | None:
    """The collapsed answer of the task in cell ``i``: in the task's own cell, or opening the next markdown cell."""
    text = cells[i]["text"]
    if "<details>" in text:
        return text[text.index("<details>"):]
    following = next((cell for cell in cells[i + 1:] if cell["type"] == "markdown"), None)
    if following is not None and following["text"].startswith("<details>"):
        return following["text"]
    return None


def _tasks(cells: list[dict]) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for cell in cells:
        if kind := _kind(cell):
            counts[kind] += 1
    return counts


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_asks_the_learner_to_do_things(chapter):
    counts = _tasks(_cells(chapter))
    assert sum(counts.values()) >= 4, f"{chapter.stem}: {counts}: at least 4 tasks"
    kinds = [kind for kind, n in counts.items() if n and kind != "Implement."]
    assert len(kinds) >= 2, f"{chapter.stem}: {counts}: at least two kinds of task besides Implement"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_predictions_are_settled_by_the_next_cell_and_answered_after_it(chapter):
    cells = _cells(chapter)
    for i, cell in enumerate(cells):
        if _kind(cell) != "Predict, then run.":
            continue
        where = f"{chapter.stem}, the prediction {cell['text'][:70]!r}"
        assert i + 2 < len(cells) and cells[i + 1]["type"] == "code", f"{where}: no code cell follows it"
        answer = cells[i + 2]
        assert answer["type"] == "markdown" and answer["text"].startswith("<details>"), \
            f"{where}: the cell after the code must open with a collapsed <details> answer"
        assert "</details>" in answer["text"] and "<summary>" in answer["text"], f"{where}: unclosed <details>"
        assert not _asserts(cells[i + 1]["text"]), \
            f"{where}: the cell it asks about asserts the outcome; move the assertion into a cell after the answer"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_task_has_a_collapsed_answer(chapter):
    cells = _cells(chapter)
    for i, cell in enumerate(cells):
        if _kind(cell) in (None, "Implement."):
            continue
        answer = _answer(cells, i)
        where = f"{chapter.stem}, the task {cell['text'][:70]!r}"
        assert answer is not None, f"{where}: no collapsed <details> answer in its cell or the next markdown cell"
        assert "<summary>" in answer and "</details>" in answer, f"{where}: unclosed <details>"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_ends_with_summary_exercises_and_references(chapter):
    markdown = [cell["text"] for cell in _cells(chapter) if cell["type"] == "markdown"]
    endings = [text.splitlines()[0] for text in markdown[-3:]]
    assert tuple(endings) == ENDING, f"{chapter.stem}: the last markdown cells are {endings}, expected {ENDING}"
    summary, exercises, references = markdown[-3:]
    bullets = [line for line in summary.splitlines() if line.startswith("- ")]
    assert 3 <= len(bullets) <= 6, f"{chapter.stem}: the summary has {len(bullets)} bullets (3-6)"
    notebook = ROOT / "exercises" / f"{chapter.stem}.ipynb"
    if notebook.exists():  # the one path (README, exercises/README.md): copy with the command, check the copy
        assert f"moe-course exercise {chapter.stem[:2]}\n" in exercises, \
            f"{chapter.stem}: say how to get your copy (moe-course exercise {chapter.stem[:2]})"
        assert f"moe-course check mywork/{chapter.stem}.ipynb" in exercises, \
            f"{chapter.stem}: say how to check your copy without the instructor tools"
        assert "](../exercises/" not in exercises, \
            f"{chapter.stem}: no link to the tracked handout (JupyterLab would save over it): give the command"
    assert ARXIV_LINK.search(references), f"{chapter.stem}: the references link no paper on arXiv"


def test_the_check_counts_tasks_and_rejects_a_chapter_without_them(tmp_path):
    lesson = tmp_path / "99_lesson.py"
    lesson.write_text("# %% [markdown]\n# **Predict, then run.** Which is larger?\n\n# %%\nprint(1)\n\n"
                      "# %% [markdown]\n# <details><summary>Answer</summary>\n#\n# The first.\n#\n# </details>\n\n"
                      "# %% [markdown]\n# The words **Explore.** in the middle of a cell are not a task.\n")
    counts = _tasks(_cells(lesson))
    assert counts["Predict, then run."] == 1 and sum(counts.values()) == 1
    with pytest.raises(AssertionError, match="at least 4 tasks"):
        test_chapter_asks_the_learner_to_do_things(lesson)
    with pytest.raises(AssertionError, match="Summary"):
        test_chapter_ends_with_summary_exercises_and_references(lesson)
    test_predictions_are_settled_by_the_next_cell_and_answered_after_it(lesson)
    test_every_task_has_a_collapsed_answer(lesson)


def test_the_check_rejects_a_prediction_that_asserts_and_a_task_without_answer(tmp_path):
    answer = "# %% [markdown]\n# <details><summary>Answer</summary>\n#\n# The first.\n#\n# </details>\n\n"
    asserting = tmp_path / "98_asserting.py"
    asserting.write_text("# %% [markdown]\n# **Predict, then run.** Which is larger?\n\n"
                         "# %%\nfor a in (1,):\n    assert a > 0  # the outcome, before the learner guessed\n\n"
                         + answer)
    with pytest.raises(AssertionError, match="asserts the outcome"):
        test_predictions_are_settled_by_the_next_cell_and_answered_after_it(asserting)
    unanswered = tmp_path / "97_unanswered.py"
    unanswered.write_text("# %% [markdown]\n# **Change one thing.** Set it to 2: what changes?\n\n"
                          "# %%\nprint(2)\n\n# %% [markdown]\n# It doubles: no answer block.\n\n" + answer)
    with pytest.raises(AssertionError, match="no collapsed <details> answer"):
        test_every_task_has_a_collapsed_answer(unanswered)
