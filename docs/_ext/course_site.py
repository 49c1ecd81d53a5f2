"""Sphinx extension of the course website: finds the chapters and library packages, adds to every chapter page
how to open it in JupyterLab and links to the API pages of what it imports, and replaces widget outputs
(which need a live kernel) by a note.

Nothing here lists chapters or packages by hand: every ``chapters/NN_slug.py`` becomes a page under
``chapters/`` and every package or module of ``moe_course`` an API page, so a new chapter or subpackage appears
on the next build. A chapter the toctree misses, or an import a chapter makes that has no API entry, fails a
strict build (``-n -W``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import posixpath
import re
from pathlib import Path

import jupytext
import nbformat
from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.osutil import relative_uri
from sphinx.util.inspect import signature as sphinx_signature, stringify_signature

REPO = Path(__file__).resolve().parents[2]
CHAPTER_GLOB = "[0-9][0-9]_*.py"
# API pages in the order data flows through the library (DESIGN.md); packages not named here follow,
# alphabetically, so a new subpackage needs no edit.
API_ORDER = ["data", "configs", "routing", "layers", "models", "train", "parallel", "analysis", "viz", "torch",
             "reference"]
WIDGET_NOTE = ("An interactive control (a slider) stands here in the notebook. It moves only with a running Jupyter kernel (open the chapter in JupyterLab, see the "
               "top of this page); on this page the figure below is drawn at its starting value.")


def chapter_files(repo: Path = REPO) -> list[Path]:
    """Every chapter, ``chapters/NN_slug.py``, sorted by number."""
    return sorted((repo / "chapters").glob(CHAPTER_GLOB))


def executed_chapters(setting: str) -> list[str]:
    """The chapter stems a build executes for ``MOE_COURSE_SITE_EXECUTE``: ``all`` every chapter, ``none`` none,
    a comma-separated list of chapter stems (``02_moe_layer,05_soft_moe``) only those.

    Raises ValueError naming the setting for a stem that is not a chapter."""
    setting = setting.strip()
    stems = [path.stem for path in chapter_files()]
    if setting == "all":
        return stems
    if setting == "none":
        return []
    wanted = [s.strip() for s in setting.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in stems]
    if unknown or not wanted:
        raise ValueError(f"MOE_COURSE_SITE_EXECUTE={setting!r} is not allowed; use 'all', 'none' or chapter stems "
                         f"separated by commas, from: {', '.join(stems)}")
    return [stem for stem in stems if stem in wanted]


def execution_excludes(executed: list[str]) -> list[str]:
    """myst-nb ``nb_execution_excludepatterns`` that leave only the ``executed`` chapters to run."""
    stems = [path.stem for path in chapter_files()]
    if not executed:
        return ["*"]
    return [f"*/chapters/{stem}.py" for stem in stems if stem not in executed]


def api_packages() -> list[str]:
    """The top-level packages and modules of ``moe_course``, one API page each, in reading order."""
    import moe_course

    names = [info.name for info in pkgutil.iter_modules(moe_course.__path__)]
    return sorted(names, key=lambda n: (API_ORDER.index(n) if n in API_ORDER else len(API_ORDER), n))


def _modules_under(name: str) -> list[str]:
    """``moe_course.<name>`` and, for a package, every module below it (imported, so errors surface here)."""
    module = importlib.import_module(f"moe_course.{name}")
    found = [module.__name__]
    if hasattr(module, "__path__"):
        found += sorted(info.name for info in pkgutil.walk_packages(module.__path__, prefix=module.__name__ + "."))
    return found


def _api_page(name: str) -> str:
    """reStructuredText of one API page: the package's docstring and what it exports, then every module below
    it with its members. Each object is documented once, in the module that defines it; a package's exports
    link there."""
    modules = _modules_under(name)
    package = importlib.import_module(modules[0])
    title = f"moe_course.{name}"
    # :ignore-module-all: documents only what a module defines itself, never its re-exports.
    lines = [title, "=" * len(title), "", f".. automodule:: {modules[0]}", "   :ignore-module-all:", ""]
    exported = getattr(package, "__all__", [])
    if exported and len(modules) > 1:
        links = []
        for attribute in exported:
            role, target = _target(getattr(package, attribute), package.__name__)
            links.append(f":{role}:`{attribute} <{target}>`" if target != package.__name__ else f"``{attribute}``")
        lines += [f"Import these from ``{package.__name__}``: " + ", ".join(links) + ".", ""]
    for module in modules[1:]:
        lines += [module, "-" * len(module), "", f".. automodule:: {module}", "   :ignore-module-all:", ""]
    return "\n".join(lines)


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:  # unchanged files keep their mtime: no rebuild
        path.write_text(text)


def generate_sources(docs: Path) -> None:
    """Link every chapter into ``docs/chapters/`` and write ``docs/api/*.rst``; remove stale generated files."""
    chapters_dir, api_dir = docs / "chapters", docs / "api"
    chapters_dir.mkdir(exist_ok=True)
    api_dir.mkdir(exist_ok=True)
    chapters = chapter_files()
    for stale in chapters_dir.iterdir():
        if stale.name not in {c.name for c in chapters}:
            stale.unlink()
    for chapter in chapters:
        link = chapters_dir / chapter.name
        target = os.path.relpath(chapter, chapters_dir)
        if not (link.is_symlink() and os.readlink(link) == target):
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    pages = api_packages()
    for stale in api_dir.glob("*.rst"):
        if stale.stem not in pages + ["index"]:
            stale.unlink()
    for name in pages:
        _write_if_changed(api_dir / f"{name}.rst", _api_page(name))
    index = ["API reference", "=============", "",
             "Generated from the docstrings of the ``moe_course`` library: shapes, dtypes, errors and the paper",
             "section each function implements. Each page holds one package, module by module.", "",
             ".. toctree::", "   :maxdepth: 1", ""] + [f"   {name}" for name in pages]
    _write_if_changed(api_dir / "index.rst", "\n".join(index) + "\n")


def _code_of(cell) -> str:
    # IPython magics and shell escapes are not Python; they import nothing from the library.
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


def _target(obj, imported_from: str) -> tuple[str, str]:
    """(role, target) of the API entry documenting ``obj``: where it is defined, not where it was imported from."""
    if inspect.ismodule(obj):
        return "py:mod", obj.__name__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and module.startswith("moe_course") and (inspect.isclass(obj) or callable(obj)):
        return "py:obj", f"{module}.{qualname}"
    return "py:mod", imported_from  # a constant (a dict of presets, a tuple of names): its module's page


def library_uses(notebook) -> dict[str, list[tuple[str, str, str]]]:
    """What a chapter takes from ``moe_course``: {module imported from: [(name, role, target), ...]}, found by
    parsing its code cells. Raises SyntaxError for a code cell that is not Python."""
    uses: dict[str, dict[str, tuple[str, str]]] = {}
    aliases: dict[str, str] = {}  # local name -> library module

    def add(module_name, attribute):
        obj = getattr(importlib.import_module(module_name), attribute)
        uses.setdefault(module_name, {})[attribute] = _target(obj, module_name)

    trees = [ast.parse(_code_of(cell)) for cell in notebook.cells if cell.cell_type == "code"]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "moe_course":
            for alias in node.names:
                obj = getattr(importlib.import_module(node.module), alias.name)
                if inspect.ismodule(obj):
                    aliases[alias.asname or alias.name] = obj.__name__
                add(node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "moe_course" and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module_name = aliases[node.value.id]
            if hasattr(importlib.import_module(module_name), node.attr):
                add(module_name, node.attr)
    return {module: [(name, *uses[module][name]) for name in sorted(uses[module])] for module in sorted(uses)}


def _markdown_cell(lines: list[str]):
    return nbformat.v4.new_markdown_cell("\n".join(lines))


def launch_links(repository: str, stem: str) -> list[str]:
    """Markdown lines with the repository's links for chapter ``stem``: ``git clone``, for a GitHub repository
    Binder (JupyterLab on the chapter, built from environment.yml and postBuild), and how to open the downloaded
    chapter in Colab (Colab opens only notebooks tracked on GitHub; the chapters' notebooks are not). Empty
    without a repository address (conf.py ``course_repository``)."""
    if not repository:
        return []
    lines = ["", "Get the whole course with", "", "```bash", f"git clone {repository}", "```"]
    github = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", repository)
    if github:
        binder = (f"https://mybinder.org/v2/gh/{github[1]}/{github[2]}/HEAD"
                  f"?urlpath=lab/tree/chapters/{stem}.ipynb")
        lines += ["", f"or run it without installing anything: [launch on Binder]({binder}) (a hosted JupyterLab; "
                  "the first start takes minutes)."]
    lines += ["", "In Google Colab: *File -> Upload notebook* and choose the downloaded chapter; its first cell "
              "installs the course from this repository."]
    return lines


def chapter_cells(stem: str, notebook, executed: bool = True, repository: str = "",
                  exercise: bool = False) -> tuple[object, object]:
    """The two cells added to a chapter's page: how to get and open it (after the title cell) and links to the
    API of everything it imports from the library (at the end). ``executed``: whether this build ran the
    chapter (the page says so); ``repository``: conf.py ``course_repository``; ``exercise``: whether
    ``exercises/<stem>.ipynb`` exists (a download link for it)."""
    path = f"chapters/{stem}.py"
    shown = (f"This page is `{path}`, executed when this site was built: its figures and numbers come from that run."
             if executed else
             f"This page is `{path}` **without outputs**: this build of the site did not execute it "
             "(`MOE_COURSE_SITE_EXECUTE`), so no figures or printed numbers appear below.")
    # raw HTML links: the notebooks are files of the built site (write_downloads), not documents MyST resolves
    downloads = (f'<a class="notebook-download" href="../_sources/chapters/{stem}.ipynb" download>{stem}.ipynb</a> '
                 "(this chapter as a notebook; its first cell installs the course where it is missing, as in a "
                 "hosted notebook)")
    if exercise:
        downloads += (f' and the exercise <a class="notebook-download" href="../_sources/exercises/{stem}.ipynb" '
                      f'download>{stem}.ipynb</a> (see exercises/README.md)')
    run = _markdown_cell([
        "````{admonition} Run this chapter yourself",
        ":class: tip",
        shown,
        "",
        f"Download: {downloads}.",
        *launch_links(repository, stem),
        "",
        "In a clone of the repository, after the {doc}`/install`, start JupyterLab in the repository's folder "
        "(its file browser then holds `chapters/`; `moe-course exercise NN` puts your copy of an exercise in "
        "`mywork/`):",
        "",
        "```bash",
        "jupyter lab",
        "```",
        "",
        f"then open `chapters/`, right-click `{stem}.py` and choose *Open With -> Notebook*. Without "
        f"JupyterLab, `jupytext --to ipynb {path}` writes a notebook for any Jupyter front end. "
        f"Sliders and other widgets move only there. Close it with *File -> Close and Shut Down Notebook*: a "
        f"closed tab keeps its kernel running, and reopening the chapter starts a second one. The library "
        f"functions this chapter uses are listed {{ref}}`at the end <api-used-{stem}>`.",
        "````",
    ])
    lines = [f"(api-used-{stem})=", "## Library API used in this chapter", "",
             "Everything this chapter imports from `moe_course`, linked to its entry in the {doc}`/api/index`:", ""]
    for module, entries in library_uses(notebook).items():
        links = ", ".join(f"{{{role}}}`{name} <{target}>`" for name, role, target in entries)
        lines.append(f"- `{module}`: {links}")
    return run, _markdown_cell(lines)


EXECUTED_NOTE = "<!-- executed-note -->"
# A chapter links a site page or shows a diagram by its path from chapters/ (``](../docs/routers.md)``,
# ``](../docs/_static/diagrams/02_moe_layer.svg)``), which JupyterLab resolves; the page sits in docs/chapters/.
DOCS_LINK = re.compile(r"\]\(\.\./docs/")
# [text](../docs/glossary.md#term-X): in JupyterLab it opens the glossary's text; on the site a {term} reference
GLOSSARY_LINK = re.compile(r"\[([^\]]+)\]\(\.\./docs/glossary\.md#(term-[\w.-]+)\)")


def glossary_anchor(term: str) -> str:
    """The anchor Sphinx gives a glossary entry: ``term-`` and the term, each run of other characters as ``-``
    (``TOP-k`` -> ``term-TOP-k``, ``recall@k`` -> ``term-recall-k``)."""
    return "term-" + re.sub(r"[^A-Za-z0-9._]+", "-", term).strip("-")


def glossary_terms(path: Path = REPO / "docs" / "glossary.md") -> dict[str, str]:
    """Every term of the glossary page (an unindented line of its ``{glossary}`` block), by its anchor."""
    block = path.read_text(encoding="utf-8").split("```{glossary}", 1)[1].split("\n```", 1)[0]
    names = [line for line in block.splitlines() if line and not line[0].isspace() and not line.startswith(":")]
    return {glossary_anchor(name): name for name in names}


def executed_note(executed: list[str], chapters: list[str]) -> str:
    """The home page's sentence on which chapters this build shows executed."""
    if set(chapters) <= set(executed):
        return ("Every chapter below is shown executed: its figures, tables and printed numbers come from running "
                "the chapter's notebook on two CPU cores when this site was built.")
    if not executed:
        return ("This build of the site executed no chapter: the chapters below show their text and code "
                "without outputs (figures and printed numbers appear when you run them).")
    return (f"This build of the site executed {', '.join(executed)} only (figures, tables and printed numbers from "
            "running them when the site was built); the other chapters show their text and code without outputs.")


def add_chapter_cells(app, docname: str, source: list[str]) -> None:
    """``source-read``: put the download and JupyterLab instructions and the API links into a chapter's notebook
    text; on the home page, say which chapters this build executed."""
    executed = list(app.config.course_executed)
    if docname == "index":
        source[0] = source[0].replace(EXECUTED_NOTE, executed_note(executed, [c.stem for c in chapter_files()]))
    if not docname.startswith("chapters/"):
        return
    notebook = jupytext.reads(source[0], fmt="py:percent")
    stem = docname.split("/", 1)[1]
    run, api = chapter_cells(stem, notebook, executed=stem in executed, repository=app.config.course_repository,
                             exercise=(REPO / "exercises" / f"{stem}.ipynb").is_file())
    terms = glossary_terms()
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = GLOSSARY_LINK.sub(
                lambda m: f"{{term}}`{m[1]} <{terms[m[2]]}>`" if m[2] in terms else m[0], cell.source)
            cell.source = DOCS_LINK.sub("](../", cell.source)  # an unknown glossary anchor then fails the build
    first_markdown = next((i for i, c in enumerate(notebook.cells) if c.cell_type == "markdown"), -1)
    notebook.cells.insert(first_markdown + 1, run)
    notebook.cells.append(api)
    source[0] = jupytext.writes(notebook, fmt="py:percent")


def install_cell_source(repository: str) -> str:
    """The first cell of a downloaded chapter: installs the course library where it cannot be imported (a
    hosted notebook: Colab, Binder, a fresh Jupyter), from ``repository`` (a git URL or a local folder);
    without one it stops with a line saying how to install. Does nothing in a clone with the install done."""
    if repository.startswith(("https://", "http://", "git@")):
        requirement = f"moe-course @ git+{repository}"
    else:
        requirement = repository
    lines = [
        "# Installs the course library `moe_course` when this notebook runs where it is missing (a hosted notebook",
        "# such as Colab or Binder, or a fresh Jupyter); in a clone with the course installed it does nothing.",
        "# In JupyterLab close the notebook with File -> Close and Shut Down Notebook: a closed tab keeps its kernel",
        "# (and its memory) running, and opening the notebook again starts a second one.",
        "import importlib.util",
        "import subprocess",
        "import sys",
        "",
        'if importlib.util.find_spec("moe_course") is None:',
    ]
    if requirement:
        lines += [f"    print('installing {requirement} (a few minutes)...')",
                  f"    subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', {requirement!r}], check=True)",
                  "    importlib.invalidate_caches()"]
    else:
        lines += ["    raise ModuleNotFoundError('moe_course is not installed: clone the course repository and run '",
                  "                              '`pip install -e .` in it (README, Install)')"]
    return "\n".join(lines)


def downloadable_notebook(path: Path, repository: str = ""):
    """A chapter (``chapters/NN_slug.py``) or exercise (``exercises/NN_slug.ipynb``) as the notebook a learner
    downloads: its own cells after an install cell (:func:`install_cell_source`). Raises FileNotFoundError for a
    missing file."""
    notebook = jupytext.read(path) if path.suffix == ".py" else nbformat.read(path, as_version=4)
    cell = nbformat.v4.new_code_cell(install_cell_source(repository))
    cell.metadata["tags"] = ["install"]
    notebook.cells.insert(0, cell)
    notebook.metadata.pop("jupytext", None)
    return notebook


def write_downloads(app) -> None:
    """``builder-inited`` (HTML builders): every chapter and exercise as a downloadable notebook under
    ``_sources/chapters/`` and ``_sources/exercises/`` of the site, where the theme's download button and the
    chapter pages link."""
    if app.builder.format != "html":
        return
    out = Path(app.outdir) / "_sources"
    for folder, paths in (("chapters", chapter_files()), ("exercises", sorted((REPO / "exercises").glob("*.ipynb")))):
        (out / folder).mkdir(parents=True, exist_ok=True)
        for path in paths:
            nbformat.write(downloadable_notebook(path, app.config.course_repository),
                           out / folder / f"{path.stem}.ipynb")


def offer_notebook_download(app, pagename, templatename, context, doctree) -> None:
    """``html-page-context``, before the theme's buttons: a chapter page's download button offers its .ipynb."""
    if pagename.startswith("chapters/"):
        context["ipynb_source"] = f"{pagename}.ipynb"


def use_repository(app, config) -> None:
    """``config-inited``: with ``course_repository`` set, the theme shows the repository link in the header.

    Raises ValueError naming MOE_COURSE_REPOSITORY for an address that is neither an http(s) or git URL nor a
    folder."""
    repository = config.course_repository
    if repository and not (repository.startswith(("https://", "http://", "git@")) or Path(repository).is_dir()):
        raise ValueError(f"MOE_COURSE_REPOSITORY={repository!r} is not allowed; use the repository's https or git "
                         "URL (https://github.com/OWNER/moe-course) or a local folder")
    if config.course_repository:
        config.html_theme_options = {**config.html_theme_options, "repository_url": config.course_repository,
                                     "use_repository_button": True}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


_LITERAL = re.compile(r"(``.+?``|:\w+:`[^`]+`)")  # inline code and roles: left as written
_TABLE_BORDER = re.compile(r"^=+( +=+)+$")


def _escape(text: str) -> str:
    """Plain text for reStructuredText: ``|``, ``*`` and a trailing ``_`` would start substitutions,
    emphasis and references; inline code (double backquotes) and roles stay markup."""
    parts = _LITERAL.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"(\w)_\b", r"\1\\_", re.sub(r"([\\|*])", r"\\\1", parts[i]))
    return "".join(parts)


def plain_text_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    """``autodoc-process-docstring``: the library's docstrings are plain text, laid out by hand (a shape per
    line, hanging indents, lists right under a sentence, tables of ``=`` borders). Show them as written:
    each line as a line of a reStructuredText line block (indentation kept; a line that only goes on with the
    sentence before it joins it), lines starting with "- " as a bullet list, tables and ``::`` examples as
    preformatted blocks; inline code in double backquotes and roles still render. So no docstring needs reStructuredText care to pass the strict build."""
    out: list[str] = []
    literal_indent, table_borders = None, 0
    for line in lines:
        if table_borders:  # inside a table: preformatted until its closing border (the third)
            out.append("    " + line)
            table_borders += bool(_TABLE_BORDER.match(line.strip()))
            if table_borders == 3:
                table_borders = 0
                out.append("")
            continue
        if literal_indent is not None:  # the indented example after "::"
            if not line.strip() or _indent(line) > literal_indent:
                out.append(line)
                continue
            literal_indent = None
            out.append("")
        if not line.strip():
            out.append("")
        elif _TABLE_BORDER.match(line.strip()):
            out += ["", "::", "", "    " + line]
            table_borders = 1
        elif line.rstrip().endswith("::"):
            out += ["", "| " + " " * _indent(line) + _escape(line.strip()[:-2]) + ":", "", "::", ""]
            literal_indent = _indent(line)
        elif _continues(out, line):
            out[-1] += " " + _escape(line.strip())
        else:
            out.append("| " + " " * _indent(line) + _escape(line.strip()))
    lines[:] = _bullet_lists(out)


_ITEM = re.compile(r"^\| ( *)- (.*)$")


def _bullet_lists(out: list[str]) -> list[str]:
    """Line block lines that start with "- " become a reStructuredText bullet list (blank lines around it, one
    more indent level per indented run), so a docstring's list renders as a list."""
    result: list[str] = []
    previous_indent = None  # indentation of the list item just emitted, None after another line
    for line in out:
        item = _ITEM.match(line)
        if item:
            if result and result[-1] and previous_indent != item[1]:
                result.append("")
            result.append(f"{item[1]}- {item[2]}")
            previous_indent = item[1]
            continue
        if previous_indent is not None and line:
            result.append("")
        result.append(line)
        previous_indent = None
    return result


_FIELD = re.compile(r"^[\w.\[\]]+(?: \w+)?: ")  # "x: (batch, tokens) ...", "Raises ValueError: ..."


def _continues(out: list[str], line: str) -> bool:
    """Whether ``line`` goes on with the sentence of the line block line before it (same indentation, starts
    in lower case, is no "name: ..." field, the line before does not end in a colon): then it joins that line,
    so that the browser wraps the sentence at the page's width instead of at the source's line breaks. A line
    indented two more than a "- " item before it is that item's hanging indent and joins it too."""
    if not out or not out[-1].startswith("| "):
        return False
    before = out[-1][2:]
    text = line.strip()
    if before.lstrip().startswith("- ") and _indent(line) == _indent(before) + 2 and not text.startswith("- "):
        return True
    return (_indent(before) == _indent(line) and text[:1].islower() and not _FIELD.match(text)
            and not before.rstrip().endswith(":"))


def skip_namedtuple_fields(app, what, name, obj, skip, options):
    """``autodoc-skip-member``: a NamedTuple's fields are documented in its docstring; Python's generated
    "Alias for field number 0" entries would only repeat their names."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def qualify_annotations(app, what, name, obj, options, signature, return_annotation):
    """``autodoc-process-signature``: a string annotation Python cannot evaluate here (it names a type imported
    only for type checkers) stays as written, so ``ViT`` would be ambiguous between the JAX and PyTorch
    classes. Write each library class by its full name, as the module's own globals resolve it.
    A Flax NNX module's class signature is its metaclass's ``(*args, **kwargs)``: show ``__init__``'s instead."""
    module = inspect.getmodule(obj)
    if module is None or not module.__name__.startswith("moe_course"):
        return None
    if what == "class" and signature == "(*args: Any, **kwargs: Any)" and "__init__" in vars(obj):
        signature = stringify_signature(sphinx_signature(obj.__init__, bound_method=True),
                                        show_return_annotation=False)

    def full(match):
        value = vars(module).get(match.group(0))
        if inspect.isclass(value) and value.__module__.startswith("moe_course"):
            return f"{value.__module__}.{value.__qualname__}"
        return match.group(0)

    return (_NAME.sub(full, signature) if signature else signature,
            _NAME.sub(full, return_annotation) if return_annotation else return_annotation)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class WidgetNote(SphinxPostTransform):
    """Replace each widget output (a slider, ...) by a note: on a static page it cannot move, and its
    JavaScript would come from a CDN. The figure the widget drives is a separate output and stays, drawn at
    the widget's starting value. Runs before myst-nb picks one mime type per output (its priority 4)."""

    default_priority = 3

    def run(self, **kwargs) -> None:
        for bundle in list(self.document.findall(nodes.container)):
            if bundle.get("nb_element") != "mime_bundle":
                continue
            kinds = {child.get("mime_type"): child for child in bundle.children}
            if WIDGET_VIEW not in kinds:
                continue
            bundle.replace_self(nodes.note("", nodes.paragraph("", WIDGET_NOTE)))


class FullSizeFigures(SphinxPostTransform):
    """Link each figure of a chapter's output, and each architecture diagram (``_static/diagrams/``, on chapter
    pages and the routers page), to its full-size image: the article column is narrower than many figures (1390
    px wide ones at 1280 px), so a click opens the image at its natural size. Runs after myst-nb has picked the
    image output (its priority 4) and before the HTML builder copies images to ``_images``."""

    default_priority = 5
    formats = ("html",)

    def run(self, **kwargs) -> None:
        images_dir = relative_uri(self.app.builder.get_target_uri(self.env.docname), "_images")
        for image in list(self.document.findall(nodes.image)):
            diagram = "_static/diagrams/" in image["uri"]
            if isinstance(image.parent, nodes.reference) or not (diagram or _in_cell_output(image)):
                continue
            uri = image["uri"]
            if uri not in self.env.images:
                continue
            link = nodes.reference("", "", internal=True, classes=["full-size-figure"],
                                   refuri=posixpath.join(images_dir, self.env.images[uri][1]),
                                   reftitle="full size")
            image.replace_self(link)
            link.append(image)


def _in_cell_output(node) -> bool:
    while node is not None:
        if isinstance(node, nodes.container) and node.get("nb_element") == "cell_code_output":
            return True
        node = node.parent
    return False


def setup(app):
    app.connect("source-read", add_chapter_cells)
    app.connect("autodoc-process-docstring", plain_text_docstring)
    app.connect("autodoc-process-signature", qualify_annotations)
    app.connect("autodoc-skip-member", skip_namedtuple_fields)
    app.add_post_transform(WidgetNote)
    app.add_post_transform(FullSizeFigures)
    # conf.py sets both: which chapters this build executes, the repository's address ("" when unknown)
    app.add_config_value("course_executed", [], "env")
    app.add_config_value("course_repository", "", "env")
    app.connect("config-inited", use_repository)
    app.connect("builder-inited", write_downloads)
    app.connect("html-page-context", offer_notebook_download, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
