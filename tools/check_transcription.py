"""Is any exercise answer written out in a chapter? (issue 45: exercises that are not copying)

For every function an exercise asks for (a top-level ``def`` in ``solutions/NN_slug.py`` whose body holds
``### BEGIN SOLUTION``), the solution's body is compared with every run of consecutive statements in every
chapter (``chapters/*.py``: module level, and inside every function, loop, branch and ``with`` block):

- both are normalised first: parsed with ``ast``, docstrings dropped (comments never reach the AST),
  every variable, argument and function name replaced by one placeholder (builtins such as ``range`` and
  ``len``, attribute names such as ``.sum`` and ``.shape``, keywords, operators and constants stay), then
  unparsed and tokenised;
- the answer counts as TRANSCRIBED when an equal normalised body appears (ratio 1.0), or when a run of
  chapter statements of comparable length (half to twice the tokens) is a near-identical token sequence:
  ``difflib.SequenceMatcher(...).ratio() >= THRESHOLD``.

Prints one line per exercise function (its best match, the ratio and where) and a final count; exits 1
when any function is transcribed, 0 otherwise. ``--solutions`` and ``--chapters`` take other files (the
tests feed it a transcribed function). Run: ``python tools/check_transcription.py``.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 0.72  # 2 * LCS / total length at or above which a body counts as transcribed (see Calibration)
MIN_TOKENS = 25  # shorter bodies count only when equal
KEPT_NAMES = frozenset(dir(builtins))  # range, len, int, max, sorted, ...: part of what the code does
PLACEHOLDER = "v"
MARKER = "### BEGIN SOLUTION"


class _Normalise(ast.NodeTransformer):
    """Every non-builtin name, argument and nested function name becomes PLACEHOLDER; docstrings go."""

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=node.id if node.id in KEPT_NAMES else PLACEHOLDER, ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = PLACEHOLDER, None
        return node

    def _body(self, node):
        node.body = _without_docstring(node.body)
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node):
        node.name, node.returns = PLACEHOLDER, None
        return self._body(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.name = PLACEHOLDER
        return self._body(node)


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


def tokens(statements: list[ast.stmt]) -> tuple[str, ...]:
    """The normalised token sequence of ``statements`` (see the module docstring)."""
    module = ast.Module(body=[_Normalise().visit(ast.parse(ast.unparse(s)).body[0]) for s in statements],
                        type_ignores=[])
    text = ast.unparse(ast.fix_missing_locations(module))
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}
    out = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in skip:
            if token.type in (tokenize.INDENT, tokenize.DEDENT):
                out.append(tokenize.tok_name[token.type])  # nesting is structure
            continue
        out.append(token.string)
    return tuple(out)


@dataclass(frozen=True)
class Answer:
    """One function an exercise asks for: where it is and its normalised body."""

    name: str
    where: str
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    answer: Answer
    ratio: float
    where: str  # the best-matching chapter statements, "file:line"

    @property
    def transcribed(self) -> bool:
        return self.ratio >= 1.0 or (len(self.answer.tokens) >= MIN_TOKENS and self.ratio >= THRESHOLD)


def answers(solution: Path) -> list[Answer]:
    """The exercise functions of one solution file: top-level defs whose source holds MARKER."""
    text = solution.read_text()
    found = []
    for node in ast.parse(text).body:
        is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if is_function and MARKER in (ast.get_source_segment(text, node) or ""):
            found.append(Answer(node.name, f"{solution.name}:{node.lineno}", tokens(_without_docstring(node.body))))
    return found


def _blocks(tree: ast.AST):
    """Every statement list in ``tree``: the module's, and every body/orelse/finalbody/handler inside."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield _without_docstring(block) if field == "body" else block
        for handler in getattr(node, "handlers", ()):
            yield handler.body


def runs(chapter: Path, longest: int) -> list[tuple[str, tuple[str, ...]]]:
    """(``file:line``, normalised tokens) for every run of consecutive statements of every block of
    ``chapter`` of at most ``longest`` tokens."""
    tree = ast.parse(chapter.read_text())
    found = []
    for block in _blocks(tree):
        statement_tokens = [tokens([s]) for s in block]
        for start in range(len(block)):
            run: tuple[str, ...] = ()
            for stop in range(start, len(block)):
                run = run + statement_tokens[stop]
                if len(run) > longest:
                    break
                found.append((f"{chapter.name}:{block[start].lineno}", run))
    return found


def judge(answer: Answer, chapter_runs: list[tuple[str, tuple[str, ...]]]) -> Verdict:
    """The best match of ``answer`` among ``chapter_runs`` (runs of half to twice its length)."""
    from rapidfuzz.distance import Indel

    best = Verdict(answer, 0.0, "-")
    size = len(answer.tokens)
    for where, run in chapter_runs:
        if size / 2 <= len(run) <= 2 * size:
            ratio = Indel.normalized_similarity(answer.tokens, run, score_cutoff=best.ratio)
            if ratio > best.ratio:
                best = Verdict(answer, ratio, where)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", nargs="+", type=Path, help="solution files (default: solutions/NN_*.py)",
                        default=sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")))
    parser.add_argument("--chapters", nargs="+", type=Path, help="chapter files (default: chapters/NN_*.py)",
                        default=sorted((ROOT / "chapters").glob("[0-9][0-9]_*.py")))
    args = parser.parse_args(argv)
    asked = [answer for solution in args.solutions for answer in answers(solution)]
    longest = 2 * max((len(answer.tokens) for answer in asked), default=0)
    chapter_runs = [run for chapter in args.chapters for run in runs(chapter, longest)]
    verdicts = [judge(answer, chapter_runs) for answer in asked]
    for verdict in verdicts:
        state = "TRANSCRIBED" if verdict.transcribed else "own"
        print(f"{state:11s} {verdict.answer.where:24s} {verdict.answer.name:24s} "
              f"best match {verdict.ratio:.2f} at {verdict.where} ({len(verdict.answer.tokens)} tokens)")
    count = sum(v.transcribed for v in verdicts)
    print(f"{count} of {len(verdicts)} exercise functions transcribed (ratio >= {THRESHOLD}, or an equal body "
          f"under {MIN_TOKENS} tokens)")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
