"""The learner's path through JupyterLab, in a real browser: README's "Start here" done by a program.

``jupyter lab`` serves a temporary copy of the repository's layout (``chapters/`` with the primer and
``chapters/jupytext.toml``) on 127.0.0.1, with a token and no browser of its own; Jupyter's config, data and
runtime folders, IPython's folder and TMPDIR are temporary too, so the test neither reads the user's settings nor leaves
files anywhere. Headless Chromium (Debian's package, driven by playwright as in tests/test_site.py) then does
what README tells a learner: right-click ``00_jax_primer.py`` in the file browser, *Open With -> Notebook*,
*Run -> Run All Cells*; then it moves the chapter's learning-rate slider and checks that the figure below it
was redrawn (issue 46, item 6). A second test follows README's exercise path in a git repository holding the
course's files: the chapter's Exercises commands run in a Lab Terminal, the copy is opened, answered, saved and
checked, and after Lab's autosave `git status` is clean (issue 53, item 7). Skips, naming what is missing,
without playwright, Chromium or JupyterLab.
"""

import contextlib
import json
import os
import re
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


@contextlib.contextmanager
def _jupyter_lab(root: Path, home: Path, log_path: Path, settings: dict | None = None):
    """Serve ``root`` with ``jupyter lab`` (token, no browser, temporary Jupyter folders under ``home``, the user
    settings ``{plugin: {key: value}}`` written there); yields its URL and stops it afterwards."""
    require_chromium()
    pytest.importorskip("jupyterlab", reason="JupyterLab is in the lab extra: pip install -e '.[lab]'")
    for plugin, values in (settings or {}).items():  # the Lab reads them from <config dir>/lab/user-settings
        path = home / "config" / "lab" / "user-settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "MPLCONFIGDIR": str(home / "matplotlib"), "JUPYTER_PLATFORM_DIRS": "1", "TMPDIR": str(home / "tmp"),
           # the Lab's terminals find the moe-course command of this Python, as an activated environment does
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    # A terminal opens the shell a learner's `jupyter lab`, started from a terminal, opens: not a login shell
    # (which jupyter_server_terminals starts when its output is not a terminal, as here, and whose /etc/profile
    # on Debian resets PATH, losing the environment's commands).
    config = {"ServerApp": {"terminado_settings": {"shell_command": [shutil.which("bash") or "/bin/sh"]}}}
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    for name in ("MOE_COURSE_SEED", "MOE_COURSE_FULL_SCALE", "MPLBACKEND"):
        env.pop(name, None)
    port = _free_port()
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


@pytest.fixture
def lab(tmp_path):
    """The URL of a running ``jupyter lab`` whose root holds ``chapters/`` as a clone does (a temporary copy)."""
    root = tmp_path / "course"
    (root / "chapters").mkdir(parents=True)
    for name in (f"{CHAPTER}.py", "jupytext.toml"):
        shutil.copy(ROOT / "chapters" / name, root / "chapters" / name)
    with _jupyter_lab(root, tmp_path / "jupyter", tmp_path / "lab.log") as url:
        yield url
    # The Lab may save the paired .ipynb (autosave) and checkpoints beside it; the tracked .py stays as it was.
    assert (root / "chapters" / f"{CHAPTER}.py").read_bytes() == (ROOT / "chapters" / f"{CHAPTER}.py").read_bytes()


@contextlib.contextmanager
def _page(screenshot: Path):
    """A page of headless Chromium (playwright), screenshotted to ``screenshot`` when the test ends."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            yield page
        finally:
            page.screenshot(path=str(screenshot))
            browser.close()


def _file_browser_item(page, url: str, folder: str, name: str):
    """The entry ``name`` of the Lab's file browser opened at ``folder``."""
    page.goto(f"{url}/lab/tree/{folder}?token={TOKEN}", timeout=LOAD_TIMEOUT * 1000)
    item = page.locator(".jp-DirListing-item", has_text=name)
    item.wait_for(timeout=LOAD_TIMEOUT * 1000)
    return item


def _open_with_notebook(page, item, name: str):
    """README: right-click ``item`` (a file browser entry), Open With -> Notebook, the first of the four entries
    README names; returns the notebook panel once its kernel is idle."""
    from playwright.sync_api import expect

    item.click(button="right")
    page.locator(".lm-Menu-item[data-type='submenu']", has_text="Open With").click()
    open_with = page.locator(".lm-Menu").nth(1)
    expect(open_with.locator(".lm-Menu-itemLabel")).to_have_text(OPEN_WITH)
    open_with.locator(".lm-Menu-item").filter(has=page.get_by_text("Notebook", exact=True)).click()
    return _current_notebook(page, name)


