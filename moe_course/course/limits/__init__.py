"""The sandbox and its limits, and the grading worker that runs one submission inside them: bubblewrap
(``sandbox``), per-submission cgroups and the jobs x memory check (``budget``), bounded reads (``bounded``), the
output cap and reply deadlines (``output_cap``), the worker process (``worker``), the grader's verdict from the
recorded answers (``verdict``), the checks file the sandbox gets (``inputs``) and the course's paths and limits
(``config``).

May import: the standard library, the grading stack (nbgrader, nbclient, jupyter_client, zmq, NumPy), modules of
this room and of ``moe_course.course.inside`` -- never ``moe_course.course.instructor``.
"""
