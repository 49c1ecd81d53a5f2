"""The architecture diagrams (tools/draw_diagrams.py, docs/_static/diagrams/NN_slug.svg) are well-formed SVG, say
what a fresh drawing says, and sit at the top of their chapters with a link to the routers page.

Text is compared rather than bytes: matplotlib versions format path data differently, the labels are what a
reader reads (``python tools/draw_diagrams.py --check`` compares bytes with the installed matplotlib).
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jupytext
import pytest

from chapter_runner import CHAPTERS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import draw_diagrams  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def _labels(svg_text: str) -> list[str]:
    root = ET.fromstring(svg_text)
    assert root.tag == f"{SVG}svg" and root.get("viewBox"), "not an SVG document with a viewBox"
    return sorted("".join(node.itertext()).strip() for node in root.iter(f"{SVG}text"))


@pytest.mark.parametrize("name", sorted(draw_diagrams.DIAGRAMS))
def test_a_committed_diagram_says_what_a_fresh_drawing_says(name):
    committed = (draw_diagrams.OUT / f"{name}.svg").read_text(encoding="utf-8")
    labels = _labels(committed)
    assert len(labels) >= 15, labels
    assert labels == _labels(draw_diagrams.render(name)), f"run: python tools/draw_diagrams.py ({name})"


def test_every_diagram_file_is_drawn_by_the_script():
    assert sorted(p.stem for p in draw_diagrams.OUT.glob("*.svg")) == sorted(draw_diagrams.DIAGRAMS)


def test_an_unknown_diagram_name_is_refused():
    with pytest.raises(ValueError, match="diagram name '09_x': allowed are"):
        draw_diagrams.render("09_x")


@pytest.mark.parametrize("name", sorted(draw_diagrams.DIAGRAMS))
def test_a_chapter_shows_its_diagram_and_links_the_routers_page_in_its_first_cell(name):
    chapter = next((c for c in CHAPTERS if c.stem[:2] == name[:2]), None)
    if chapter is None:
        pytest.skip(f"no chapter {name[:2]} yet")
    first = next(c for c in jupytext.read(chapter).cells if c.cell_type == "markdown").source
    assert f"](../docs/_static/diagrams/{name}.svg)" in first, f"{chapter.name}: first cell lacks ![...]({name}.svg)"
    assert "](../docs/routers.md)" in first, f"{chapter.name}: first cell lacks a link to the routers page"
