"""Opening a chapter in JupyterLab, running it and saving it leaves the tracked .py file byte-identical.

JupyterLab reads and writes chapters through jupytext's contents manager, configured by chapters/jupytext.toml.
These tests drive that same contents manager on a copy of the chapters, doing to each notebook what a Lab
session does (a kernel attaches and writes its metadata, cells get outputs and view metadata), and check that
the .py file is unchanged while the outputs persist in the paired, git-ignored .ipynb.
"""

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from jupytext import TextFileContentsManager

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.py"))
# What JupyterLab with a default ipykernel writes into a notebook it has run.
LAB_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


@pytest.fixture()
def manager(tmp_path):
    for path in [*CHAPTERS, ROOT / "chapters" / "jupytext.toml"]:
        shutil.copy(path, tmp_path)
    return TextFileContentsManager(root_dir=str(tmp_path))


def _run_like_lab(notebook) -> None:
    notebook.metadata["kernelspec"] = dict(LAB_KERNELSPEC)
    notebook.metadata["language_info"] = {"name": "python", "version": "3.11.7", "mimetype": "text/x-python"}
    for count, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"output of cell {count}\n")]
        cell.metadata.update(scrolled=True, collapsed=False, execution={"iopub.status.busy": "2026-01-01T00:00"})


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_open_run_save_leaves_the_chapter_unchanged(manager, chapter, tmp_path):
    original = chapter.read_bytes()
    model = manager.get(chapter.name)
    assert model["type"] == "notebook"
    manager.save({"type": "notebook", "content": model["content"]}, chapter.name)  # save right after opening
    assert (tmp_path / chapter.name).read_bytes() == original
    notebook = manager.get(chapter.name)["content"]
    _run_like_lab(notebook)
    manager.save({"type": "notebook", "content": notebook}, chapter.name)
    assert (tmp_path / chapter.name).read_bytes() == original, "saving a run chapter changed its .py file"
    paired = tmp_path / f"{chapter.stem}.ipynb"
    assert paired.exists(), "the outputs have no paired notebook to live in"
    reopened = manager.get(chapter.name)["content"]
    outputs = [c.outputs for c in reopened.cells if c.cell_type == "code"]
    assert outputs[0] and outputs[0][0]["text"] == "output of cell 0\n", "outputs were lost on reopening"


def test_an_edited_cell_reaches_the_py_file(manager, tmp_path):
    chapter = CHAPTERS[0]
    notebook = manager.get(chapter.name)["content"]
    code = next(c for c in notebook.cells if c.cell_type == "code")
    code.source += "\nprint('my change')"
    manager.save({"type": "notebook", "content": notebook}, chapter.name)
    assert "print('my change')" in (tmp_path / chapter.name).read_text()


def _new_notebook(folder: Path) -> set[str]:
    """The files a notebook made and saved in ``folder`` by JupyterLab's Launcher leaves there."""
    manager = TextFileContentsManager(root_dir=str(folder))
    before = {path.name for path in folder.iterdir()}
    model = manager.new_untitled(type="notebook")
    notebook = manager.get(model["path"])["content"]
    _run_like_lab(notebook)
    manager.save({"type": "notebook", "content": notebook}, model["path"])
    return {path.name for path in folder.iterdir() if path.is_file()} - before


def test_only_chapters_are_paired(manager, tmp_path):
    """A new notebook made in chapters/ stays a plain notebook: no Untitled.py appears (the chapters' pairing is
    checked above). The same folder paired for every notebook, as it was, does make one."""
    assert _new_notebook(tmp_path) == {"Untitled.ipynb"}
    everything = tmp_path / "everything"
    everything.mkdir()
    (everything / "jupytext.toml").write_text('formats = "ipynb,py:percent"\n')
    assert _new_notebook(everything) == {"Untitled.ipynb", "Untitled.py"}


def test_paired_notebooks_are_git_ignored():
    result = subprocess.run(["git", "check-ignore", "-q", "chapters/01_vit.ipynb"], cwd=ROOT)
    assert result.returncode == 0, "chapters/*.ipynb must be git-ignored: they hold each learner's outputs"
