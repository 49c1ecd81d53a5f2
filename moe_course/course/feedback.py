"""Feedback pages that run no script and call nowhere, generated with a bound per student.

``moe-course course feedback`` turns each graded notebook into an HTML page with nbgrader's feedback template
(nbconvert's classic template underneath). A student controls much of what that template writes: markdown
cells and outputs (raw HTML passes through markdown), HTML outputs, and output *metadata* that the template
puts into attributes unquoted (an image's ``width`` of ``1 onerror=...`` becomes a live handler) or into an
``<img src>`` (an image's ``filenames``). So nothing is cleaned before the template runs; the page it writes is
cleaned as a whole, where it is produced (``feedback_exporter``, so no unclean page reaches the disk):

* the body goes through nh3 (the Python binding of ammonia, a Rust allow-list sanitizer on html5ever) with
  ``TAGS`` and ``ATTRIBUTES`` only: no event handler, no ``<script>``, ``<style>``, ``<iframe>``, ``<object>``,
  ``<embed>``, ``<form>``, ``<svg>``, ``<math>``, ``<meta>``, ``<link>`` or ``<base>`` (each is dropped, its
  text kept as text); ``href`` only to an anchor of the page (``#...``); ``src`` only a ``data:`` URI of
  ``IMAGE_TYPES`` in base64; ``style`` attributes with ``STYLE_PROPERTIES`` only and none that holds ``url(``,
  ``image-set(``, ``expression(``, a CSS escape or a negative margin (no ``position``, ``transform``,
  ``float`` or ``z-index`` either: none is in ``STYLE_PROPERTIES``); ``width``/``height`` numbers only;
* the grade header (the total score and the per-cell scores of its table of contents, the template's
  ``panel-heading`` before the first ``panel-body``: nothing there comes from the student) is cleaned on its own
  and drawn first; everything after it -- the cells, the student's markdown and outputs -- is cleaned on its own
  (so no end tag of the student's closes the header's elements) and put into a region (``STUDENT_REGION``)
  that cannot paint outside itself: ``overflow: hidden`` and ``contain: paint`` (which also makes it the
  containing block of anything fixed or absolutely positioned inside, such as a template class a student
  reuses), and so does each markdown cell and output within it. A forged "(Score: 8.0 / 8.0)" stays in its own
  cell's box, below the real score;
* the head is rebuilt: a Content-Security-Policy ``<meta>`` first (``CSP``: no script, no request of any kind,
  images only from ``data:``, inline styles), the charset, the title as text, and the template's own
  stylesheets (the course's styling) with every ``url(...)`` replaced by ``none`` and ``@import`` removed.

SVG outputs are dropped (an SVG document can carry script and links; only bitmap images are shown), and so are
outputs of types the page does not show as themselves (JavaScript, widgets), each leaving a one-line notice.

Bounds (``cap_markup``, before the template runs): a markdown cell or a markdown, HTML or LaTeX output longer
than ``MARKUP_CHARS`` characters, any such text once a notebook's total passes ``NOTEBOOK_MARKUP_CHARS``, and
an image over ``IMAGE_CHARS`` base64 characters are replaced by a short notice (parsing deeply nested unclosed
tags takes time quadratic in their number: measured in html5lib, bleach's parser, and in html5ever, nh3's).
Each student's page is made in a child process (``python -m moe_course.course.feedback``) watched by
``generate``: one that takes longer than its time limit is killed and gets a one-line "feedback skipped: ..."
page; the others go on in a new child.
"""

from __future__ import annotations

import html
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

MARKUP_CHARS = 20_000  # one markdown cell or markdown/HTML/LaTeX output (the course's longest cell: ~1,000)
NOTEBOOK_MARKUP_CHARS = 100_000  # all of a notebook's markdown and markup outputs together
IMAGE_CHARS = 4 * 2**20  # base64 characters of one image output (3 MiB of PNG)
FEEDBACK_SECONDS = 60  # per student, once the child process has started
STARTUP_SECONDS = 120  # for the child process to import nbgrader and nbconvert
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
MARKUP_TYPES = ("text/markdown", "text/html", "text/latex")
SHOWN_TYPES = ("text/plain", *MARKUP_TYPES, *IMAGE_TYPES)  # what an output may keep
TAGS = {
    "a", "abbr", "b", "blockquote", "br", "caption", "center", "code", "col", "colgroup", "dd", "del", "details",
    "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins",
    "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp", "section", "small", "span", "strike", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "tt", "u", "ul", "var"}
