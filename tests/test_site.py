"""The course website (docs/, docs/website.md) builds strictly and works in a real browser.

One build serves every test: ``sphinx-build -n -W --keep-going`` (any warning fails it: a broken cross
reference, a docstring reStructuredText cannot read, a page missing from the table of contents), with only
chapter 2 executed (``MOE_COURSE_SITE_EXECUTE``; about a minute on two cores) and the other chapters rendered
without outputs. Headless Chromium (Debian's package, driven over the DevTools protocol by playwright) then
loads pages from a static server on 127.0.0.1.
"""

import functools
import html
import http.server
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jupytext
import pytest

pytest.importorskip("myst_nb", reason="the website needs the docs extra: pip install -e '.[docs]'")
pytest.importorskip("torch", reason="the website documents the PyTorch twins (moe_course.torch): it needs torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import course_site  # noqa: E402  (docs/_ext/course_site.py)
from headless_chromium import browser_context  # noqa: E402
from test_chapters import CHAPTERS, FIGURES  # noqa: E402

EXECUTED = "00_jax_primer"  # the cheapest chapter (about 15 s; chapter 2 takes 45)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "MOE_COURSE_SITE_EXECUTE": EXECUTED}
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q", "docs", str(out / "html"),
         "-d", str(out / "doctrees"), "-D", f"nb_execution_cache_path={out / 'jupyter_cache'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"site build failed:\n{result.stderr[-8000:]}"
    return out / "html"


def _html(site: Path, page: str) -> str:
    return (site / page).read_text(encoding="utf-8")


def _text(site: Path, page: str) -> str:
    """A page's text as a reader sees it (tags removed, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", _html(site, page)))


def test_every_chapter_is_a_page_in_the_table_of_contents(site):
    index = _html(site, "index.html")
    assert CHAPTERS
    for chapter in CHAPTERS:
        assert (site / "chapters" / f"{chapter.stem}.html").is_file(), chapter.stem
        assert f'href="chapters/{chapter.stem}.html"' in index, f"{chapter.stem} is not in the index's toctree"


def test_every_library_package_has_an_api_page(site):
    import moe_course

    packages = {info.name for info in pkgutil.iter_modules(moe_course.__path__)}
    assert {"routing", "layers", "models", "train", "analysis", "torch"} <= packages
    api_index = _html(site, "api/index.html")
    for name in packages:
        page = _html(site, f"api/{name}.html")
        assert f'href="{name}.html"' in api_index, name
        assert f'id="module-moe_course.{name}"' in page, name


def test_api_pages_hold_docstrings_with_shapes(site):
    page = _html(site, "api/routing.html")
    assert 'id="moe_course.routing.router.top_k_routing"' in page
    assert "(groups, tokens, k) int32" in page  # RouterOutput's documented shapes, rendered
    assert "Batch Prioritized Routing" in page


def test_chapter_pages_say_how_to_open_them_and_link_the_api_they_use(site):
    for chapter in CHAPTERS:
        page, text = _html(site, f"chapters/{chapter.stem}.html"), _text(site, f"chapters/{chapter.stem}.html")
        assert "Run this chapter yourself" in text, chapter.stem
        assert "start JupyterLab in the repository" in text and "Open With -> Notebook" in text
        assert f"jupytext --to ipynb chapters/{chapter.stem}.py" in text
        uses = course_site.library_uses(jupytext.read(chapter))
        assert uses, f"{chapter.stem} imports nothing from moe_course?"
        for entries in uses.values():
            for name, role, target in entries:
                anchor = f"module-{target}" if role == "py:mod" else target
                assert re.search(rf'href="\.\./api/\w+\.html#{re.escape(anchor)}"', page), (
                    f"{chapter.stem}: no link to the API entry of {name} ({target})")


def test_the_executed_chapter_shows_its_figures_as_images(site):
    page = _html(site, f"chapters/{EXECUTED}.html")
    sources = re.findall(r'<img[^>]+src="\.\./(_images/[^"]+\.png)"', page)
    assert len(sources) >= FIGURES[EXECUTED], sources
    for source in sources:
        assert (site / source).stat().st_size > 1000, source
    assert 'class="output stream highlight-myst-ansi notranslate"' in page or "cell_output" in page


def test_a_widget_output_becomes_a_note():
    """On a static page a slider cannot move: its output (a mime bundle holding the widget view) becomes a note
    that says so; other outputs are left alone."""
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.utils import new_document

    def bundle(**outputs):
        node = nodes.container(nb_element="mime_bundle")
        for mime_type, text in outputs.items():
            node += nodes.container("", nodes.literal_block(text, text), mime_type=mime_type)
        return node

    document = new_document("chapter")
    slider = "FloatSlider(value=0.25, description='C', max=1.5, min=0.05, step=0.05)"
    document += bundle(**{"text/plain": slider, course_site.WIDGET_VIEW: '{"model_id": "abc"}'})
    document += bundle(**{"text/plain": "<Figure size 640x480 with 2 Axes>", "image/png": "..."})
    course_site.WidgetNote.run(SimpleNamespace(document=document))
    notes = list(document.findall(nodes.note))
    assert len(notes) == 1 and notes[0].astext() == course_site.WIDGET_NOTE  # no "FloatSlider(value=..." repr
    assert "FloatSlider" not in course_site.WIDGET_NOTE
    assert [c["mime_type"] for c in document.children[1].children] == ["text/plain", "image/png"]


def test_docstring_lines_keep_their_layout_but_sentences_flow():
    """A sentence broken over source lines becomes one line of the line block (the browser wraps it at the
    page's width); a shape per line, lines after a colon and indented lines keep their own line; "- " lines
    become a bullet list, an item's hanging indent joining it."""
    lines = ["Routing as pure functions, built step by", "step, with the papers' literal loops.",
             "x: (groups, tokens, dim) float32", "gates: (groups, tokens, k), summing", "  to 1 over the k choices",
             "Two ways:", "- vanilla (Algorithm 1): tokens in order;", "- BPR: by priority, highest",
             "first.", "", "Raises ValueError for an unknown name.", "Modes:", "- one that goes", "  on", "Done."]
    course_site.plain_text_docstring(None, "function", "f", None, {}, lines)
    assert lines == ["| Routing as pure functions, built step by step, with the papers' literal loops.",
                     "| x: (groups, tokens, dim) float32", "| gates: (groups, tokens, k), summing",
                     "|   to 1 over the k choices", "| Two ways:", "", "- vanilla (Algorithm 1): tokens in order;",
                     "- BPR: by priority, highest first.", "", "| Raises ValueError for an unknown name.",
                     "| Modes:", "", "- one that goes on", "", "| Done."]


def test_a_chapter_that_fails_names_itself_and_its_cell(tmp_path):
    """A chapter whose cell raises fails the build, and the message names the chapter and the cell."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("_build", "chapters", "api"))
    shutil.copy(ROOT / "README.md", tmp_path)  # pages include README's and benchmarks/README.md's text
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "README.md", tmp_path / "benchmarks")
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "01_broken.py").write_text(
        "# %% [markdown]\n# # Broken\n\n# %%\nx = 1\n\n# %%\nraise RuntimeError('the claim no longer holds')\n")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-q", "docs", "html", "-D",
         f"nb_execution_cache_path={tmp_path / 'cache'}", "-D", "exclude_patterns=_build,_ext,conf.py,api/*"],
        cwd=tmp_path, env={**os.environ, "MOE_COURSE_SITE_EXECUTE": "all"}, capture_output=True, text=True,
        timeout=600)
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert "01_broken" in message and "raise RuntimeError('the claim no longer holds')" in message, message[-4000:]


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with browser_context(tmp_path_factory.mktemp("chromium-profile"), viewport={"width": 1280, "height": 900}) as context:
        yield context


def _loaded_images(page) -> list[int]:
    page.wait_for_load_state("load")
    return page.evaluate("[...document.images].map(img => img.complete ? img.naturalWidth : 0)")


def test_browser_loads_the_index_and_a_chapter_with_its_figures(server, browser, tmp_path):
    page = browser.new_page()
    page.goto(f"{server}/index.html")
    assert page.title().startswith("moe-course"), page.title()
    assert all(width > 0 for width in _loaded_images(page))
    page.goto(f"{server}/chapters/{EXECUTED}.html")
    assert page.title().startswith("Chapter 0"), page.title()
    widths = _loaded_images(page)
    page.screenshot(path=str(tmp_path / "chapter.png"))
    assert len(widths) >= FIGURES[EXECUTED] and all(width > 0 for width in widths), widths
    page.close()


def test_browser_search_finds_the_chapter(server, browser):
    page = browser.new_page()
    page.goto(f"{server}/index.html")
    page.keyboard.press("Control+k")  # the theme's search dialog, as a reader opens it
    query = page.locator("input[name='q']:visible").first
    query.fill("Batch Prioritized Routing")
    query.press("Enter")
    page.wait_for_url("**/search.html?q=*")
    hit = page.locator("#search-results a[href*='chapters/03_vmoe_bpr.html']").first
    hit.wait_for(timeout=30_000)
    assert "Chapter 3" in hit.inner_text()
    page.close()


def test_every_output_figure_links_to_its_full_size_image(site):
    """The article column is narrower than many figures: each figure of a cell's output is a link to its image."""
    page = _html(site, f"chapters/{EXECUTED}.html")
    figures = re.findall(r'<a class="full-size-figure[^"]*" href="([^"]+)"[^>]*>\s*<img[^>]+src="([^"]+)"', page)
    outputs = re.findall(r'<img[^>]+src="\.\./_images/', page)
    assert len(figures) == len(outputs) >= FIGURES[EXECUTED], (figures, len(outputs))
    assert all(href == src for href, src in figures), figures


def test_diagrams_routers_page_and_glossary(site):
    """Each model chapter's page shows its diagram (docs/_static/diagrams, linked to its full size) and links the
    routers page and the glossary; the routers page shows every diagram; a chapter's glossary link reaches an
    entry of the glossary page."""
    diagrams = sorted(p.stem for p in (ROOT / "docs" / "_static" / "diagrams").glob("*.svg"))
    routers, glossary = _html(site, "routers.html"), _html(site, "glossary.html")
    for name in diagrams:
        assert (site / "_images" / f"{name}.svg").is_file(), name
        assert re.search(rf'<a class="full-size-figure[^"]*" href="_images/{name}\.svg"', routers), name
    for chapter in CHAPTERS:
        page = _html(site, f"chapters/{chapter.stem}.html")
        terms = set(re.findall(r'href="\.\./glossary\.html#(term-[\w.-]+)"', page))
        assert terms and all(f'id="{term}"' in glossary for term in terms), (chapter.stem, terms)
        if chapter.stem in diagrams:
            assert re.search(rf'href="\.\./_images/{chapter.stem}\.svg"[^>]*>\s*<img[^>]+src="\.\./_images/'
                             rf'{chapter.stem}\.svg"', page), chapter.stem
            assert 'href="../routers.html"' in page, chapter.stem


def test_chapter_pages_offer_notebook_downloads(site):
    """Each chapter page links its notebook and its exercise's; the files are in the site, and a chapter's first
    cell is the install cell."""
    import nbformat

    for chapter in CHAPTERS:
        page = _html(site, f"chapters/{chapter.stem}.html")
        links = [f"../_sources/chapters/{chapter.stem}.ipynb"]
        if (ROOT / "exercises" / f"{chapter.stem}.ipynb").is_file():
            links.append(f"../_sources/exercises/{chapter.stem}.ipynb")
        for link in links:
            assert f'href="{link}"' in page, f"{chapter.stem}: no link to {link}"
            notebook = nbformat.read(site / "chapters" / link, as_version=4)
            assert "install" in notebook.cells[0].metadata["tags"], link
            nbformat.validate(notebook)
        assert sum(cell.cell_type == "code" for cell in notebook.cells) > 1


def test_pages_say_which_chapters_this_build_executed(site):
    for chapter in CHAPTERS:
        text = _text(site, f"chapters/{chapter.stem}.html")
        executed = "executed when this site was built" in text
        without = "without outputs: this build of the site did not execute it" in text
        assert (executed, without) == ((True, False) if chapter.stem == EXECUTED else (False, True)), chapter.stem
    index = _text(site, "index.html")
    assert f"This build of the site executed {EXECUTED} only" in index
    assert "Every chapter below is shown executed" not in index


def _code_boxes(page) -> list[dict]:
    """Every code or output box of the page: its CSS wrapping, its lines and how many lines it renders."""
    return page.evaluate("""() => [...document.querySelectorAll('article pre')].map(pre => {
        const style = getComputedStyle(pre);
        const probe = document.createElement('span');  // one line box of the box's font and line height
        probe.style.display = 'block';
        probe.textContent = 'x';
        pre.appendChild(probe);
        const lineHeight = probe.getBoundingClientRect().height;
        probe.remove();
        const height = pre.scrollHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
        return {whiteSpace: style.whiteSpace, overflowX: style.overflowX,
                lines: pre.textContent.replace(/\\n$/, '').split('\\n').length,
                rendered: height / lineHeight, wide: pre.scrollWidth > pre.clientWidth,
                start: pre.textContent.slice(0, 60)};
    })""")


def test_browser_code_and_outputs_keep_their_lines(server, browser):
    """At 1280 px no line of code or printed output wraps (a table row stays one row): a box wider than the
    column scrolls sideways instead."""
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    for name in (f"chapters/{EXECUTED}.html", "install.html"):
        page.goto(f"{server}/{name}")
        page.wait_for_load_state("load")
        boxes = _code_boxes(page)
        assert boxes, name
        wrapped = [b for b in boxes if b["rendered"] > b["lines"] + 0.5 or b["whiteSpace"] not in ("pre", "nowrap")]
        assert not wrapped, f"{name}: wrapped lines in {wrapped[:3]}"
        hidden = [b for b in boxes if b["wide"] and b["overflowX"] not in ("auto", "scroll")]
        assert not hidden, f"{name}: a wide box cuts its lines off: {hidden[:3]}"
        if name.startswith("chapters/"):
            assert any(b["wide"] for b in boxes), "no code line wider than the column: the check would not bite"
    page.close()


def test_browser_figures_are_full_size_or_link_to_full_size(server, browser):
    """At 1280 px a figure shrunk by more than a third of its natural width is a link to its full-size image."""
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/chapters/{EXECUTED}.html")
    _loaded_images(page)
    figures = page.evaluate("""() => [...document.querySelectorAll('article img')].map(img => ({
        src: img.src, natural: img.naturalWidth, shown: img.clientWidth,
        link: img.closest('a') ? img.closest('a').href : null}))""")
    assert len(figures) >= FIGURES[EXECUTED]
    shrunk = [f for f in figures if f["shown"] < f["natural"] * 2 / 3 and f["link"] != f["src"]]
    assert not shrunk, shrunk
    page.close()


def test_browser_page_contents_do_not_clip_long_names(server, browser):
    """The right-hand contents of an API page (long module and function names) wraps them inside its column."""
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{server}/api/routing.html")
    page.wait_for_load_state("load")
    clipped = page.evaluate("""() => {
        const bar = document.querySelector('.bd-sidebar-secondary').getBoundingClientRect();
        const links = [...document.querySelectorAll('.bd-sidebar-secondary .nav-link')];
        return [links.length, links.filter(a => a.getBoundingClientRect().right > bar.right + 1
                                            || a.scrollWidth > a.clientWidth + 1).map(a => a.textContent.trim())];
    }""")
    assert clipped[0] > 10 and not clipped[1], clipped
    page.close()


def test_the_site_has_a_favicon(site):
    assert (site / "_static" / "favicon.svg").is_file()
    assert 'rel="icon" href="_static/favicon.svg"' in _html(site, "index.html")


def test_the_repository_setting_adds_clone_binder_and_the_header_link():
    """conf.py ``course_repository`` (MOE_COURSE_REPOSITORY): unset, no repository links; set, ``git clone`` and
    a Binder link to the chapter's notebook (postBuild pairs the chapters there), and the theme's repository
    button."""
    from types import SimpleNamespace

    assert course_site.launch_links("", EXECUTED) == []
    text = "\n".join(course_site.launch_links("https://github.com/owner/moe-course", EXECUTED))
    assert "git clone https://github.com/owner/moe-course" in text
    assert (f"https://mybinder.org/v2/gh/owner/moe-course/HEAD?urlpath=lab/tree/chapters/{EXECUTED}.ipynb"
            in text)
    assert "jupytext --to ipynb chapters/" in (ROOT / "postBuild").read_text()
    config = SimpleNamespace(course_repository="https://github.com/owner/moe-course",
                             html_theme_options={"show_toc_level": 2})
    course_site.use_repository(None, config)
    assert config.html_theme_options == {"show_toc_level": 2, "repository_url": "https://github.com/owner/moe-course",
                                         "use_repository_button": True}
    unset = SimpleNamespace(course_repository="", html_theme_options={"show_toc_level": 2})
    course_site.use_repository(None, unset)
    assert unset.html_theme_options == {"show_toc_level": 2}
    with pytest.raises(ValueError, match="MOE_COURSE_REPOSITORY='github.com/owner'"):
        course_site.use_repository(None, SimpleNamespace(course_repository="github.com/owner", html_theme_options={}))
