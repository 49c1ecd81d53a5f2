"""pytest plugin for the chapter tests' nbval run: a JSON summary of every executed cell's outputs.

Loaded with ``-p nbval_outputs`` in the nbval subprocess of tests/test_chapters.py; writes a list of
{"cell", "images", "longest_text", "text"} records to the file named by MOE_COURSE_OUTPUT_SUMMARY ("text": what the
cell printed, its first TEXT_LIMIT characters).
"""

import json
import os

_cells: list[dict] = []
TEXT_LIMIT = 20_000


def _text_lines(output) -> int:
    if output.get("output_type") == "stream":
        return len(output.get("text", "").splitlines())
    data = output.get("data", {})
    return 0 if "image/png" in data else len(str(data.get("text/plain", "")).splitlines())


def pytest_runtest_teardown(item):
    outputs = getattr(item, "test_outputs", None)
    if outputs is None:
        return
    _cells.append({
        "cell": item.name,
        "images": sum("image/png" in output.get("data", {}) for output in outputs),
        "longest_text": max((_text_lines(output) for output in outputs), default=0),
        "text": "".join(output.get("text", "") for output in outputs
                        if output.get("output_type") == "stream")[:TEXT_LIMIT],
    })


def pytest_sessionfinish(session):
    path = os.environ.get("MOE_COURSE_OUTPUT_SUMMARY")
    if path:
        with open(path, "w") as f:
            json.dump(_cells, f)