ATTRIBUTES = {
    "*": {"class", "id", "title", "style", "align", "lang", "dir"},
    "a": {"href", "name"}, "img": {"src", "alt", "width", "height"}, "ol": {"start", "type"},
    "td": {"colspan", "rowspan"}, "th": {"colspan", "rowspan", "scope"}, "col": {"span"}, "colgroup": {"span"}}
STYLE_PROPERTIES = {
    "color", "background-color", "font-weight", "font-style", "font-size", "font-family", "text-align",
    "text-decoration", "vertical-align", "white-space", "width", "height", "max-width", "max-height", "margin",
    "margin-left", "margin-right", "margin-top", "margin-bottom", "padding", "padding-left", "padding-right",
    "padding-top", "padding-bottom", "border", "border-collapse", "display"}
STUDENT_REGION = "moe-course-student-work"  # class of the region the cells are drawn in
# Nothing in the region, nor any markdown cell or output, paints outside its own box (see the module docstring).
REGION_CSS = (f".{STUDENT_REGION}, .text_cell_render, .output_subarea {{ overflow: hidden; contain: paint; "
              "isolation: isolate; }")
_NEGATIVE_MARGIN = re.compile(r"margin[\w-]*\s*:[^;]*-\s*[\d.]", re.I)
_HEADER_END = '<div class="panel-body">'  # where nbgrader's feedback template starts the notebook's cells
_DATA_IMAGE = re.compile(r"data:(image/(?:png|jpeg|gif|webp));base64,[A-Za-z0-9+/=\s]*", re.I)
_NUMBER = re.compile(r"\d{1,5}(\.\d{1,3})?(px|%)?")
_CSS_FETCH = re.compile(r"url\s*\(|image-set\s*\(|expression\s*\(|@import|\\", re.I)
_CSS_URL = re.compile(r"url\s*\(\s*(\"[^\"]*\"|'[^']*'|[^)]*)\)", re.I)
_STYLE = re.compile(r"<style[^>]*>(.*?)</style\s*>", re.I | re.S)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.I | re.S)


def _keep_attribute(element: str, attribute: str, value: str) -> str | None:
    """nh3's attribute filter: ``value`` if it may stay on ``element`` (see the module docstring), else None."""
    if attribute == "href":
        return value if value.startswith("#") else None
    if attribute == "src":
        return value if element == "img" and _DATA_IMAGE.fullmatch(value.strip()) else None
    if attribute == "style":
        return None if _CSS_FETCH.search(value) or _NEGATIVE_MARGIN.search(value) else value
    if attribute in ("width", "height"):
        return value if _NUMBER.fullmatch(value.strip()) else None
    return value


def _inert_css(css: str) -> str:
    """The template's own stylesheet with nothing to fetch: ``url(...)`` -> ``none``, ``@import`` lines out."""
    css = re.sub(r"@import[^;]*;", "", css, flags=re.I)
    return _CSS_URL.sub("none", css).replace("</", "<\\/")


