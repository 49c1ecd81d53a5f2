"""The pages a learner meets before the chapters -- README's opening (the part the website's front page includes)
and the routers page, which the first cell of chapters 2-6 and 8 links -- state what each paper claims and where
the course tests it, never what the recorded runs found: the chapters ask for a forecast of those outcomes first
("Predict the paper."), and docs/results.md holds them for after the tasks."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A measured outcome: an accuracy, a spread, a points gap, a seed count with a result, or a verdict on the claim.
OUTCOME = re.compile(r"\b0\.\d{3}\b|±|\bpoints? of\b|\+\d+(?:\.\d+)? points|\bseeds? \d+-\d+\b|\bon \w+ seeds of\b|"
                     r"\ba tie\b|\bties? with\b|\b(?:does not |did not |not )?reproduc(?:e|es|ed)\b|"
                     r"\bthis course measured\b|\bthe toy runs show\b", re.IGNORECASE)


def _readme_opening() -> str:
    text = (ROOT / "README.md").read_text()
    return text[:text.index("## The two commands")]


def _chapter_table() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## The chapters"):text.index("### Opening a chapter")]


@pytest.mark.parametrize("name, text", [("README.md opening", _readme_opening()),
                                        ("README.md chapter table", _chapter_table()),
                                        ("docs/routers.md", (ROOT / "docs" / "routers.md").read_text())])
def test_no_measured_outcome_before_the_chapters(name, text):
    found = sorted({match.group(0) for match in OUTCOME.finditer(text)})
    assert not found, f"{name} states measured outcomes a chapter asks the learner to forecast: {found}"


def test_the_results_page_is_named_as_the_place_for_them():
    assert "](docs/results.md)" in _readme_opening()
    assert "](results.md)" in (ROOT / "docs" / "routers.md").read_text()
