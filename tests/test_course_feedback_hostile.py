"""Feedback pages made from a hostile graded notebook run no script and request nothing when opened in a real
browser, still show a correct student's figure, and cost a bounded time per student.

The notebooks are not graded here (the grading tests do that): each is the released 06_mod notebook with
hostile cells added, put where autograde leaves a graded notebook, with the student's submission added to
a copy of the course gradebook -- then the real ``grade.feedback`` makes the pages (nbgrader's feedback
template, ``moe_course.course.instructor.feedback``). Headless Chromium (Debian's package, driven by playwright as in
tests/test_site.py) opens them from disk while a stand-in HTTP server on 127.0.0.1 counts every request.
"""

import base64
import http.server
import json
import os
import resource
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[instructor]'")
pytest.importorskip("nh3", reason="nh3 is not installed: pip install -e '.[instructor]'")

from moe_course.course.instructor import build, feedback as feedback_pages, grade  # noqa: E402
from moe_course.course.limits.config import course_paths  # noqa: E402
from moe_course.course.limits.worker import record_paths  # noqa: E402
from headless_chromium import browser_context  # noqa: E402

# nbgrader's add_submission warns that the objects it made are not in its session yet (it adds them after)
pytestmark = pytest.mark.filterwarnings("ignore:Object of type <Submitted")
NAME = "06_mod"
# The real score of an empty submission: 0 of the autograded points (the code test cells; an explain task's
# points are the instructor's and not in the total)
REAL_SCORE = "(Score: 0.0 / {:.1f})".format(sum(
    cell.metadata["nbgrader"]["points"] for cell in build.source_notebook(build.SOLUTIONS / f"{NAME}.py").cells
    if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")))
PWN = "window.__pwned=1;document.title='pwned'"


def _png(width: int, height: int) -> str:
    """A real RGB PNG of ``width`` x ``height`` red pixels, base64 (what a learner's matplotlib figure is)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


def _hostile_cells(beacon: str) -> list[dict]:
    """Markdown and outputs that, in the old feedback, ran script or reached ``beacon`` (the stand-in server)."""
    figure = _png(12, 8)

    def output(data, metadata=None):
        return {"output_type": "display_data", "data": data, "metadata": metadata or {}}

    markdown = (f"<img src={beacon}/markdown.png> <a href=\"javascript:{PWN}\">a javascript: link</a> "
                f"<a href=\"//127.0.0.1:{beacon.rsplit(':', 1)[1]}/relative\">protocol-relative</a>\n\n"
                f"<svg onload=\"{PWN}\"><image href=\"{beacon}/svg.png\"/></svg>\n\n"
                f"<meta http-equiv=\"refresh\" content=\"0;url={beacon}/refresh\">\n\n"
                f"<style>body {{ background: url({beacon}/style.png) }}</style>\n\n"
                f"<div style=\"background-image: url({beacon}/inline.png)\">styled</div>"
                f"<span style=\"background: u\\72l({beacon}/escaped.png)\">escaped</span>\n\n"
                f"<img src=x onerror=\"{PWN}\"> <iframe src=\"{beacon}/frame\"></iframe>"
                f"<object data=\"{beacon}/object\"></object><form action=\"{beacon}/form\"><button>go</button></form>")
    outputs = [
        output({"image/png": figure}, {"image/png": {"width": f"1 onerror={PWN}", "height": f"1 onload={PWN}"}}),
        output({"image/png": figure}, {"filenames": {"image/png": f"{beacon}/filename.png"}}),
        output({"text/markdown": f"![beacon]({beacon}/markdown-output.png) <img src={beacon}/md-out-tag.png>"}),
        output({"text/html": f"<img src={beacon}/html.png onerror=\"{PWN}\"><script>{PWN}</script>"}),
        output({"text/html": f"<p>isolated</p><img src={beacon}/isolated.png>"},
               {"text/html": {"isolated": True}}),
        output({"image/svg+xml": f"<svg xmlns='http://www.w3.org/2000/svg' onload=\"{PWN}\"><image "
                                 f"href='{beacon}/svg-output.png'/></svg>", "text/plain": "<svg>"}),
        output({"application/javascript": PWN, "text/plain": "<js>"}),
        output({"image/png": figure}, {"image/png": {"width": 48, "alt": "the learner's figure"}}),  # correct
    ]
    return [{"cell_type": "markdown", "id": "hostile-md", "metadata": {}, "source": markdown},
            {"cell_type": "code", "id": "hostile-out", "metadata": {}, "execution_count": 1, "outputs": outputs,
             "source": "# outputs as the kernel sent them"}]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course with 06_mod released (no exercises folder written)."""
    folder = tmp_path_factory.mktemp("course")
    build.release(folder, [NAME], exercises_dir=None)
    return folder


def _graded(course: Path, student: str, extra_cells: list[dict], metadata: dict | None = None,
            first_cells: list[dict] = ()) -> None:
    """``student``'s notebook (the released one with ``first_cells`` before and ``extra_cells`` after its cells,
    and ``metadata``) where autograde leaves a graded one, with the submission in the student's gradebook copy
    and a "graded" record."""
    from nbgrader.api import Gradebook

    paths = course_paths(course)
    notebook = json.loads((paths["release"] / NAME / f"{NAME}.ipynb").read_text())
    notebook["cells"] = [*first_cells, *notebook["cells"], *extra_cells]
    notebook["metadata"].update(metadata or {})
    target = paths["autograded"] / student / NAME / f"{NAME}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(notebook))
    (paths["submitted"] / student / NAME).mkdir(parents=True, exist_ok=True)
    db, result = record_paths(course, NAME, student)
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths["db"], db)
    with Gradebook(f"sqlite:///{db}", "moe-course") as gradebook:
        gradebook.update_or_create_student(student)
        gradebook.add_submission(NAME, student)
    result.write_text(json.dumps({"student": student, "assignment": NAME, "status": "graded"}))


class _Counting(http.server.BaseHTTPRequestHandler):
    requests: list = []

    def do_GET(self):  # noqa: N802
        self.requests.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def beacon():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Counting.requests
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with browser_context(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


# Forged scores drawn over the real one: with allowed CSS and a negative margin (as a hostile class did), and
# with end tags that close the template's elements and then a template (Bootstrap) class that is position: fixed
# at the top of the window.
FORGED = ['<div style="display:block; margin-top:-150px; background-color:white; font-size:20px; '
          'padding:10px">(Score: 8.0 / 8.0)</div>',
          "</div>" * 8 + '<div class="navbar-fixed-top" style="background-color:white; font-size:20px; height:80px">'
          "(Score: 9.0 / 9.0)</div>"]
UNCLOSED = "".join(f"<b class=c{i}>" for i in range(28_000))  # 0.4 MB of distinct unclosed tags
LIMIT = 5  # seconds per student in this test's feedback run


@pytest.fixture(scope="module")
def pages(course, beacon):
    """One feedback run (two child processes): the hostile page, a page that never finishes (its graded
    notebook is a FIFO nobody writes: reading it blocks), the 0.4 MB markdown cell of distinct unclosed tags
    (which made the old sanitizer quadratic) and a plain page after them."""
    widgets = {"application/vnd.jupyter.widget-state+json": {"state": {"w": f"<img src={beacon[0]}/widget.png>"}}}
    _graded(course, "hostile", _hostile_cells(beacon[0]), {"widgets": widgets})
    _graded(course, "blocked", [])
    blocked = course_paths(course)["autograded"] / "blocked" / NAME / f"{NAME}.ipynb"
    blocked.unlink()
    os.mkfifo(blocked)
    _graded(course, "nested", [{"cell_type": "markdown", "id": "nested", "metadata": {}, "source": UNCLOSED}])
    _graded(course, "plain", [])
    _graded(course, "forged", [{"cell_type": "markdown", "id": "forged-last", "metadata": {}, "source": FORGED[1]}],
            first_cells=[{"cell_type": "markdown", "id": "forged-first", "metadata": {}, "source": FORGED[0]}])
    start, cpu = time.perf_counter(), _children_cpu()
    pages = grade.feedback(course, NAME, ["hostile", "blocked", "nested", "plain", "forged"], seconds=LIMIT)
    return {student: path.read_text() for student, path in pages.items()} | {
        "paths": pages, "seconds": time.perf_counter() - start, "cpu": _children_cpu() - cpu}


def _children_cpu() -> float:
    """CPU seconds of this process's ended children (the feedback processes), user and system."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_hostile_feedback_runs_nothing_requests_nothing_and_shows_the_figure(pages, beacon, browser):
    url, requests = beacon
    text, page_file = pages["hostile"], pages["paths"]["hostile"]
    assert text.index('http-equiv="Content-Security-Policy"') < text.index("<title>"), "the CSP comes first"
    assert "feedback skipped" not in text and "Score:" in text and "widget.png" not in text
    # the stand-in server is reachable from this browser: a control page outside the feedback reaches it
    page = browser.new_page()
    page.goto(f"{url}/control")
    assert "/control" in requests, requests
    page.goto("about:blank")
    requests.clear()

    page.goto(page_file.resolve().as_uri())
    page.wait_for_load_state("load")
    for anchor in page.query_selector_all("a"):  # the javascript: link, the protocol-relative one, the anchors
        anchor.dispatch_event("click")
    page.wait_for_timeout(1500)  # the refresh meta asked for 0 s
    assert page.evaluate("window.__pwned") is None, "a handler ran"
    assert page.title() == NAME and page.url.split("#")[0] == page_file.resolve().as_uri()
    assert requests == [], f"the page requested {requests}"
    assert page.evaluate("document.querySelectorAll('script, iframe, object, form, svg, meta[http-equiv=refresh],"
                         " [onerror], [onload], [onclick]').length") == 0
    assert page.evaluate("[...document.querySelectorAll('a[href]')].every(a => a.getAttribute('href')"
                         ".startsWith('#'))")
    # the correct student's figure shows (a data: PNG that decoded), and the course's stylesheet applies
    figure = page.evaluate("(() => { const img = document.querySelector('img[alt=\"the learner\\'s figure\"]');"
                           " return img && [img.complete, img.naturalWidth, img.src.slice(0, 22)]; })()")
    assert figure == [True, 12, "data:image/png;base64,"], figure
    assert page.evaluate("getComputedStyle(document.body).fontSize") == "14px", "nbgrader's feedback styles"
    assert page.evaluate("[...document.images].every(img => img.src === '' || img.src.startsWith('data:image/'))")
    page.close()


def test_a_forged_score_cannot_be_drawn_over_the_real_one(pages, browser):
    """The boxes of the forged scores do not meet the real score's, and what the browser shows at every point of
    the real score (Chromium's hit test, which follows painting order and clipping) is the real score."""
    assert REAL_SCORE in pages["forged"]
    page = browser.new_page()
    page.set_viewport_size({"width": 1000, "height": 700})
    page.goto(pages["paths"]["forged"].resolve().as_uri())
    page.wait_for_load_state("load")
    boxes = page.evaluate(r"""(score => {
        const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        const real = [...document.querySelectorAll('h4')].find(e => e.textContent.includes(score));
        const forged = [...document.querySelectorAll('body *')].filter(
            e => !e.children.length && /Score: [89]\.0 \/ [89]\.0/.test(e.textContent));
        const [left, top, right, bottom] = box(real);
        let hidden = 0;
        for (let x = left + 1; x < right; x += 20)
            for (const y of [top + 1, (top + bottom) / 2, bottom - 1])
                hidden += !real.contains(document.elementFromPoint(x, y));
        return {real: box(real), forged: forged.map(box), hidden};
    })""", REAL_SCORE)
    page.close()
    left, top, right, bottom = boxes["real"]
    assert right - left > 100 and bottom - top > 10, boxes
    assert len(boxes["forged"]) == 2, boxes
    for forged_left, forged_top, forged_right, forged_bottom in boxes["forged"]:
        assert forged_right <= left or forged_left >= right or forged_bottom <= top or forged_top >= bottom, boxes
    assert boxes["hidden"] == 0, f"{boxes['hidden']} points of the real score show something else: {boxes}"


def test_markup_is_capped_and_a_slow_page_is_skipped_alone(pages):
    # the 0.4 MB cell is replaced by a notice before any parser sees it
    assert len(UNCLOSED) > 400_000
    nested = pages["nested"]
    assert f"markdown cell of {len(UNCLOSED):,} characters not shown in the feedback" in nested
    assert "c27999" not in nested and "feedback skipped" not in nested
    # the page that never finishes is skipped with one line once its time is up; the pages after it are made
    assert pages["blocked"].count(f"feedback skipped: took longer than {LIMIT} s") == 1
    assert "feedback skipped" not in pages["plain"] and "Score:" in pages["plain"]
    # CPU time, not wall time (the blocked page waits without it): two child processes (4.5 s of imports
    # each) and four pages; the old sanitizer spent minutes on the 0.4 MB cell alone
    assert pages["cpu"] < 30, pages["cpu"]
    print(f"\nfeedback: 4 pages (one skipped after {LIMIT} s) in {pages['seconds']:.1f} s, "
          f"{pages['cpu']:.1f} CPU s")
