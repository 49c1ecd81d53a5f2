"""The learner's path through JupyterLab, in a real browser: README's "Start here" done by a program.

``jupyter lab`` serves a temporary copy of the repository's layout (``chapters/`` with the primer and
``chapters/jupytext.toml``) on 127.0.0.1, with a token and no browser of its own; Jupyter's config, data and
runtime folders, IPython's folder and TMPDIR are temporary too, so the test neither reads the user's settings nor leaves
files anywhere. Headless Chromium (Debian's package, driven by playwright as in tests/test_site.py) then does
what README tells a learner: right-click ``00_jax_primer.py`` in the file browser, *Open With -> Notebook*,
*Run -> Run All Cells*; then it moves the chapter's learning-rate slider and checks that the figure below it
was redrawn (issue 46, item 6). Skips, naming what is missing, without playwright, Chromium or JupyterLab.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jupytext
import pytest
from headless_chromium import CHROMIUM, CHROMIUM_FLAGS, require_chromium

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "00_jax_primer"
TOKEN = "moe-course-lab-test"
# The Open With entries README's "Start here" explains (jupytext adds the last two).
OPEN_WITH = ["Notebook", "Editor", "Jupytext Notebook", "Notebook (no kernel)"]
# Seconds: the Lab's first page load; running every cell (about 10 s of cells, plus the kernel's start, on two
# busy cores); the redraw after the slider moves.
LOAD_TIMEOUT, RUN_TIMEOUT, REDRAW_TIMEOUT = 90, 180, 60


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_server(url: str, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"jupyter lab exited with {server.returncode} before it served {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"jupyter lab did not answer {url} within {timeout} s")


def _stop(server: subprocess.Popen, runtime: Path) -> None:
    """End the server; on SIGTERM it shuts down the kernels it started (jupyter_client gives each its own
    session). If it hangs, kill it and then its kernels, found by their connection files in ``runtime``."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    except ProcessLookupError:
        return  # it had already exited
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        for process in Path("/proc").glob("[0-9]*"):
            try:
                if str(runtime).encode() in (process / "cmdline").read_bytes():
                    os.kill(int(process.name), signal.SIGKILL)
            except OSError:
                pass  # gone meanwhile, or not ours to read


@pytest.fixture
def lab(tmp_path):
    """The URL of a running ``jupyter lab`` whose root holds ``chapters/`` as a clone does (a temporary copy)."""
    require_chromium()
    pytest.importorskip("jupyterlab", reason="JupyterLab is in the lab extra: pip install -e '.[lab]'")
    root = tmp_path / "course"
    (root / "chapters").mkdir(parents=True)
    for name in (f"{CHAPTER}.py", "jupytext.toml"):
        shutil.copy(ROOT / "chapters" / name, root / "chapters" / name)
    home = tmp_path / "jupyter"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "MPLCONFIGDIR": str(home / "matplotlib"), "JUPYTER_PLATFORM_DIRS": "1", "TMPDIR": str(home / "tmp")}
    (home / "tmp").mkdir(parents=True)
    for name in ("MOE_COURSE_SEED", "MOE_COURSE_FULL_SCALE", "MPLBACKEND"):
        env.pop(name, None)
    port = _free_port()
    log_path = tmp_path / "lab.log"
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:  # containers and CI run as root, which Jupyter refuses unless told
        command.append("--allow-root")
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            _wait_for_server(f"{url}/api/status?token={TOKEN}", server, LOAD_TIMEOUT)
            yield url
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n--- jupyter lab's log:\n{log_path.read_text()[-4000:]}") from None
        finally:
            _stop(server, home / "runtime")
    # The Lab may save the paired .ipynb (autosave) and checkpoints beside it; the tracked .py stays as it was.
    assert (root / "chapters" / f"{CHAPTER}.py").read_bytes() == (ROOT / "chapters" / f"{CHAPTER}.py").read_bytes()


def test_open_with_notebook_run_all_and_move_the_slider(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    code_cells = sum(c.cell_type == "code" for c in jupytext.read(ROOT / "chapters" / f"{CHAPTER}.py").cells)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{lab}/lab/tree/chapters?token={TOKEN}", timeout=LOAD_TIMEOUT * 1000)
            item = page.locator(".jp-DirListing-item", has_text=f"{CHAPTER}.py")
            item.wait_for(timeout=LOAD_TIMEOUT * 1000)

            # README: right-click the chapter, Open With -> Notebook, the first of the four entries README names
            item.click(button="right")
            page.locator(".lm-Menu-item[data-type='submenu']", has_text="Open With").click()
            open_with = page.locator(".lm-Menu").nth(1)
            expect(open_with.locator(".lm-Menu-itemLabel")).to_have_text(OPEN_WITH)
            open_with.locator(".lm-Menu-item").filter(has=page.get_by_text("Notebook", exact=True)).click()
            notebook = page.locator(".jp-NotebookPanel:visible")
            expect(notebook.locator(".jp-Cell").first).to_be_visible(timeout=LOAD_TIMEOUT * 1000)
            expect(page.locator(".jp-DocumentTabBar .lm-TabBar-tab.lm-mod-current, .lm-TabBar-tab.lm-mod-current")
                   .filter(has_text=f"{CHAPTER}.py").first).to_be_visible()

            # Run -> Run All Cells, from the menu bar, once the status bar says the kernel has started (a Run All
            # before that is lost)
            expect(page.locator(".jp-StatusBar-Item", has_text="Python 3 (ipykernel) | Idle")).to_be_visible(
                timeout=LOAD_TIMEOUT * 1000)
            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            run_menu = page.locator(".lm-Menu").first
            run_menu.locator(".lm-Menu-item").filter(has=page.get_by_text("Run All Cells", exact=True)).click()
            prompts = notebook.locator(".jp-CodeCell .jp-InputPrompt")
            deadline = time.monotonic() + RUN_TIMEOUT
            while True:  # text content: the Lab does not render cells scrolled out of view, but keeps their text
                texts = [t.strip() for t in prompts.all_text_contents()]
                done = [t for t in texts if t.startswith("[") and t[1:-2].isdigit()]
                # the Lab shows tracebacks and warnings alike as stderr: the primer prints neither
                stderr = notebook.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
                assert stderr.count() == 0, f"a cell failed or warned in the Lab: {stderr.first.text_content()[-2000:]}"
                if len(done) == code_cells:
                    break
                assert time.monotonic() < deadline, f"{len(done)} of {code_cells} cells ran in {RUN_TIMEOUT} s: {texts}"
                time.sleep(0.5)

            # the slider cell: a learning-rate slider above the figure it redraws
            cell = notebook.locator(".jp-CodeCell", has=page.locator(".widget-slider"))
            expect(cell).to_have_count(1)
            figure = cell.locator(".jp-OutputArea-output img")
            expect(figure).to_have_count(1, timeout=REDRAW_TIMEOUT * 1000)
            before = figure.get_attribute("src")
            readout = cell.locator(".widget-readout")
            start_value = readout.inner_text()
            handle = cell.locator(".noUi-handle")
            handle.scroll_into_view_if_needed()
            box = handle.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] / 2 + 60, box["y"] + box["height"] / 2, steps=5)
            page.mouse.up()
            expect(readout).not_to_have_text(start_value, timeout=REDRAW_TIMEOUT * 1000)
            expect(figure).not_to_have_attribute("src", before, timeout=REDRAW_TIMEOUT * 1000)
            after = figure.get_attribute("src")
            assert after.startswith("data:image/png;base64,") and len(after) > 1000, after[:80]
            page.screenshot(path=str(tmp_path / "lab.png"))
        finally:
            browser.close()
