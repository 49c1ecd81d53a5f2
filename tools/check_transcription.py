"""Is any exercise answer written out in a chapter? (issue 45: exercises that are not copying; issue 53:
one-liners and formulas too)

For every function an exercise asks for (a top-level ``def`` in ``solutions/NN_slug.py`` whose body holds
``### BEGIN SOLUTION``), two comparisons are made with every chapter (``chapters/*.py``).

Bodies: the solution's body is compared with every run of consecutive statements of the chapter (module
level, and inside every function, loop, branch and ``with`` block):

- both are normalised first: parsed with ``ast``, docstrings dropped (comments never reach the AST),
  every variable, argument and function name replaced by one placeholder (builtins such as ``range`` and
  ``len``, attribute names such as ``.sum`` and ``.shape``, keywords, operators and constants stay), then
  unparsed and tokenised;
- the answer counts as TRANSCRIBED when an equal normalised body appears (ratio 1.0), or when a run of
  chapter statements of comparable length (half to twice the tokens) is a near-identical token sequence:
  ``2 * LCS / (length of both) >= THRESHOLD`` (the normalised Indel similarity; ``similarity``).

Expressions (a formula written as a one-liner, or in the prose): what the answer returns, of at least
MIN_EXPRESSION_TOKENS normalised tokens -- each returned value and each item of a returned tuple, also with
the names the function assigns once replaced by their values, one level at a time (so ``return 2 * (n - 1) *
block * size`` after ``block = g * (E // n) * B * D`` is also ``2 * (n - 1) * (g * (E // n) * B * D) *
size``) -- is compared with every expression a chapter writes: the value of every expression statement,
assignment and ``return``, and every formula in its markdown, a span in backticks that parses as a Python
expression or assignment (``bytes = 2 * (n - 1) * g * (E / n) * B * D * 4``). They are normalised as bodies
are, and further: a data attribute (``config.width``, ``model.proj.bias``: not called, not an array attribute
such as ``.shape``) becomes one placeholder, and ``x[...]`` (reading a parameter) becomes ``x``. An answer
counts as TRANSCRIBED when such a pair of comparable length (half to twice the tokens) is near-identical:
similarity ``>= EXPRESSION_THRESHOLD``.

Calibration. THRESHOLD is the one issue 45 set (the same similarity, then computed by rapidfuzz). On the
chapters as issue 53 found them, the four answers written out as one-liners or formulas (01's patch
embedding, 02's TOP-k selection, 07's all-to-all and its bytes formula) scored 0.82 to 0.93 as expressions;
the highest pair that is no transcription scored 0.77 (02's skip-patch count ``max(1, floor(S * N + 0.5))``
against ``expert_capacity``: the same rounding, another formula), hence EXPRESSION_THRESHOLD = 0.8.

Standard library only (``ast``, ``tokenize``): it runs with the base install. Prints one line
per exercise function (its best body match and best expression match, the ratios and where) and a final
count; exits 1 when any function is transcribed, 0 otherwise. ``--solutions`` and ``--chapters`` take other
files (the tests feed it transcribed functions). Run: ``python tools/check_transcription.py``.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import io
import re
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
EXPRESSION_THRESHOLD = 0.8  # for expressions (see Calibration)
MIN_EXPRESSION_TOKENS = 18  # shorter ones are idioms (``np.zeros((n, n), int)``, a stable argsort), not formulas
ARRAY_ATTRIBUTES = frozenset({"shape", "T", "ndim", "size", "dtype", "real", "imag"})  # stay in expressions
BACKTICKS = re.compile(r"`([^`\n]+)`")


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


class _NormaliseExpression(_Normalise):
    """_Normalise, and a data attribute becomes PLACEHOLDER and ``x[...]`` becomes ``x`` (module docstring)."""

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute):  # a method keeps its name: ``.reshape``, ``.argsort``
            node.func.value = self.visit(node.func.value)
        else:
            node.func = self.visit(node.func)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        return node

    def visit_Attribute(self, node):
        if node.attr in ARRAY_ATTRIBUTES:
            return self.generic_visit(node)
        return ast.copy_location(ast.Name(id=PLACEHOLDER, ctx=ast.Load()), node)

    def visit_Subscript(self, node):
        if isinstance(node.slice, ast.Constant) and node.slice.value is Ellipsis:
            return self.visit(node.value)
        return self.generic_visit(node)


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


def _token_strings(text: str) -> tuple[str, ...]:
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}
    out = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in skip:
            if token.type in (tokenize.INDENT, tokenize.DEDENT):
                out.append(tokenize.tok_name[token.type])  # nesting is structure
            continue
        out.append(token.string)
    return tuple(out)


def tokens(statements: list[ast.stmt]) -> tuple[str, ...]:
    """The normalised token sequence of ``statements`` (see the module docstring)."""
    module = ast.Module(body=[_Normalise().visit(ast.parse(ast.unparse(s)).body[0]) for s in statements],
                        type_ignores=[])
    return _token_strings(ast.unparse(ast.fix_missing_locations(module)))


def expression_tokens(expression: ast.expr) -> tuple[str, ...]:
    """The normalised token sequence of one expression (see the module docstring: data attributes go too);
    empty for a part that is no expression on its own (a slice, ``a:b``)."""
    try:
        copy = ast.parse(ast.unparse(expression), mode="eval").body
    except SyntaxError:
        return ()
    return _token_strings(ast.unparse(ast.fix_missing_locations(_NormaliseExpression().visit(copy))))


@dataclass(frozen=True)
class Answer:
    """One function an exercise asks for: where it is, its normalised body and its expressions' tokens."""

    name: str
    where: str
    tokens: tuple[str, ...]
    expressions: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Verdict:
    answer: Answer
    ratio: float
    where: str  # the best-matching chapter statements, "file:line"
    expression_ratio: float = 0.0
    expression_where: str = "-"

    @property
    def transcribed(self) -> bool:
        return (self.ratio >= 1.0 or (len(self.answer.tokens) >= MIN_TOKENS and self.ratio >= THRESHOLD)
                or self.expression_ratio >= EXPRESSION_THRESHOLD)


