"""Assignments and automatic grading for instructors, on nbgrader's Python API (``pip install -e ".[instructor]"``).

solutions/NN_slug.py (py:percent + nbgrader cell metadata) --build--> nbgrader source .ipynb --release-->
exercises/NN_slug.ipynb; submissions --collect--> submitted/ --autograde (grading kernel, one process per
student)--> gradebooks/ --feedback--> HTML, --export--> grades.csv. See ``instructor.cli`` for the commands,
``inside.guard`` for what protects a grade from the code it grades, and ``instructor.grade`` for why one
submission cannot harm another.

Three rooms, each a sub-package whose docstring says what it may import: ``inside`` (what runs in the grading
sandbox), ``limits`` (the sandbox, its limits and the grading worker; imports ``inside``) and ``instructor``
(what the instructor runs and sees; imports both). No room imports one listed after it, and no module imports
itself back (tests/test_course_imports.py walks the imports).
"""