def page_head(title: str, css=()) -> str:
    """A page's ``<head>``: the CSP ``<meta>`` first, the charset, ``title`` (escaped), the stylesheets ``css``
    and, last, ``REGION_CSS``."""
    styles = "".join(f"<style>\n{_inert_css(sheet)}\n</style>\n" for sheet in [*css, REGION_CSS])
    return (f'<head>\n<meta http-equiv="Content-Security-Policy" content="{CSP}">\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n{styles}</head>\n")


def sanitize_page(page: str) -> str:
    """A whole feedback page made inert (see the module docstring): the head rebuilt from the template's
    title and stylesheets, the grade header and the cells each cleaned by nh3, the cells in ``STUDENT_REGION``.
    ``page`` is the template's output (str); returns the page as str, starting with ``<!DOCTYPE html>``."""
    import nh3

    def clean(markup: str) -> str:
        return nh3.clean(markup, tags=TAGS, clean_content_tags=set(), attributes=ATTRIBUTES,
                         attribute_filter=_keep_attribute, url_schemes={"data"}, link_rel=None,
                         filter_style_properties=STYLE_PROPERTIES, strip_comments=True)

    start = re.search(r"<body[\s>]", page, re.I)
    head, body = (page[:start.start()], page[start.start():]) if start else ("", page)
    title = _TITLE.search(head)
    title = html.unescape(re.sub(r"<[^>]*>", "", title.group(1))).strip() if title else "feedback"
    split = max(body.find(_HEADER_END), 0)
    return (f"<!DOCTYPE html>\n<html>\n{page_head(title, _STYLE.findall(head))}<body>\n{clean(body[:split])}\n"
            f'<div class="container {STUDENT_REGION}">\n{clean(body[split:])}\n</div>\n</body>\n</html>\n')


def skipped_page(reason: str) -> str:
    """The one-line page a student gets when their feedback could not be made: "feedback skipped: ``reason``"."""
    return (f"<!DOCTYPE html>\n<html>\n{page_head('feedback skipped')}<body>\n"
            f"<p>feedback skipped: {html.escape(reason)}</p>\n</body>\n</html>\n")


def feedback_exporter():
    """nbconvert's HTMLExporter (with nbgrader's feedback template, as GenerateFeedback configures it) whose
    output is ``sanitize_page`` of what the template wrote (a class made on first use: nbconvert is imported
    only with the instructor extra)."""
    from nbconvert.exporters import HTMLExporter

    class FeedbackExporter(HTMLExporter):
        def from_notebook_node(self, nb, resources=None, **kw):
            output, resources = super().from_notebook_node(nb, resources=resources, **kw)
            return sanitize_page(output), resources

    return FeedbackExporter


def _notice(what: str, size: int, limit: int) -> str:
    return f"[{what} of {size:,} characters not shown in the feedback: at most {limit:,}]"


def cap_markup(notebook, resources):
    """nbgrader preprocessor, before the template: replace every markdown cell, markdown/HTML/LaTeX output or
    image that is over its bound (module docstring) by a one-line notice, and every output type outside
    ``SHOWN_TYPES`` (SVG, JavaScript, widgets) by a notice naming it; the notebook's widget state (metadata the
    template would dump into the page as text) is dropped."""
    notebook.metadata.pop("widgets", None)
    total = 0

    def over(text, what: str) -> str | None:
        nonlocal total
        size = len(text) if isinstance(text, str) else sum(len(line) for line in text)
        total += size
        if size > MARKUP_CHARS:
            return _notice(what, size, MARKUP_CHARS)
        if total > NOTEBOOK_MARKUP_CHARS:
            return _notice(what, size, 0) + f" (the notebook's markup passed {NOTEBOOK_MARKUP_CHARS:,} characters)"
        return None

    for cell in notebook.cells:
        if cell.cell_type == "markdown" and (notice := over(cell.source, "markdown cell")):
            cell.source, cell.attachments = notice, {}
        for output in cell.get("outputs", []):
            data = output.get("data")
            if not isinstance(data, dict):
                continue
            notices = [f"[{kind} output not shown in the feedback]" for kind in data if kind not in SHOWN_TYPES]
            for kind in [k for k in data if k not in SHOWN_TYPES]:
                del data[kind]
            for kind in [k for k in data if k in MARKUP_TYPES]:
                if notice := over(data[kind], f"{kind} output"):
                    notices.append(notice)
                    del data[kind]
            for kind in [k for k in data if k in IMAGE_TYPES]:
                size = len(data[kind]) if isinstance(data[kind], str) else IMAGE_CHARS + 1
                if size > IMAGE_CHARS:
                    notices.append(_notice(f"{kind} output", size, IMAGE_CHARS))
                    del data[kind]
            if notices:
                data["text/plain"] = "\n".join(notices)
    return notebook, resources


def hide_hidden_tracebacks(notebook, resources):
    """nbgrader preprocessor for feedback: in every cell that holds hidden tests, replace each error's
    traceback (which quotes the failing source line) by its one-line ``ename: evalue``."""
    for cell in notebook.cells:
        if cell.cell_type == "code" and "BEGIN HIDDEN TESTS" in cell.source:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output['ename']}: {output['evalue']}"]
    return notebook, resources


INSTRUCTOR_NOTE = "Graded by the instructor ({points:g} points): not part of the autograded score at the top."


def mark_instructor_cells(notebook, resources):
    """nbgrader preprocessor for feedback, after GetGrades: every explain cell (a graded markdown cell) gets the
    comment INSTRUCTOR_NOTE, and the page's total is the autograded score out of the autogradable points (the
    explain cells' points taken out of GetGrades' ``max_score``)."""
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown" and meta.get("grade"):
            meta["comment"] = INSTRUCTOR_NOTE.format(points=float(meta.get("points") or 0))
            if "max_score" in resources.get("nbgrader", {}):
                resources["nbgrader"]["max_score"] -= float(meta.get("points") or 0)
    return notebook, resources


