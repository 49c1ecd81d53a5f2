"""Every chapter is a lesson: tasks for the learner inside it, and a Summary, Exercises and References at its end.

A task is a markdown cell that opens with one of the bold labels below (docs/course.md, "How a chapter asks you
to work"). A "predict, then run" prompt stands before the code cell that settles it; that cell computes and prints
but asserts nothing (an assertion would state the outcome before the learner has guessed), and the answer follows
it, collapsed in a <details> block, so the learner sees the output before the answer; the chapter's assertion of
the claim sits in a cell after the answer. Every other task carries its collapsed answer in its own cell or in the
markdown cell right after it.

A "predict the paper" task opens a recorded paper comparison: the learner writes down the paper's claim (its
figure or table named) and a forecast at toy scale; the code cells that show the recorded runs follow, asserting
nothing; then the collapsed "What the seeds say, and why", which names what differs from the paper and what was
swept. Chapters keep two reading lines: the main line (markdown outside <details> blocks) holds the lesson, at
most MAIN_LINE_WORDS words; seed tables, dates, commands and derivations sit in collapsed blocks.
"""

import ast
import re
from pathlib import Path

import jupytext
import pytest

from chapter_runner import CHAPTERS

ROOT = Path(__file__).resolve().parent.parent
PAPER = "Predict the paper."
KINDS = ("Predict, then run.", PAPER, "Explore.", "Explain the plot.", "Change one thing.", "Implement.")
SEEDS_SAY = "<details><summary>What the seeds say, and why</summary>"
MAIN_LINE_WORDS = 2500
# Predict-the-paper tasks per chapter (issue 53: each recorded paper comparison opens with one; >= 6 in chapters
# 3-6).
PAPER_TASKS = {"03_vmoe_bpr": 2, "04_limoe": 2, "05_soft_moe": 2, "06_mod": 3, "08_upcycling": 1}
DETAILS = re.compile(r"<details>.*?</details>", re.S)
ENDING = ("## Summary", "## Exercises", "## References")
CHAPTERS_BY_STEM = {chapter.stem: chapter for chapter in CHAPTERS}
ARXIV_LINK = re.compile(r"\[arXiv:(\d{4}\.\d{4,5})\]\(https://arxiv\.org/abs/\1\)")


def _cells(chapter: Path) -> list[dict]:
    return [{"type": c.cell_type, "text": c.source.strip()} for c in jupytext.read(chapter).cells]


def _kind(cell: dict) -> str | None:
    if cell["type"] != "markdown":
        return None
    return next((kind for kind in KINDS if cell["text"].startswith(f"**{kind}**")), None)


def _mid_cell_tasks(cell: dict) -> list[str]:
    """The task labels that open a paragraph of a markdown cell other than its first (outside <details>): a task
    there is neither counted nor checked, so it must start a cell of its own."""
    if cell["type"] != "markdown":
        return []
    body = DETAILS.sub("", cell["text"])
    labels = "|".join(re.escape(kind) for kind in KINDS)
    return [m.group(1) for m in re.finditer(rf"\n[ \t]*\n\*\*({labels})\*\*", body)]


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


def main_line_words(cells: list[dict]) -> int:
    """Words of the chapter's main line: its markdown prose outside <details>...</details> blocks (the closing
    "## References" list is a bibliography, not prose, and is left out); a word is a whitespace-separated run
    holding a letter or digit (table rules and bullets are not words)."""
    prose = "\n".join(DETAILS.sub("", cell["text"]) for cell in cells
                      if cell["type"] == "markdown" and not cell["text"].startswith(ENDING[-1]))
    return sum(1 for word in prose.split() if re.search(r"[^\W_]", word))


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
def test_every_task_starts_its_own_cell(chapter):
    """Issue 61, item 4: a task that opens a paragraph in the middle of a cell escapes every check above."""
    for cell in _cells(chapter):
        assert not _mid_cell_tasks(cell), \
            f"{chapter.stem}: {_mid_cell_tasks(cell)} mid-cell in {cell['text'][:70]!r}: start the task's own cell"


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
def test_predict_the_paper_shows_the_recorded_runs_then_what_the_seeds_say(chapter):
    cells = _cells(chapter)
    for i, cell in enumerate(cells):
        if _kind(cell) != PAPER:
            continue
        where = f"{chapter.stem}, the task {cell['text'][:70]!r}"
        assert re.search(r"\b(Figs?\.|Table|App\.) ?[A-Z]?\d", cell["text"]), f"{where}: name the paper's figure or table"
        j = i + 1
        while j < len(cells) and cells[j]["type"] == "code":
            assert not _asserts(cells[j]["text"]), f"{where}: a cell showing the recorded runs asserts the outcome"
            j += 1
        assert j > i + 1, f"{where}: no code cell shows the recorded runs after it"
        answer = cells[j]["text"] if j < len(cells) else ""
        assert answer.startswith(SEEDS_SAY) and "</details>" in answer, \
            f"{where}: the recorded runs must be followed by a collapsed {SEEDS_SAY!r}"
        body = answer[:answer.index("</details>")]
        assert "swept" in body and "steps" in body, f"{where}: say what was swept and how the steps differ"


