"""Every technical term a chapter uses is linked to its definition in the glossary at or before its first use.

The rule and the patterns it reads are in tools/glossary_links.py (``python tools/glossary_links.py CHAPTER``
prints what to add to a chapter that fails here).
"""

import sys
from pathlib import Path

import pytest

from chapter_runner import CHAPTERS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from glossary_links import TERMS, first_links_and_uses, glossary_terms, late_terms, terms_block  # noqa: E402


def test_every_glossary_entry_has_a_pattern_and_no_pattern_lacks_an_entry():
    assert sorted(glossary_terms().values(), key=str.lower) == sorted(TERMS, key=str.lower)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_each_term_is_linked_to_the_glossary_at_or_before_its_first_use(chapter):
    late = late_terms(chapter)
    assert not late, (f"{chapter.name}: link each term to docs/glossary.md at or before its first use; "
                      f"python tools/glossary_links.py {chapter.relative_to(ROOT)} prints the list for its first "
                      "cell:\n" + "\n".join(late))


def test_the_rule_sees_uses_and_links(tmp_path):
    """The checker itself: a use before any link fails; a link in the first cell covers later uses; code spans
    and headings are not uses; a link to no entry is refused; the list to paste names every term used."""
    text = ("# %% [markdown]\n# # Routers\n#\n# Terms: [router](../docs/glossary.md#term-router)\n\n"
            "# %% [markdown]\n# The router picks the `slots`; each token waits.\n")
    path = tmp_path / "99_probe.py"
    path.write_text(text)
    links, uses = first_links_and_uses(path)
    assert links == {"term-router": (0, 2, 7)}
    assert uses["term-router"] == (1, 0, 4) and "term-slot" not in uses and uses["term-token"][0] == 1
    assert [line.split(":")[0] for line in late_terms(path)] == ["'token'"]
    block = terms_block(path)
    assert "[router](../docs/glossary.md#term-router), [token](../docs/glossary.md#term-token)." in block
    path.write_text(text.replace("#term-router", "#term-routr"))
    with pytest.raises(ValueError, match="glossary links to no entry: \\['term-routr'\\]"):
        late_terms(path)