class _Inline(ast.NodeTransformer):
    """Replace every name of ``values`` by (a copy of) its value expression."""

    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return ast.parse(ast.unparse(self.values[node.id]), mode="eval").body
        return node


def answer_expressions(function: ast.FunctionDef) -> tuple[tuple[str, ...], ...]:
    """The token sequences of what the answer returns, of at least MIN_EXPRESSION_TOKENS tokens (module
    docstring): every returned value (each item of a returned tuple on its own too), then the same with the
    names the function assigns once inlined, one level after another until nothing changes (at most 4)."""
    assigned: dict[str, list[ast.expr]] = {}
    returned = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
        elif isinstance(node, ast.Return) and node.value is not None:
            returned += [node.value, *(node.value.elts if isinstance(node.value, ast.Tuple) else ())]
    once = {name: values[0] for name, values in assigned.items() if len(values) == 1}
    found = []
    for value in returned:
        found.append(value)
        for _ in range(4):
            inlined = _Inline(once).visit(ast.parse(ast.unparse(value), mode="eval").body)
            if ast.dump(inlined) == ast.dump(value):
                break
            found.append(inlined)
            value = inlined
    kept = {expression_tokens(node) for node in found}
    return tuple(sorted(t for t in kept if len(t) >= MIN_EXPRESSION_TOKENS))


def answers(solution: Path) -> list[Answer]:
    """The exercise functions of one solution file: top-level defs whose source holds MARKER."""
    text = solution.read_text()
    found = []
    for node in ast.parse(text).body:
        is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if is_function and MARKER in (ast.get_source_segment(text, node) or ""):
            found.append(Answer(node.name, f"{solution.name}:{node.lineno}", tokens(_without_docstring(node.body)),
                                answer_expressions(node)))
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


