"""The checks file the grading sandbox gets: what draws the inputs and calls the answers, never the references.

An assignment's checks file (``solutions/checks/NN_slug.py``) holds both halves of every ``Check``: ``cases``
and ``call``, which run in the sandbox, and ``reference``, which runs only in the grader. ``inputs_only``
writes the sandbox's version of it: every ``Check(...)`` gets ``reference=None``, and the module's functions
and classes that ``CHECKS`` no longer reaches -- the references and the helpers only they use -- are left
out, so an answer cannot call the grader's own code (Python's ``ast``: the file is parsed, never run, here).

A checks file may also name packages the sandbox must not offer at all, ``SANDBOX_WITHOUT = ("jax", ...)``:
where an assignment asks for what a library primitive does (an ``all_to_all`` written in NumPy, say, whose
reference is ``jax.lax.all_to_all``), the primitive is not in the file system the answer runs in, so calling it cannot
answer the check (``hidden_packages``; the sandbox hides their folders under an empty tmpfs).
"""

from __future__ import annotations

import ast
from pathlib import Path

HIDE_NAME = "SANDBOX_WITHOUT"


def _checks_node(tree: ast.Module, path) -> ast.Assign:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CHECKS" for t in node.targets):
            return node
    raise ValueError(f"{path} must define CHECKS = {{grade_id: Check(...)}} at module level")


def inputs_only(source: str, path: str = "<checks>") -> str:
    """The sandbox's version of a checks file's ``source`` (see the module docstring), as Python source.
    Raises ValueError (naming ``path``) when it defines no module-level CHECKS."""
    tree = ast.parse(source, filename=str(path))
    checks = _checks_node(tree, path)
    for node in ast.walk(checks):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Check":
            if len(node.args) > 1:
                node.args[1] = ast.Constant(None)
            for keyword in node.keywords:
                if keyword.arg == "reference":
                    keyword.value = ast.Constant(None)
    definitions = {node.name: node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    needed, pending = set(), [checks]
    while pending:
        for node in ast.walk(pending.pop()):
            if isinstance(node, ast.Name) and node.id in definitions and node.id not in needed:
                needed.add(node.id)
                pending.append(definitions[node.id])
    tree.body = [node for node in tree.body if node is checks or getattr(node, "name", None) not in definitions
                 or node.name in needed]
    return ast.unparse(tree) + "\n"


def hidden_packages(path: str | Path) -> tuple[str, ...]:
    """The top-level package names a checks file lists in ``SANDBOX_WITHOUT`` (a tuple or list of strings;
    () when absent). Read from the file's syntax tree, not run. Raises ValueError naming the file for another
    value."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == HIDE_NAME for t in node.targets):
            try:
                names = ast.literal_eval(node.value)
            except ValueError:
                names = None
            if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n.isidentifier() for n in names):
                raise ValueError(f"{path}: {HIDE_NAME} must be a tuple of package names, e.g. ('jax', 'jaxlib')")
            return tuple(names)
    return ()
