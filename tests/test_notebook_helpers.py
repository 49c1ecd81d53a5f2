"""moe_course.course.inside.notebook: the helpers every assignment's setup cell imports (and the sandbox gets)."""

import json

import numpy as np
import pytest

from moe_course.course.inside.notebook import close, differs, predictions


def test_the_first_answer_counts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    freeze = predictions("09_x.predictions.json")
    assert freeze("PREDICTED_N", None) == "PREDICTED_N is not answered yet: nothing recorded"
    assert not (tmp_path / "09_x.predictions.json").exists()
    assert "recorded as your prediction" in freeze("PREDICTED_N", 3)
    assert freeze("PREDICTED_N", 3) == "PREDICTED_N = 3, as first recorded"
    assert "recorded as your prediction" in freeze("PREDICTED_M", [1, 2])  # a second prediction beside the first
    assert json.loads((tmp_path / "09_x.predictions.json").read_text()) == {"PREDICTED_N": "3", "PREDICTED_M": "[1, 2]"}
    with pytest.raises(AssertionError, match="PREDICTED_N was 3 when first recorded and is 4 now"):
        freeze("PREDICTED_N", 4)


def test_arrays_are_compared_and_a_shape_is_named():
    assert differs(np.array([True, False]), np.array([1, 1])) == 1.0
    assert differs(np.zeros(2), np.zeros(3)) == "shape (2,), expected (3,)"
    close(np.ones(3), np.ones(3) + 1e-7, "output")
    with pytest.raises(AssertionError, match=r"your output differs from the library's by 0\.1"):
        close(np.ones(3), np.ones(3) + 0.1, "output")
    with pytest.raises(AssertionError, match=r"your slots has shape \(2,\), expected \(3,\)"):
        close(np.zeros(2), np.zeros(3), "slots")