def _prose_formulas(text: str) -> list[tuple[int, ast.expr]]:
    """(line, expression) of every span in backticks in the chapter's comment lines (its markdown) that parses
    as a Python expression or assignment; an assignment gives its value."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.lstrip().startswith("#"):
            continue
        for span in BACKTICKS.findall(line):
            try:
                statement = ast.parse(span.strip()).body
            except (SyntaxError, ValueError):
                continue
            if len(statement) == 1 and isinstance(statement[0], (ast.Expr, ast.Assign)):
                found.append((number, statement[0].value))
    return found


def chapter_expressions(chapter: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(``file:line``, normalised tokens) of every expression the chapter writes, of at least
    MIN_EXPRESSION_TOKENS tokens: the values of its expression statements, assignments and returns, and the
    formulas of its markdown (module docstring)."""
    text = chapter.read_text()
    found = [(node.lineno, node.value) for node in ast.walk(ast.parse(text))
             if isinstance(node, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return))
             and isinstance(node.value, ast.expr)]
    tokenised = [(f"{chapter.name}:{line}", expression_tokens(value)) for line, value in found + _prose_formulas(text)]
    return [(where, sequence) for where, sequence in tokenised if len(sequence) >= MIN_EXPRESSION_TOKENS]


def similarity(wanted: tuple[str, ...]):
    """``ratio(other)``: ``2 * LCS / (len(wanted) + len(other))`` of token sequences, the normalised Indel
    similarity (difflib's ``ratio`` approximates it from matching blocks), with the longest common subsequence
    computed bit-parallel over Python integers (Hyyro 2004: one addition per token of ``other``)."""
    masks: dict[str, int] = {}
    for position, token in enumerate(wanted):
        masks[token] = masks.get(token, 0) | 1 << position
    size, ones = len(wanted), (1 << len(wanted)) - 1

    def ratio(other: tuple[str, ...]) -> float:
        row = ones
        for token in other:
            matched = row & masks.get(token, 0)
            row = ((row + matched) | (row - matched)) & ones
        common = size - row.bit_count()
        return 2 * common / (size + len(other)) if size + len(other) else 0.0

    return ratio


def _best(wanted: tuple[str, ...], candidates, best: tuple[float, str]) -> tuple[float, str]:
    """The best (ratio, where) of ``wanted`` against ``candidates`` ((where, tokens) of half to twice its
    length; ``similarity``), starting from ``best``."""
    ratio, size = similarity(wanted), len(wanted)
    for where, sequence in candidates:
        if size / 2 <= len(sequence) <= 2 * size and 2 * min(size, len(sequence)) / (size + len(sequence)) > best[0]:
            found = ratio(sequence)
            if found > best[0]:
                best = (found, where)
    return best


def judge(answer: Answer, chapter_runs: list[tuple[str, tuple[str, ...]]],
          expressions: list[tuple[str, tuple[str, ...]]] = ()) -> Verdict:
    """The best match of ``answer``'s body among ``chapter_runs`` and of its expressions among the chapters'
    ``expressions`` (each among candidates of half to twice its length)."""
    ratio, where = _best(answer.tokens, chapter_runs, (0.0, "-"))
    expression = (0.0, "-")
    for wanted in answer.expressions:
        expression = _best(wanted, expressions, expression)
    return Verdict(answer, ratio, where, *expression)


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
    expressions = sorted({item for chapter in args.chapters for item in chapter_expressions(chapter)})
    verdicts = [judge(answer, chapter_runs, expressions) for answer in asked]
    for verdict in verdicts:
        state = "TRANSCRIBED" if verdict.transcribed else "own"
        print(f"{state:11s} {verdict.answer.where:24s} {verdict.answer.name:24s} "
              f"body {verdict.ratio:.2f} at {verdict.where} ({len(verdict.answer.tokens)} tokens); "
              f"expression {verdict.expression_ratio:.2f} at {verdict.expression_where}")
    count = sum(v.transcribed for v in verdicts)
    print(f"{count} of {len(verdicts)} exercise functions transcribed (body ratio >= {THRESHOLD}, or an equal "
          f"body under {MIN_TOKENS} tokens; expression ratio >= {EXPRESSION_THRESHOLD})")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
