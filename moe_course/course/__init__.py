"""Assignments and automatic grading for instructors, on nbgrader's Python API (``pip install -e ".[instructor]"``).

solutions/NN_slug.py (py:percent + nbgrader cell metadata) --build--> nbgrader source .ipynb --release-->
exercises/NN_slug.ipynb; submissions --collect--> submitted/ --autograde (grading kernel, one process per
student)--> gradebooks/ --feedback--> HTML, --export--> grades.csv. See ``cli`` for the commands, ``guard``
for what protects a grade from the code it grades, and ``grade`` for why one submission cannot harm another.
"""
