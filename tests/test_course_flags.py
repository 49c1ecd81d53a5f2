"""The static scan behind grades.csv's flags column reads every cell a student wrote. Fast (no kernel)."""

import json

from moe_course.course.flags import scan_notebook


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
