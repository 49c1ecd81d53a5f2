"""What runs inside the grading sandbox: the grading kernel (``kernel``), the guard it arms before every cell
(``guard``) and the recorder the hidden tests call (``answers``, with ``compare``, which judges an answer where no
grader does: a learner's own run of a hidden test).

May import: the standard library, NumPy (and JAX, IPython's kernel where the kernel runs), and modules of this
room -- nothing else of ``moe_course``. The sandbox gets exactly ``kernel``, ``guard`` and ``answers`` of it
(``limits.sandbox.RUNTIME_MODULES``), so an import of another room would fail there.
"""
