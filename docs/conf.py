"""Sphinx configuration of the course website: chapters executed by myst-nb, API reference from docstrings.

Build (docs/website.md): ``sphinx-build -b html docs docs/_build/html``. Settings read from the
environment: ``MOE_COURSE_SITE_EXECUTE`` -- ``all`` (default), ``none``, or chapter stems separated by commas
(``02_moe_layer``): which chapters run; the others are rendered without outputs, and every page says which.
``MOE_COURSE_REPOSITORY`` -- the repository's address (``https://github.com/OWNER/moe-course``), the one setting
for everything that points at it: the header's repository link, the ``git clone`` line and Binder link on each
chapter page, and where the first cell of a downloaded chapter installs the course from. Unset: none of these.
"""

import importlib.util
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import course_site  # noqa: E402  (docs/_ext/course_site.py)

# A site build never starts the chapters' full-scale cells, whatever the shell says, and draws inline figures.
for name in ("MOE_COURSE_FULL_SCALE", "MPLBACKEND"):
    os.environ.pop(name, None)

project = "moe-course"
author = "the moe-course authors"
html_title = "moe-course"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.mathjax", "course_site"]

# Chapter and API pages are generated into the source tree (course_site.generate_sources); git ignores them.
course_site.generate_sources(DOCS)

exclude_patterns = ["_build", "_ext", "conf.py", "**/.ipynb_checkpoints", "**/jupytext.toml"]
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
myst_enable_extensions = ["dollarmath", "colon_fence"]
nb_render_markdown_format = "myst"  # markdown outputs (the chapters' seed tables) get tables, as the pages do
myst_heading_anchors = 3

# Execution: jupyter-cache keyed on each chapter's code, so a rebuild runs only the chapters that changed.
nb_execution_mode = "cache"
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
course_executed = course_site.executed_chapters(os.environ.get("MOE_COURSE_SITE_EXECUTE", "all"))
nb_execution_excludepatterns = course_site.execution_excludes(course_executed)
nb_execution_in_temp = True  # chapters write runs/ into a fresh temporary folder, never into docs/
nb_execution_timeout = 1800  # seconds per cell (a loaded 2-core machine trains chapter 3 for ~15 minutes)
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# A widget needs a live kernel: course_site replaces its output by a note (the figure it drives stays), and
# no widget JavaScript is loaded (it would come from a CDN).
nb_ipywidgets_js = {}

# The grading package's API page comes from its docstrings also where nbgrader (the instructor extra) is not
# installed (README's learner installs): autodoc then imports moe_course.course against a stand-in for it.
autodoc_mock_imports = [] if importlib.util.find_spec("nbgrader") else ["nbgrader"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Strict: every cross reference must resolve (tests/test_site.py builds with -n -W). Types from other
# libraries have no pages here (no intersphinx: the build works offline), so their names are not links.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(jax|jnp|np|numpy|flax|nnx|optax|orbax|torch|typing|collections|"
                                   r"dataclasses|pathlib|tqdm|matplotlib|PIL|concurrent|argparse|abc|enum|os|transformers|"
                                   r"jaxlib|nbformat|traitlets|nbgrader|contextlib|grain|ast|zmq|jupyter_client|t)(\..*)?"),
                        # type variables of generic helpers
                        (r"py:class", r"moe_course\.(train\.concurrent\.[TR]|checks\.Config)")]

course_repository = os.environ.get("MOE_COURSE_REPOSITORY", "").strip()

html_theme = "sphinx_book_theme"
# One search field, in the sidebar (the theme also puts one in a header bar of its own). The download button
# offers a chapter's .ipynb (course_site.write_downloads); with course_repository set, course_site adds the
# repository link.
html_theme_options = {"show_toc_level": 2, "use_download_button": True, "navbar_persistent": []}
html_favicon = "_static/favicon.svg"
html_last_updated_fmt = None
html_static_path = ["_static"]
html_css_files = ["course.css"]
