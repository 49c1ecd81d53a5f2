"""The static scan behind grades.csv's flags column reads every cell a student wrote. Fast (no kernel)."""

import json

from moe_course.course.limits.bounded import MAX_NOTEBOOK_BYTES, MAX_NOTEBOOK_CONTAINERS
from moe_course.course.instructor.flags import scan_notebook, scan_source


def test_added_cells_are_scanned_and_locked_test_cells_are_not(tmp_path):
    cells = [
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "locked": False}},
         "source": "def f(x):\n    return x"},
        {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "locked": True}},
         "source": "import inspect  # the test's own code"},
        {"cell_type": "code", "metadata": {}, "source": ["get_ipython().events.callbacks.clear()\n",
                                                         "import _posixsubprocess, threading"]},
    ]
    notebook = tmp_path / "a.ipynb"
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    flags = scan_notebook(notebook)
    assert flags == ["imports _posixsubprocess", "imports threading", "uses get_ipython"], flags


def test_a_notebook_past_the_limits_is_not_parsed_and_says_why(tmp_path):
    big, nested, fine = tmp_path / "big.ipynb", tmp_path / "nested.ipynb", tmp_path / "fine.ipynb"
    big.write_text('{"cells": [], "metadata": {"x": "' + "x" * MAX_NOTEBOOK_BYTES + '"}}')
    assert scan_notebook(big) == [f"not scanned: big.ipynb is larger than the limit of {MAX_NOTEBOOK_BYTES} bytes "
                                  f"(8 MiB, --max-notebook-mb) for a submitted notebook"]
    nested.write_text('{"cells": [], "metadata": {"x": [' + "[]," * MAX_NOTEBOOK_CONTAINERS + '[]]}}')
    assert scan_notebook(nested) == [f"not scanned: nested.ipynb holds {MAX_NOTEBOOK_CONTAINERS + 5} JSON arrays and "
                                     f"objects ('[' and '{{'), more than the limit of {MAX_NOTEBOOK_CONTAINERS} "
                                     "for a submitted notebook"]
    fine.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": "import os"}],
                                "metadata": {}}))
    assert scan_notebook(fine) == ["imports os"]
    assert scan_notebook(big, limit=16 * 2**20) == []  # --max-notebook-mb 16
    assert scan_notebook(fine, limit=10) == [f"not scanned: fine.ipynb is larger than the limit of 10 bytes "
                                             f"({10 / 2**20:g} MiB, --max-notebook-mb) for a submitted notebook"]


def test_code_nested_past_the_parser_is_flagged_not_raised():
    assert scan_source("x" + ".a" * 50_000 + " = 1") == ["nested too deep to scan"]
    assert scan_source("(" * 300 + ")" * 300) == ["does not parse"]  # the parser's own nesting limit