def _generate_one(course_dir: Path, assignment: str, student: str) -> str:
    """Write one student's page with nbgrader's API (in this process); returns "" or why it failed."""
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.apps import NbGraderAPI
    from nbgrader.preprocessors import ClearHiddenTests, GetGrades

    from moe_course.course.config import nbgrader_config
    from moe_course.course.worker import record_paths

    db, _ = record_paths(course_dir, assignment, student)
    config = nbgrader_config(course_dir, db=db)
    config.GenerateFeedback.preprocessors = [GetGrades, mark_instructor_cells, hide_hidden_tracebacks,
                                             ClearHiddenTests, cap_markup, CSSHTMLHeaderPreprocessor]
    config.GenerateFeedback.exporter_class = feedback_exporter()
    outcome = NbGraderAPI(config=config).generate_feedback(assignment, student)
    if outcome["success"]:
        return ""
    lines = [line for line in (outcome.get("error") or "nbgrader failed").strip().splitlines() if line.strip()]
    return f"nbgrader could not make it ({lines[-1][:200] if lines else 'no reason given'})"


def page_path(course_dir: Path, assignment: str, student: str) -> Path:
    """Where a student's feedback page is written: ``feedback/<student>/<assignment>/<assignment>.html``."""
    from moe_course.course.config import course_paths

    return course_paths(course_dir)["feedback"] / student / assignment / f"{assignment}.html"


def _write_skipped(course_dir: Path, assignment: str, student: str, reason: str) -> Path:
    path = page_path(course_dir, assignment, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(skipped_page(reason))
    return path


def generate(course_dir: Path, assignment: str, students, seconds: int = FEEDBACK_SECONDS) -> dict[str, Path]:
    """Feedback pages for ``students`` (graded submissions of ``assignment``), each made in a child process
    in at most ``seconds`` (wall clock, once the child has started; positive int): a student whose page is
    not made in time, or whose child dies, gets ``skipped_page`` with the reason, and the rest go on in a
    fresh child. Returns {student: page path} for every student (made or skipped). Raises ValueError for
    ``seconds`` that is not a positive integer."""
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 1:
        raise ValueError(f"seconds={seconds!r} is not allowed; use a positive integer (per-student feedback limit)")
    pending, pages = list(students), {}
    while pending:
        command = [sys.executable, "-m", "moe_course.course.feedback", str(Path(course_dir).resolve()), assignment,
                   *pending]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        read = _line_reader(child.stdout)
        try:
            ready = read(STARTUP_SECONDS)
            if ready != "ready":
                raise RuntimeError(f"the feedback process did not start ({ready or 'no answer'} in "
                                   f"{STARTUP_SECONDS} s)")
            while pending:
                line = read(seconds)
                student = pending.pop(0)
                if line is None:
                    reason = (f"took longer than {seconds} s" if child.poll() is None
                              else f"the feedback process ended with code {child.returncode}")
                    pages[student] = _write_skipped(course_dir, assignment, student, reason)
                    break
                done = json.loads(line)
                pages[student] = (page_path(course_dir, assignment, student) if not done["error"] else
                                  _write_skipped(course_dir, assignment, student, done["error"]))
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            child.stdout.close()
    return pages


def _line_reader(stream):
    """``read(timeout)``: the stream's next line (str, stripped), or None at its end or after ``timeout`` seconds
    without one."""
    buffer = bytearray()

    def read(timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stream], [], [], left)[0]:
                return None
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                return None
            buffer.extend(chunk)
        end = buffer.index(b"\n")
        line = bytes(buffer[:end])
        del buffer[:end + 1]
        return line.decode(errors="replace").strip()

    return read


def main(argv=None) -> int:
    """Child process: ``python -m moe_course.course.feedback COURSE_DIR ASSIGNMENT STUDENT...`` prints "ready",
    then one JSON line {"student", "error"} per student as its page is written ("" when it was)."""
    course_dir, assignment, *students = sys.argv[1:] if argv is None else argv
    import nbgrader.apps  # noqa: F401  (imported before "ready": the per-student limit covers no import)

    channel = os.fdopen(os.dup(1), "w")  # the parent's pipe; whatever else prints goes to /dev/null
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    print("ready", file=channel, flush=True)
    for student in students:
        try:
            error = _generate_one(Path(course_dir), assignment, student)
        except Exception as exception:  # this student's page only
            error = f"{type(exception).__name__}: {str(exception)[:200]}"
        print(json.dumps({"student": student, "error": error}), file=channel, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
