"""moe_course/course/ keeps its rooms: every import of one of its modules by another, at the top of a file or
inside a function, read from the syntax trees (nothing is imported here), goes to a room the importing module's
room may use (``inside`` <- ``limits`` <- ``instructor``, each room's docstring), and no import circle exists."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "moe_course" / "course"
PREFIX = "moe_course.course"
ROOMS = {"inside": {"inside"}, "limits": {"inside", "limits"}, "instructor": {"inside", "limits", "instructor"}}


def module_files() -> dict[str, Path]:
    """{"room.module": path} of every module of the package below its rooms (the rooms' __init__ files included)."""
    return {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path for path in PACKAGE.glob("*/*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` ("room.module" or "room.__init__") that the file at ``path`` imports, anywhere in
    it; an import of the top package or of a name it cannot resolve is returned as itself, so the test fails."""
    found = set()

    def add(dotted: str) -> None:
        name = dotted[len(PREFIX) + 1:] if dotted.startswith(PREFIX + ".") else dotted
        found.add(name if name in known else f"{name}.__init__" if f"{name}.__init__" in known else dotted)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.add(f"relative import in {path.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                add(whole if whole[len(PREFIX) + 1:] in known else node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX):
                    add(alias.name)
    own = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return found - {own}


def graph() -> dict[str, set[str]]:
    """room.module -> the room.modules it imports."""
    files = module_files()
    return {name: imports(path, set(files)) for name, path in files.items()}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports) as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module], _ = "open", path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (found := visit(imported)):
                return found
        state[module], _ = "done", path.pop()
        return None

    return next((found for module in sorted(graph) if module not in state and (found := visit(module))), None)


def trespasses(graph: dict[str, set[str]]) -> list[str]:
    """"a.x -> b.y" for every import that leaves what room ``a`` may use (or names no module of the package)."""
    return [f"{module} -> {imported}" for module, found in sorted(graph.items()) for imported in sorted(found)
            if imported.split(".")[0] not in ROOMS.get(module.split(".")[0], set())]


def test_the_package_is_split_into_its_rooms():
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py"]  # every module is in a room
    assert {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"} == set(ROOMS)
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, room


def test_the_rooms_import_only_what_they_may_and_have_no_circle():
    found = graph()
    assert {"instructor.grade", "limits.worker", "limits.sandbox", "inside.answers"} <= set(found)
    assert found["instructor.grade"] and found["limits.sandbox"], found
    assert trespasses(found) == []
    assert circle(found) is None, " -> ".join(circle(found))


def test_the_sandbox_runtime_is_the_inside_room():
    """What ``limits.sandbox`` copies into the sandbox is a part of ``inside`` that imports nothing else."""
    runtime = ast.literal_eval(next(
        node.value for node in ast.walk(ast.parse((PACKAGE / "limits" / "sandbox.py").read_text()))
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "RUNTIME_MODULES"))
    names = {".".join(Path(module).with_suffix("").parts[1:]) for module in runtime}
    assert {name.split(".")[0] for name in names} == {"inside"}
    found = graph()
    # answers imports compare only to judge a learner's own run, where no sandbox exists (outside grading)
    assert all(found[name] <= names | {"inside.compare"} for name in names), {n: found[n] for n in names}


def test_a_circle_and_a_trespass_are_found():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
    assert trespasses({"inside.guard": {"limits.budget"}, "limits.worker": {"inside.kernel"}}) == [
        "inside.guard -> limits.budget"]
    assert trespasses({"limits.x": {"moe_course.course.nowhere"}}) == ["limits.x -> moe_course.course.nowhere"]
