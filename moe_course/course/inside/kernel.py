"""The grading kernel: an IPython kernel that arms ``moe_course.course.inside.guard`` before it runs any cell.

``write_kernelspec`` puts its kernelspec (``moe-course-grader``) into a folder that the grading processes
add to ``JUPYTER_PATH``; nbgrader's executor then starts it for every submission instead of the notebook's
own kernel. Started as ``python -m moe_course.course.inside.kernel -f CONNECTION_FILE``, inside bubblewrap by the
launcher ``python -m moe_course.course.limits.sandbox CONNECTION_FILE`` (the kernelspec's argv unless
``sandbox=False``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

KERNEL_NAME = "moe-course-grader"


def write_kernelspec(jupyter_dir: Path, *, protect: list[Path], memory_bytes: int, cpu_seconds: int,
                     sandbox: bool = True) -> Path:
    """Write ``jupyter_dir/kernels/moe-course-grader/kernel.json``; returns the kernelspec folder.

    protect: folders submitted code may not read (the course directory, the solutions); memory_bytes: address
    space limit of the kernel (bytes); cpu_seconds: its CPU time limit (s); sandbox: start the kernel inside
    bubblewrap (``moe_course.course.limits.sandbox``; interrupts then go as messages, signals cannot reach it).
    Raises ValueError for a limit < 1.
    """
    from moe_course.course.inside import guard

    for name, value in (("memory_bytes", memory_bytes), ("cpu_seconds", cpu_seconds)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed; use a positive integer")
    folder = Path(jupyter_dir) / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    module = "moe_course.course.limits.sandbox" if sandbox else "moe_course.course.inside.kernel"
    spec = {
        "argv": [sys.executable, "-m", module, *([] if sandbox else ["-f"]), "{connection_file}"],
        "interrupt_mode": "message" if sandbox else "signal",
        "display_name": "moe-course grader (limited)",
        "language": "python",
        "env": {
            guard.PROTECT_ENV: os.pathsep.join(str(Path(p).resolve()) for p in protect),
            guard.MEMORY_ENV: str(memory_bytes),
            guard.CPU_ENV: str(cpu_seconds),
            "MPLBACKEND": "agg",
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
            "PYTHONDONTWRITEBYTECODE": "1",
            # the kernel starts in the submission's folder: import the grader's own moe_course, not another
            "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        },
    }
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
    return folder


def main(argv: list[str] | None = None) -> None:
    """Start the kernel with the guard armed (the connection file comes in ``argv`` as ``-f PATH``)."""
    from ipykernel.kernelapp import IPKernelApp

    from moe_course.course.inside import guard

    app = IPKernelApp.instance()
    # parent_handle: ipykernel's poller ends this kernel when its grading process dies (a killed batch
    # worker must not leave a kernel behind that a student's loop keeps busy).
    app.initialize([*(sys.argv[1:] if argv is None else argv), "--HistoryManager.enabled=False",
                    f"--IPKernelApp.parent_handle={os.getppid()}"])
    guard.install(app.shell)
    app.start()


if __name__ == "__main__":
    main()
