"""Which glossary terms a chapter uses, and whether each is linked to docs/glossary.md at or before its first use.

The rule (issue 53, item 6; enforced by tests/test_glossary.py): for each entry of docs/glossary.md, ``TERMS``
holds the pattern of its uses in a chapter's prose. In a chapter (``chapters/NN_slug.py``, its markdown cells in
order), the first link ``[text](../docs/glossary.md#term-...)`` to an entry must come at or before the entry's
first use; headings, code spans, ``$math$`` and the glossary links themselves are not uses. The chapters meet
it with a collapsed "Terms this chapter uses" list in their first cell (a link on a first use counts as well).
On the site such a link becomes a ``{term}`` reference (docs/_ext/course_site.py).

Run: ``python tools/glossary_links.py [CHAPTER ...]`` lists, per chapter (default: all), the terms used before
they are linked, and prints the collapsed list of every term the chapter uses, ready to paste under its title;
exit 1 when a term is late.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
from course_site import GLOSSARY_LINK, glossary_anchor, glossary_terms  # noqa: E402

SUMMARY = "Terms this chapter uses, each linked to its definition"

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
    "entropy losses": r"(?i:(?<!importance )\bentropy\b)",  # importance entropy: a measure (chapter 8), no loss
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


def late_terms(chapter: Path) -> list[str]:
    """One line per glossary term the chapter uses before (or without) linking it; raises ValueError for a link
    to an anchor the glossary does not define."""
    links, uses = first_links_and_uses(chapter)
    defined = glossary_terms()
    if unknown := sorted(set(links) - set(defined)):
        raise ValueError(f"{chapter.name}: glossary links to no entry: {unknown}; entries: docs/glossary.md")
    return [f"{defined[anchor]!r}: first used in cell {use[0]}, line {use[1] + 1}"
            + (f", first linked in cell {links[anchor][0]}" if anchor in links else ", never linked")
            for anchor, use in uses.items() if anchor not in links or links[anchor] > use]


def terms_block(chapter: Path, width: int = 118) -> str:
    """The collapsed list of every glossary term the chapter uses (alphabetical), as py:percent comment lines."""
    defined = glossary_terms()
    anchors = sorted(first_links_and_uses(chapter)[1], key=lambda anchor: defined[anchor].lower())
    units = [f"[{defined[a]}](../docs/glossary.md#{a})" + ("," if i < len(anchors) - 1 else ".")
             for i, a in enumerate(anchors)]
    lines, line = ["#", f"# <details><summary>{SUMMARY}</summary>", "#"], "#"
    for unit in units:
        if len(line) + 1 + len(unit) > width and line != "#":
            lines.append(line)
            line = "#"
        line += " " + unit
    return "\n".join(lines + [line, "#", "# </details>"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path,
                        default=sorted((ROOT / "chapters").glob("[0-9][0-9]_*.py")))
    args = parser.parse_args(argv)
    late_anywhere = False
    for chapter in args.chapters:
        late = late_terms(chapter)
        late_anywhere |= bool(late)
        print(f"{chapter.name}: {len(late)} term(s) used before a link to the glossary")
        for line in late:
            print(f"  {line}")
        if late:
            print(f"  the list for its first cell, under the title:\n{terms_block(chapter)}")
    return 1 if late_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
