"""What runs inside the grading sandbox: the grading kernel (``kernel``), the guard it arms before every cell
(``guard``), the recorder the hidden tests call (``answers``, with ``compare``, which judges an answer where no
grader does: a learner's own run of a hidden test) and the helpers every assignment's setup cell imports
(``notebook``: predictions kept as first written, arrays compared).

May import: the standard library, NumPy (and JAX, IPython's kernel where the kernel runs), and modules of this
room -- nothing else of ``moe_course``. The sandbox gets exactly ``kernel``, ``guard``, ``answers`` and ``notebook`` of it
(``limits.sandbox.RUNTIME_MODULES``), so an import of another room would fail there.
"""