def _current_notebook(page, name: str):
    """The notebook panel of the current tab ``name``, once the status bar says its kernel is idle."""
    from playwright.sync_api import expect

    notebook = page.locator(".jp-NotebookPanel:visible")
    expect(notebook.locator(".jp-Cell").first).to_be_visible(timeout=LOAD_TIMEOUT * 1000)
    expect(page.locator(".jp-DocumentTabBar .lm-TabBar-tab.lm-mod-current, .lm-TabBar-tab.lm-mod-current")
           .filter(has_text=name).first).to_be_visible()
    expect(page.locator(".jp-StatusBar-Item", has_text="Python 3 (ipykernel) | Idle")).to_be_visible(
        timeout=LOAD_TIMEOUT * 1000)
    return notebook


def test_open_with_notebook_run_all_and_move_the_slider(lab, tmp_path):
    from playwright.sync_api import expect

    code_cells = sum(c.cell_type == "code" for c in jupytext.read(ROOT / "chapters" / f"{CHAPTER}.py").cells)
    with _page(tmp_path / "lab.png") as page:
        item = _file_browser_item(page, lab, "chapters", f"{CHAPTER}.py")
        notebook = _open_with_notebook(page, item, f"{CHAPTER}.py")

        # Run -> Run All Cells, from the menu bar, once the status bar says the kernel has started (a Run All
        # before that is lost)
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
        # The keyboard moves the slider as a drag does (noUiSlider's handle takes the arrow keys) but sends the
        # value at once. A mouse drag, timed by Playwright on two busy cores, missed the handle in the CI of
        # 2026-11-29 (the readout stayed), and a retried drag moved the readout but left the value unsent
        # (continuous_update=False sends it on the drag's end).
        handle = cell.locator(".noUi-handle")
        handle.focus()
        for _ in range(3):
            handle.press("ArrowRight")
        expect(readout).not_to_have_text(start_value, timeout=REDRAW_TIMEOUT * 1000)
        expect(figure).not_to_have_attribute("src", before, timeout=REDRAW_TIMEOUT * 1000)
        after = figure.get_attribute("src")
        assert after.startswith("data:image/png;base64,") and len(after) > 1000, after[:80]


# The exercise path (issue 53, item 7). Lab's autosave interval is 120 s by default; the test sets it to
# AUTOSAVE seconds in its own Lab settings and waits SETTLE seconds past it, so a write the path would cause has
# happened before `git status` looks (the interval changes when Lab saves, not what it saves).
EXERCISE, AUTOSAVE, SETTLE = "01_vit", 2, 5


@pytest.fixture
def clone(tmp_path):
    """A git repository holding the course files the exercise path touches, committed as a clone has them."""
    root = tmp_path / "course"
    for path in (f"chapters/{EXERCISE}.py", "chapters/jupytext.toml", f"exercises/{EXERCISE}.ipynb",
                 "exercises/README.md", "mywork/README.md", ".gitignore"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, root / path)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clone"]):
        subprocess.run([*git, *args], cwd=root, check=True)
    return root


def _terminal(page, command: str, output: Path, timeout: float) -> str:
    """Type ``command`` into the Lab terminal on screen, its output going to ``output`` (the terminal draws on a
    canvas); returns that output once the command has finished."""
    done = output.with_suffix(".done")
    page.locator(".jp-Terminal:visible").click()
    page.keyboard.type(f"{command} > {output} 2>&1; pwd >> {output}; touch {done}\n")
    deadline = time.monotonic() + timeout
    while not done.exists():
        assert time.monotonic() < deadline, f"{command!r} did not finish in the Lab terminal within {timeout} s"
        time.sleep(0.5)
    return output.read_text()


