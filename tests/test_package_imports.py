"""The whole package has no import circle (every import of one moe_course module by another, at the top of a file or
inside a function, read from the syntax trees), and the JAX checkpoint readers (``moe_course.reference``) load
without PyTorch: the weight names and layouts they share with the converters live in ``moe_course.models.layouts``."""

import ast
import subprocess
import sys
from pathlib import Path

from test_course_imports import circle

ROOT = Path(__file__).resolve().parents[1]


def module_files() -> dict[str, Path]:
    """{"moe_course.a.b": path} of every module of the package (a package by the name of its __init__'s folder)."""
    files = {}
    for path in (ROOT / "moe_course").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports anywhere in it: ``from a import b`` is an
    import of the module a.b where there is one, else of a."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            module = (".".join(package[:len(package) - node.level + 1] + [node.module or ""]).rstrip(".")
                      if node.level else node.module)
            if module in known:
                found |= {f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                          for alias in node.names}
    return found - {name}


def test_no_import_circle_in_the_package():
    files = module_files()
    graph = {name: imports(name, path, set(files)) for name, path in files.items()}
    assert "moe_course.torch.convert" in graph["moe_course.torch.models.upcycling"]  # the walk sees function imports
    assert circle(graph) is None, f"import circle: {' -> '.join(circle(graph))}"


def test_the_jax_checkpoint_readers_import_no_pytorch():
    code = ("import sys, moe_course.reference, moe_course.models.layouts; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'moe_course.torch'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
