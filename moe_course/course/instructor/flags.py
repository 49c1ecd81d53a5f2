"""Static review of answer cells: constructs a graded answer has no business using, listed for a human.

The grading kernel (``guard``) blocks or undoes the attacks it knows; this scan names them in
``grades.csv`` (column ``flags``) so that an instructor reads those submissions, whatever their score.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from moe_course.course.limits.bounded import MAX_NOTEBOOK_BYTES, NotebookTooLarge, read_notebook

SUSPICIOUS_MODULES = {"ctypes", "gc", "builtins", "importlib", "inspect", "subprocess", "signal", "faulthandler",
                      "resource", "shutil", "socket", "sys", "os", "pathlib", "IPython", "unittest",
                      "_posixsubprocess", "multiprocessing", "threading", "traceback", "linecache"}
MAX_SCANNED_CHARS = 2**20  # of a notebook's student code: answers are a few KB (the file is capped too)
MAX_FLAG_CHARS = 120  # of the expression a flag quotes
SUSPICIOUS_NAMES = {"get_ipython", "open", "exec", "eval", "compile", "setattr", "delattr", "__import__", "globals",
                    "vars", "__code__", "__builtins__", "__globals__", "sys.modules", "_exit", "exit", "quit"}


def scan_source(source: str) -> list[str]:
    """Flags for one cell's code: imports of SUSPICIOUS_MODULES, uses of SUSPICIOUS_NAMES, assignments to
    attributes of other objects (monkeypatching). A cell that does not parse is flagged as such, and so is
    one nested too deep for Python's parser or ``ast.unparse`` (RecursionError)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ["does not parse"]
    except (RecursionError, MemoryError):
        return ["nested too deep to scan"]
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            flags |= {f"imports {n}" for n in names if n.split(".")[0] in SUSPICIOUS_MODULES}
        elif isinstance(node, ast.Name) and node.id in SUSPICIOUS_NAMES:
            flags.add(f"uses {node.id}")
        elif isinstance(node, ast.Attribute):
            if node.attr in SUSPICIOUS_NAMES:
                flags.add(f"uses .{node.attr}")
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                try:
                    target = ast.unparse(node)
                except RecursionError:
                    target = "nested too deep to show"
                flags.add(f"assigns an attribute ({target[:MAX_FLAG_CHARS]})")
    return sorted(flags)


def _students_code(cell: dict) -> bool:
    """A code cell the student wrote: an answer cell, or one they added (no nbgrader metadata); not the
    locked cells, which grading restores from the gradebook."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and (nbgrader.get("solution") or not nbgrader.get("locked"))


def scan_notebook(path: Path, limit: int = MAX_NOTEBOOK_BYTES) -> list[str]:
    """Flags for the code a student wrote in a submitted notebook (answer cells and added cells), within
    bounds: the file is refused before parsing past ``limit`` bytes (``--max-notebook-mb``) or
    ``MAX_NOTEBOOK_CONTAINERS`` (["not scanned: <why, with the numbers>"]), and only the first
    MAX_SCANNED_CHARS characters of its code are scanned (then "code past N characters not scanned" is added).
    ["unreadable notebook"] if it is not a notebook (JSON nested too deep for the parser included)."""
    try:
        raw = read_notebook(Path(path), limit)
    except NotebookTooLarge as why:
        return [f"not scanned: {why}"]
    except OSError:
        return ["unreadable notebook"]
    try:
        cells = json.loads(raw)["cells"]
        sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells
                   if _students_code(c)]
        if not all(isinstance(s, str) for s in sources):
            raise TypeError("a cell's source is not text")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return ["unreadable notebook"]
    flags, scanned = set(), 0
    for source in sources:
        if scanned + len(source) > MAX_SCANNED_CHARS:
            flags.add(f"code past {MAX_SCANNED_CHARS} characters not scanned")
            break
        scanned += len(source)
        flags |= set(scan_source(source))
    return sorted(flags)
