"""Debian's Chromium driven by playwright, for the tests that open pages in a browser (the website, the feedback
pages, JupyterLab). Playwright's own browser download is never used; a test skips, naming what is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("MOE_COURSE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def require_chromium():
    """playwright's sync API; skips the calling test when Chromium or playwright is missing."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not found at {CHROMIUM} (Debian: apt-get install chromium; or set MOE_COURSE_CHROMIUM)")
    return pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")


@contextlib.contextmanager
def browser_context(profile: Path, **options):
    """A headless Chromium context with its profile in ``profile``; options go to launch_persistent_context."""
    sync_api = require_chromium()
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                                args=CHROMIUM_FLAGS, **options)
        try:
            yield context
        finally:
            context.close()
