"""A chapter downloaded from the website runs where the course is not installed: its first cell installs it.

The chapter notebook is made as the site makes it (docs/_ext/course_site.py, ``downloadable_notebook``), with
this checkout as the install source (the site uses its ``course_repository`` setting), and run with nbclient in a
fresh virtual environment that has no ``moe_course``: the install cell and the chapter's cells up to its first
use of the library. The rest of the notebook is the chapter's own cells, byte for byte (checked here), which
tests/test_chapters.py executes. To keep the test cheap (47 s on two cores shared with a load of about 19; the
whole chapter there took 4.5 minutes), the venv borrows the libraries of the running environment through a ``.pth`` line:
``.pth`` files of a borrowed folder are not run, so this environment's editable ``moe_course`` stays invisible
and the install cell has to install the course, with pip finding its dependencies already there.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

pytest.importorskip("sphinx", reason="the website's helpers need the docs extra: pip install -e '.[docs]'")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import course_site  # noqa: E402  (docs/_ext/course_site.py)

CHAPTER = "02_moe_layer"  # the cheapest chapter


@pytest.fixture
def fresh_kernel(tmp_path, monkeypatch) -> str:
    """A kernel named "fresh" running in a new venv without moe_course; returns its name."""
    venv = tmp_path / "venv"
    # without its own pip (installing one takes half a minute): the borrowed folders hold this environment's
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    borrowed = [entry for entry in sys.path if entry.endswith(("site-packages", "dist-packages"))]
    Path(site_packages, "borrowed.pth").write_text("".join(f"{entry}\n" for entry in borrowed))
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('moe_course'))"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "None", f"the fresh venv already sees moe_course: {probe.stdout}"
    spec = tmp_path / "jupyter" / "kernels" / "fresh"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fresh venv", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for name in ("PYTHONPATH", "MOE_COURSE_FULL_SCALE", "MPLBACKEND"):
        monkeypatch.delenv(name, raising=False)
    return "fresh"


def test_a_downloaded_chapter_installs_the_course_and_runs(fresh_kernel, tmp_path):
    chapter = ROOT / "chapters" / f"{CHAPTER}.py"
    notebook = course_site.downloadable_notebook(chapter, repository=str(ROOT))
    assert [c.source for c in notebook.cells[1:]] == [c.source for c in jupytext.read(chapter).cells]
    first_use = next(i for i, c in enumerate(notebook.cells) if i and "moe_course" in c.source and c.cell_type == "code")
    notebook.cells = notebook.cells[:first_use + 1]
    work = tmp_path / "work"  # not the checkout: there moe_course would import from the current folder
    work.mkdir()
    client = nbclient.NotebookClient(notebook, kernel_name=fresh_kernel, timeout=600,
                                     resources={"metadata": {"path": str(work)}})
    client.execute()
    install = "".join(output.get("text", "") for output in notebook.cells[0].outputs)
    assert "installing" in install, f"the install cell found moe_course already: {install!r}"
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "error"]
    assert not errors, errors
    assert notebook.cells[-1].execution_count, "the chapter's first library cell did not run"


def test_without_a_repository_the_install_cell_says_how_to_install():
    source = course_site.install_cell_source("")
    assert "pip install -e ." in source and "subprocess" not in source.split("if importlib")[1]
    assert "moe-course @ git+https://github.com/o/moe-course" in course_site.install_cell_source(
        "https://github.com/o/moe-course")
    assert os.fspath(ROOT) in course_site.install_cell_source(os.fspath(ROOT))
