"""Whether a learner's outputs match the references: the comparison the grader (``verdict``), the release check
(``build``) and a solution notebook run by hand (``answers.record`` outside grading) share.

Imports no other module of the package, so every one of them may import it.
"""

from __future__ import annotations

import numpy as np

NUMBER_KINDS = "biuf"  # bool, int, unsigned, float: what an answer may hold


def _compare(got, want, check) -> str | None:
    """Why output ``got`` does not match the reference ``want`` (None when it does)."""
    want = np.asarray(want)
    if got.dtype.kind not in NUMBER_KINDS:
        return f"is not numbers (dtype {got.dtype})"
    if check.scalar and got.shape != ():
        return f"is not one number (shape {got.shape})"
    if got.shape != want.shape:
        return f"has shape {got.shape}, expected {want.shape}"
    got, want = got.astype(np.float64), want.astype(np.float64)
    bad = np.isfinite(want) & ~np.isfinite(got)
    if bad.any():
        return f"has {int(bad.sum())} non-finite value(s) (nan or inf) where the reference is finite"
    close = got == want if check.exact else np.isclose(got, want, rtol=check.rtol, atol=check.atol, equal_nan=True)
    if not close.all():  # how far off is not said: with one's own output it would give the expected value
        return f"differs from the reference in {int((~close).sum())} of {close.size} value(s)"
    return None


def judge(check, grade_id: str, cases: list[tuple], outputs: list[tuple], wants: list[tuple]) -> str | None:
    """Compare the learner's ``outputs`` (one tuple of arrays per case) with ``wants``, the references of
    ``check`` (an ``answers.Check``: its tolerances, ``exact`` and ``scalar``) on ``cases``; returns the first
    failure as one line, or None when every case matches."""
    for index, (got, want) in enumerate(zip(outputs, wants)):
        where = f"{grade_id}, case {index + 1} of {len(cases)}"
        if len(got) != len(want):
            return f"{where}: returned {len(got)} output(s), expected {len(want)}"
        for position, (g, w) in enumerate(zip(got, want)):
            if (why := _compare(np.asarray(g), w, check)) is not None:
                return f"{where}: output {position + 1} {why}"
    return None
