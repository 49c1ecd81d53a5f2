"""What the instructor runs and sees: releasing assignments (``build``, ``shared_code``), collecting
submissions (``collect``), grading a batch (``grade``), suspicious-code flags (``flags``), feedback pages
(``feedback``) and the ``moe-course course`` command (``cli``).

May import: anything of ``moe_course`` and the libraries of the instructor extra, including the modules of
``moe_course.course.limits`` and ``moe_course.course.inside``; no module of those rooms imports this one.
"""
