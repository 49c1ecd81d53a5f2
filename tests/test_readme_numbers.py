"""README's numbers about the chapters follow the chapters: where README, the website's pages (docs/*.md: the
measured results live in docs/results.md) or benchmarks/README.md say how many steps a chapter trains, that is the
chapter's ``CHAPTER_STEPS`` (issue: stale numbers -- README said 300 where chapter 4 ran 260)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "chapter 4, 260 steps", "chapter 1 (1,200 steps", "04_limoe (three models side by side, 260 steps"
MENTION = re.compile(r"(?:\bchapter (\d)|\b0(\d)_[a-z_]+)\b[^.|\n]{0,60}?\b(\d[\d,]*) steps", re.IGNORECASE)


# Where the text about the chapters' runs lives: README points to the results page, which holds the measurements.
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def chapter_steps() -> dict[int, int]:
    steps = {}
    for path in sorted((ROOT / "chapters").glob("0*.py")):
        found = re.search(r"^CHAPTER_STEPS = (\d+)", path.read_text(), re.MULTILINE)
        if found:
            steps[int(path.name[:2])] = int(found.group(1))
    return steps


def test_readme_states_each_chapters_own_training_steps():
    steps = chapter_steps()
    assert {1, 3, 4, 5} <= steps.keys(), steps
    assert (ROOT / "docs" / "results.md") in TEXTS
    mentions = [(path.relative_to(ROOT), int(m.group(1) or m.group(2)), int(m.group(3).replace(",", "")), m.group(0))
                for path in TEXTS for m in MENTION.finditer(path.read_text())]
    checked = [(path, chapter, said, text) for path, chapter, said, text in mentions if chapter in steps]
    assert len(checked) >= 3, mentions  # the pattern still finds the statements
    for path, chapter, said, text in checked:
        assert said == steps[chapter], f"{path} says {text!r}; chapter {chapter} trains {steps[chapter]} steps"
