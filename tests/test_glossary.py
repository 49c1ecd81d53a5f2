"""Every technical term a chapter uses is linked to its definition in the glossary at or before its first use.

The rule (issue 53, item 6): for each entry of docs/glossary.md, ``TERMS`` holds the pattern of its uses in a
chapter's prose. In every chapter (``chapters/NN_slug.py``, its markdown cells in order), the first link
``[text](../docs/glossary.md#term-...)`` to an entry must come at or before the entry's first use; headings,
code spans, ``$math$`` and the glossary links themselves are not uses. The chapters meet it with a collapsed
"Terms this chapter uses" list in their first cell, so later prose needs no edit; a link on a first use counts
as well. On the site such a link becomes a ``{term}`` reference (docs/_ext/course_site.py).
"""

import re
import sys
from pathlib import Path

import jupytext
import pytest

from chapter_runner import CHAPTERS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
from course_site import GLOSSARY_LINK, glossary_anchor, glossary_terms  # noqa: E402

# A pattern per glossary entry: the words a chapter uses for it (case-insensitive where the term is a word;
# acronyms keep their case). Narrower than the word where the word also has an everyday sense ("load the
# checkpoint", "dropping whole blocks").
TERMS = {
    "A-MoD": r"\bA-MoD\b",
    "all-to-all": r"(?i:\ball-to-all\b)",
    "attention routing": r"(?i:\battention rout(ing|ers?)\b)",
    "auxiliary loss": r"(?i:\bauxiliary\b)",
    "Batch Prioritized Routing (BPR)": r"\bBPR\b|(?i:\bbatch prioriti[sz]ed routing\b)",
    "buffer capacity": r"(?i:\bbuffers?\b|\bexpert capacity\b)",
    "capacity ratio": r"(?i:\bcapacity ratio\b)",
    "combine": r"(?i:\bcombine\b)",
    "contrastive loss": r"(?i:\bcontrastive\b)",
    "dispatch": r"(?i:\bdispatch(es|ed)?\b)",
    "dropped token": r"(?i:\bdrop(s|ped|ping)?\b(?! whole))",
    "entropy losses": r"(?i:\bentropy\b)",
    "expert": r"(?i:\bexperts?\b(?![- ]choice|-parallel))",
    "expert parallelism": r"(?i:\bexpert[- ]parallel(ism)?\b)",
    "expert pruning": r"(?i:\bprun(e|ed|ing)\b)",
    "Experts Choice": r"(?i:\bexperts?[- ]choice\b)",
    "FLOPs": r"\bFLOPs?\b",
    "gate": r"(?i:\bgates?\b|\bgating\b)",
    "group": r"(?i:\bgroups?\b)",
    "importance loss": r"(?i:\bimportance\b(?= (and|\+) load| loss)|(?<=\*\*)importance(?=\*\*))",
    "isoFLOP": r"(?i:\bisoFLOP\b)",
    "leave-one-out importance": r"(?i:\bleave-one-out\b)",
    "LIMoE": r"\bLIMoE\b",
    "load loss": r"(?i:(?<=importance and )load\b|(?<=importance \+ )load\b|\bload loss(es)?\b|(?<=\*\*)load(?=\*\*))",
    "mesh": r"(?i:\bmesh(es)?\b)",
    "mixture of experts": r"(?i:\bmixtures?[- ]of[- ]experts\b)",
    "MoD": r"(?<![-\w])MoD\b|(?i:\bmixture-of-depths\b)",
    "MoE layer": r"(?i:\bMoE layers?\b)",
    "one tower": r"(?i:\bone[- ]tower\b)",
    "patch": r"(?i:\bpatch(es)?\b)",
    "priority": r"(?i:\bpriorit(y|ies)\b)",
    "recall@k": r"(?i:\brecall@)",
    "router": r"(?i:\brouters?\b)",
    "slot": r"(?i:\bslots?\b)",
    "Soft MoE": r"\bSoft MoE\b",
    "standard routing": r"(?i:\bstandard rout(ing|ers?)\b)",
    "success rate": r"(?i:\bsuccess rates?\b)",
    "token": r"(?i:\btokens?\b(?![- ]choice))",
    "TOP-k": r"(?i:\btop[- ]?k\b)",
    "Tokens Choice": r"(?i:\btokens?[- ]choice\b)",
    "upcycling": r"(?i:\bupcycl\w*)",
    "V-MoE": r"\bV-MoE\b",
    "vanilla routing": r"(?i:\bvanilla\b)",
    "z-loss": r"(?i:\bz-loss\b)",
    "zero-shot accuracy": r"(?i:\bzero-shot\b)",
}
NOT_USES = [re.compile(r"`[^`]*`"), re.compile(r"\$[^$]*\$"), GLOSSARY_LINK]


def _blank(pattern: re.Pattern, line: str) -> str:
    return pattern.sub(lambda m: " " * len(m[0]), line)


def first_links_and_uses(chapter: Path) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """The position (cell, line, column) of each glossary anchor's first link, and of each TERMS entry's first
    use, in the chapter's markdown cells."""
    links, uses = {}, {}
    patterns = {glossary_anchor(name): re.compile(pattern) for name, pattern in TERMS.items()}
    for c, cell in enumerate(jupytext.read(chapter).cells):
        if cell.cell_type != "markdown":
            continue
        for n, line in enumerate(cell.source.splitlines()):
            for link in GLOSSARY_LINK.finditer(line):
                links.setdefault(link[2], (c, n, link.start()))
            if line.lstrip().startswith("#"):
                continue
            for pattern in NOT_USES:
                line = _blank(pattern, line)
            for anchor, pattern in patterns.items():
                if anchor not in uses and (use := pattern.search(line)):
                    uses[anchor] = (c, n, use.start())
    return links, uses


def test_every_glossary_entry_has_a_pattern_and_no_pattern_lacks_an_entry():
    assert sorted(glossary_terms().values(), key=str.lower) == sorted(TERMS, key=str.lower)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_each_term_is_linked_to_the_glossary_at_or_before_its_first_use(chapter):
    links, uses = first_links_and_uses(chapter)
    defined = glossary_terms()
    assert set(links) <= set(defined), f"links to no glossary entry: {sorted(set(links) - set(defined))}"
    late = [f"{defined[anchor]!r}: first used in cell {use[0]}, line {use[1] + 1}"
            + (f", first linked in cell {links[anchor][0]}" if anchor in links else ", never linked")
            for anchor, use in uses.items() if anchor not in links or links[anchor] > use]
    assert not late, (f"{chapter.name}: link each term to docs/glossary.md at or before its first use (the first "
                      "cell's 'Terms this chapter uses'):\n" + "\n".join(late))


def test_the_rule_sees_uses_and_links(tmp_path):
    """The checker itself: a use before any link fails; a link in the first cell covers later uses; code spans
    and headings are not uses."""
    text = ("# %% [markdown]\n# # Routers\n#\n# Terms: [router](../docs/glossary.md#term-router)\n\n"
            "# %% [markdown]\n# The router picks the `slots`; each token waits.\n")
    path = tmp_path / "99_probe.py"
    path.write_text(text)
    links, uses = first_links_and_uses(path)
    assert links == {"term-router": (0, 2, 7)}
    assert uses["term-router"] == (1, 0, 4) and "term-slot" not in uses and uses["term-token"][0] == 1
