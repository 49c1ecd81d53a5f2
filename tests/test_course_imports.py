"""moe_course/course/ has no import circle: every import of one of its modules by another, at the top of a file
or inside a function, read from the syntax trees (nothing is imported here)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "moe_course" / "course"
PREFIX = "moe_course.course"


def imports(path: Path) -> set[str]:
    """The modules of the package that the file at ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PREFIX:
                found |= {alias.name for alias in node.names}
            elif node.module.startswith(PREFIX + "."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[2] for alias in node.names if alias.name.startswith(PREFIX + ".")}
    return {name for name in found if name != path.stem and (PACKAGE / f"{name}.py").exists()}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports) as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module], _ = "open", path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (found := visit(imported)):
                return found
        state[module], _ = "done", path.pop()
        return None

    return next((found for module in sorted(graph) if module not in state and (found := visit(module))), None)


def test_the_grading_package_has_no_import_circle():
    graph = {path.stem: imports(path) for path in PACKAGE.glob("*.py")}
    assert {"grade", "worker", "sandbox", "answers"} <= set(graph) and graph["grade"], graph
    assert circle(graph) is None, " -> ".join(circle(graph))


def test_a_circle_is_found():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