def test_the_exercise_path_leaves_git_status_clean(clone, tmp_path):
    """README's path: open a chapter, read its Exercises section, run its two commands in a Lab Terminal (the
    Launcher's, which opens in chapters/), open the copy from the file browser, fill one answer, save, check it
    -- and after Lab's autosave `git status --porcelain` is empty. Then the control: the handout opened itself is
    rewritten."""
    from playwright.sync_api import expect

    import nbformat
    from course_submissions import answer_cells

    from moe_course.course.instructor.build import source_notebook

    home, scratch = tmp_path / "jupyter", tmp_path / "jupyter" / "tmp"
    nbformat.write(source_notebook(ROOT / "solutions" / f"{EXERCISE}.py"), tmp_path / "source.ipynb")
    first_id, answer = next(iter(answer_cells(tmp_path / "source.ipynb").items()))
    settings = {"@jupyterlab/docmanager-extension/plugin": {"autosaveInterval": AUTOSAVE}}
    with _jupyter_lab(clone, home, tmp_path / "lab.log", settings) as url, _page(tmp_path / "lab.png") as page:
        item = _file_browser_item(page, url, "chapters", f"{EXERCISE}.py")
        chapter = _open_with_notebook(page, item, f"{EXERCISE}.py")
        section = chapter.locator(".jp-MarkdownCell .jp-RenderedMarkdown pre", has_text="moe-course exercise")
        commands = section.text_content().strip().splitlines()  # the section's code block, as rendered
        assert commands == [f"moe-course exercise {EXERCISE[:2]}", f"moe-course check mywork/{EXERCISE}.ipynb"], section
        assert f"../exercises/{EXERCISE}.ipynb" not in (chapter.locator(".jp-MarkdownCell a").evaluate_all(
            "links => links.map(a => a.getAttribute('href')).join(' ')") or ""), "the chapter links the handout"

        # a Terminal from the Launcher (README names it beside File -> New -> Terminal, which opens in the
        # repository's folder): it opens in the file browser's folder, chapters/, the harder case
        page.locator(".jp-FileBrowser [title^='New Launcher']").first.click()  # the file browser's "+"
        page.locator(".jp-LauncherCard:visible", has_text="Terminal").first.click()
        expect(page.locator(".jp-Terminal:visible")).to_be_visible(timeout=LOAD_TIMEOUT * 1000)
        printed = _terminal(page, commands[0], scratch / "exercise.txt", LOAD_TIMEOUT)
        assert f"check it: {commands[1]}" in printed and printed.rstrip().endswith(str(clone / "chapters")), printed
        copy = clone / "mywork" / f"{EXERCISE}.ipynb"
        assert copy.read_bytes() == (clone / "exercises" / f"{EXERCISE}.ipynb").read_bytes()

        # README: open the copy from the file browser's mywork/ folder, fill the first answer, save
        _file_browser_item(page, url, "mywork", f"{EXERCISE}.ipynb").dblclick()
        notebook = _current_notebook(page, f"{EXERCISE}.ipynb")
        handout = _cell_source(copy, first_id)
        cell = notebook.locator(".jp-CodeCell", has_text=handout.splitlines()[0]).first  # that answer's cell
        _fill_cell(page, cell, answer)
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + LOAD_TIMEOUT
        while "raise NotImplementedError()" in _cell_source(copy, first_id):
            assert time.monotonic() < deadline, "the filled answer was not saved"
            time.sleep(0.5)

        # the check, in the same terminal (still in chapters/)
        page.locator(".lm-TabBar-tab", has_text="Terminal").first.click()
        checked = _terminal(page, commands[1], scratch / "check.txt", RUN_TIMEOUT)
        test_id = first_id.replace("_answer", "_tests")
        assert re.search(rf"^{test_id} +\(\d+ pt\): passed", checked, re.M), checked
        assert "not attempted" in checked, checked  # the other answers are still blank

        time.sleep(AUTOSAVE + SETTLE)  # past Lab's autosave of the open chapter and copy
        status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True)
        assert status.stdout == "", f"the exercise path changed the clone:\n{status.stdout}"

        # the control: the handout opened in Lab itself is rewritten by the autosave, which the path avoids
        page.goto(f"{url}/lab/tree/exercises/{EXERCISE}.ipynb?token={TOKEN}", timeout=LOAD_TIMEOUT * 1000)
        _current_notebook(page, f"{EXERCISE}.ipynb")
        time.sleep(AUTOSAVE + SETTLE)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True)
        assert status.stdout.split() == ["M", f"exercises/{EXERCISE}.ipynb"], status.stdout


def _fill_cell(page, cell, text: str, attempts: int = 3) -> None:
    """Replace the source of ``cell`` with ``text`` by typing, as a learner does, and wait until its editor shows
    it. A click that lands while Lab is still rendering the notebook leaves the editor unfocused, and the keys then
    go to the notebook (CI of 2026-12-02: the save that followed wrote the blank answer), so the click is retried."""
    from playwright.sync_api import Error, expect

    longest = max(text.splitlines(), key=lambda line: len(line.strip())).strip()
    editor = cell.locator(".cm-content")
    for attempt in range(attempts):
        editor.click()
        expect(editor).to_be_focused(timeout=LOAD_TIMEOUT * 1000)
        page.keyboard.press("Control+a")
        page.keyboard.insert_text(text)
        try:
            expect(editor).to_contain_text(longest, timeout=5_000)
            return
        except (AssertionError, Error):
            if attempt == attempts - 1:
                raise


def _cell_source(notebook: Path, grade_id: str) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    cell = next(c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return "".join(cell["source"])
