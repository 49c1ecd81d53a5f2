"""Static review of answer cells: constructs a graded answer has no business using, listed for a human.

The grading kernel (``guard``) blocks or undoes the attacks it knows; this scan names them in
``grades.csv`` (column ``flags``) so that an instructor reads those submissions, whatever their score.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

SUSPICIOUS_MODULES = {"ctypes", "gc", "builtins", "importlib", "inspect", "subprocess", "signal", "faulthandler",
                      "resource", "shutil", "socket", "sys", "os", "pathlib", "IPython", "unittest",
                      "_posixsubprocess", "multiprocessing", "threading", "traceback", "linecache"}
SUSPICIOUS_NAMES = {"get_ipython", "open", "exec", "eval", "compile", "setattr", "delattr", "__import__", "globals",
                    "vars", "__code__", "__builtins__", "__globals__", "sys.modules", "_exit", "exit", "quit"}


def scan_source(source: str) -> list[str]:
    """Flags for one cell's code: imports of SUSPICIOUS_MODULES, uses of SUSPICIOUS_NAMES, assignments to
    attributes of other objects (monkeypatching). A cell that does not parse is flagged as such."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ["does not parse"]
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
                flags.add(f"assigns an attribute ({ast.unparse(node)})")
    return sorted(flags)


def _students_code(cell: dict) -> bool:
    """A code cell the student wrote: an answer cell, or one they added (no nbgrader metadata); not the
    locked cells, which grading restores from the gradebook."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and (nbgrader.get("solution") or not nbgrader.get("locked"))


def scan_notebook(path: Path) -> list[str]:
    """Flags for the code a student wrote in a submitted notebook (answer cells and added cells);
    ["unreadable notebook"] if it is not one."""
    try:
        cells = json.loads(Path(path).read_text())["cells"]
        sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells
                   if _students_code(c)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ["unreadable notebook"]
    return sorted({flag for source in sources for flag in scan_source(source)})