@pytest.mark.parametrize("chapter", [CHAPTERS_BY_STEM[stem] for stem in PAPER_TASKS], ids=list(PAPER_TASKS))
def test_recorded_paper_comparisons_open_with_predict_the_paper(chapter):
    assert sum(PAPER_TASKS.values()) >= 6
    n = _tasks(_cells(chapter))[PAPER]
    assert n >= PAPER_TASKS[chapter.stem], f"{chapter.stem}: {n} predict-the-paper tasks, expected {PAPER_TASKS[chapter.stem]}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_main_line_is_short(chapter):
    words = main_line_words(_cells(chapter))
    assert words <= MAIN_LINE_WORDS, \
        f"{chapter.stem}: {words} main-line words (markdown outside <details>), at most {MAIN_LINE_WORDS}: move " \
        "seed tables, dates, commands and derivations into collapsed blocks"


def _defines_stub(code: str) -> bool:
    """Whether a code cell defines a function whose body is only a docstring and ``raise NotImplementedError``."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef):
            body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
                return True
    return False


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_implement_tasks_run_the_learners_code(chapter):
    """Issue 61, item 2: every model chapter (01-08) has an Implement task; each hands out a stub that raises
    NotImplementedError, then a cell that puts it through ``use_yours`` (the learner's function replaces the
    library's in the cells after it once they agree), then one way to write it, collapsed."""
    cells = _cells(chapter)
    tasks = [i for i, cell in enumerate(cells) if _kind(cell) == "Implement."]
    if chapter.stem[:2] != "00":
        assert tasks, f"{chapter.stem}: no Implement task"
    for i in tasks:
        where = f"{chapter.stem}, the task {cells[i]['text'][:70]!r}"
        assert cells[i + 1]["type"] == "code" and _defines_stub(cells[i + 1]["text"]), \
            f"{where}: the next cell must hand out a function that raises NotImplementedError"
        assert cells[i + 2]["type"] == "code" and "use_yours(" in cells[i + 2]["text"], \
            f"{where}: the cell after the stub must choose the function the chapter runs with use_yours"
        answer = cells[i + 3]
        assert answer["type"] == "markdown" and answer["text"].startswith("<details>") \
            and "</details>" in answer["text"], f"{where}: one way to write it, collapsed, after the check"


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
    test_every_task_starts_its_own_cell(lesson)
    hidden = tmp_path / "95_hidden.py"
    hidden.write_text("# %% [markdown]\n# Some prose first.\n#\n# **Explain the plot.** Why?\n")
    with pytest.raises(AssertionError, match="start the task's own cell"):
        test_every_task_starts_its_own_cell(hidden)
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


def test_the_checks_count_main_line_words_and_reject_a_paper_task_without_the_seeds(tmp_path):
    lesson = tmp_path / "96_paper.py"
    lesson.write_text("# %% [markdown]\n# ## 1. Two words\n#\n# | a | b |\n# |---|---|\n\n"
                      "# %% [markdown]\n# **Predict the paper.** Fig. 7 claims more; your forecast?\n\n"
                      "# %%\nprint(1)\n\n# %% [markdown]\n# <details><summary>Answer</summary>\n#\n# Yes.\n#\n"
                      "# </details>\n")
    cells = _cells(lesson)
    assert main_line_words(cells) == 2 + 2 + 10  # heading, table cells, the task; the <details> block not counted
    with pytest.raises(AssertionError, match="What the seeds say"):
        test_predict_the_paper_shows_the_recorded_runs_then_what_the_seeds_say(lesson)
    lesson.write_text(lesson.read_text().replace("<summary>Answer</summary>", "<summary>What the seeds say, and why"
                                                 "</summary>").replace("# Yes.", "# 1,000 steps, not 90,000; we swept tau."))
    test_predict_the_paper_shows_the_recorded_runs_then_what_the_seeds_say(lesson)
    lesson.write_text(lesson.read_text().replace("Fig. 7", "the paper"))
    with pytest.raises(AssertionError, match="figure or table"):
        test_predict_the_paper_shows_the_recorded_runs_then_what_the_seeds_say(lesson)
