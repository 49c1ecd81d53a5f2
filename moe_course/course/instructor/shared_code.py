"""Code two functions share, compared as syntax: what the release check uses to refuse a sandbox helper that
carries the computation of a graded function (``build.check_no_cross_answers``).

Each function is reduced to normalised prints (``ast.dump`` after normalising): its body as a whole, and every
expression in it of at least MIN_NODES syntax nodes. Normalising drops docstrings and type annotations and
renames every name the function binds (its parameters and every name it assigns, loops over, imports or
defines) to ``_0``, ``_1``, ... in order of first appearance -- per print, so that an expression matches
whatever its variables are called and wherever it stands; names it does not bind (``np``, builtins) and
constants are kept. Two functions share code when a print of one is a print of the other: a helper that
renames ``shifted`` to ``z``, reorders its statements or wraps the routing in other code still shows
``np.argsort(-_0, axis=-1, kind='stable')`` and ``np.take_along_axis(_0, _1, axis=-1)``.
"""

from __future__ import annotations

import ast
import copy

# `np.argsort(-p, axis=-1, kind='stable')` has 10 nodes, `x.max(axis=-1, keepdims=True)` 8, `h // p * (w // p)` 7
MIN_NODES = 10
Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_NOT_COUNTED = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def size(node: ast.AST) -> int:
    """The syntax nodes of ``node`` and below; contexts (load, store) and operators are not counted."""
    return sum(not isinstance(child, _NOT_COUNTED) for child in ast.walk(node))


def bound_names(function: ast.AST) -> set[str]:
    """The names ``function`` binds: parameters, assignment and loop targets, imports, nested definitions."""
    arguments = function.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def normalised(node: ast.AST, bound: set[str]) -> str:
    """``ast.dump`` of a copy of ``node`` with the ``bound`` names renamed ``_0``, ``_1``, ... in order of
    first appearance, and docstrings and annotations dropped."""
    node = copy.deepcopy(node)
    order: dict[str, str] = {}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id in bound:
            child.id = order.setdefault(child.id, f"_{len(order)}")
        elif isinstance(child, ast.arg):
            child.arg = order.setdefault(child.arg, f"_{len(order)}") if child.arg in bound else child.arg
            child.annotation = None
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            child.returns = None
            if child.body and isinstance(child.body[0], ast.Expr) and isinstance(child.body[0].value, ast.Constant) \
                    and isinstance(child.body[0].value.value, str):
                child.body = child.body[1:] or [ast.Pass()]
        elif isinstance(child, ast.AnnAssign):
            child.annotation = ast.Constant(None)
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def prints(function: Function) -> dict[str, str]:
    """{normalised print: its source} of ``function``: its body (without the docstring) as a whole, and every
    expression in it of at least MIN_NODES nodes."""
    bound = bound_names(function)
    body = [ast.Expr(function.body)] if isinstance(function, ast.Lambda) else function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    found = {normalised(ast.Module(body=body, type_ignores=[]), bound): "the whole body"} if body else {}
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.expr) and size(node) >= MIN_NODES:
                found.setdefault(normalised(node, bound), ast.unparse(node))
    return found


def functions(source: str, filename: str = "<source>", lambdas: bool = False) -> dict[str, Function]:
    """{name: definition} of the module-level functions of Python ``source``; with ``lambdas``, also every
    lambda outside them (named ``lambda at line N``)."""
    tree = ast.parse(source, filename=filename)
    found = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if lambdas:
        for statement in tree.body:
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found |= {f"lambda at line {node.lineno}": node for node in ast.walk(statement)
                          if isinstance(node, ast.Lambda)}
    return found


def shared(helper: Function, answer: Function) -> list[str]:
    """The source of each piece of ``helper`` (its whole body, or an expression) whose normalised print is also
    one of ``answer``'s; [] when they share none."""
    theirs = prints(answer)
    return [source for key, source in prints(helper).items() if key in theirs]
