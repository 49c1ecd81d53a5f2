"""The ``moe-course`` console command: start the process with transparent huge pages for large allocations.

XLA:CPU gives every large activation, gradient and temporary buffer fresh memory on each step, and Linux
faults in and zeroes that memory 4 KiB at a time. glibc >= 2.35 can ask for transparent huge pages for its
large allocations instead (tunable ``glibc.malloc.hugetlb=1``). The setting is read when a process starts, so
the command re-executes itself once with it before anything heavy is imported. It changes where memory comes
from, not the program XLA compiles: results are identical. Measured on a 2-core machine (benchmarks/README.md,
issue 11): a V-MoE training run 86 s instead of 113 s, the LIMoE recipe 314 s instead of 450 s.

``MOE_COURSE_HUGE_PAGES=0`` keeps the process as started. Nothing happens off Linux, with another C library,
with glibc older than 2.35, when the kernel's transparent huge pages are ``never``, or when GLIBC_TUNABLES
already sets ``glibc.malloc.hugetlb``.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "MOE_COURSE_HUGE_PAGES"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _glibc_at_least(version: str, wanted: tuple[int, int] = (2, 35)) -> bool:
    try:
        return tuple(int(part) for part in version.split(".")[:2]) >= wanted
    except ValueError:
        return False


def _thp_allowed(setting: str | None) -> bool:
    """True unless the kernel's THP mode (e.g. ``always [madvise] never``) selects ``never``; None = unknown."""
    return setting is not None and "[never]" not in setting


def huge_pages_environment(environ: dict[str, str], system: str, libc: tuple[str, str],
                           thp_setting: str | None) -> dict[str, str] | None:
    """The environment to re-execute with, or None to run as started.

    environ: the current environment. system: ``platform.system()``. libc: ``platform.libc_ver()``, e.g.
    ("glibc", "2.36"). thp_setting: the text of /sys/kernel/mm/transparent_hugepage/enabled, None if unreadable.
    The returned copy of ``environ`` has ``glibc.malloc.hugetlb=1`` appended to GLIBC_TUNABLES (other tunables kept).
    """
    tunables = environ.get("GLIBC_TUNABLES", "")
    if (environ.get(OPT_OUT) == "0" or system != "Linux" or libc[0] != "glibc" or not _glibc_at_least(libc[1])
            or not _thp_allowed(thp_setting) or TUNABLE in tunables):
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))}


def reexec_with_huge_pages() -> None:
    """Replace this process by the same command line started with huge pages, when ``huge_pages_environment``
    says so (same PID, arguments and standard streams); otherwise return. An exec that fails is ignored."""
    try:
        thp_setting = THP_SETTING.read_text()
    except OSError:
        thp_setting = None
    env = huge_pages_environment(dict(os.environ), platform.system(), platform.libc_ver(), thp_setting)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return


def main() -> int:
    """Entry point of the ``moe-course`` console command (see ``moe_course.cli.main``)."""
    reexec_with_huge_pages()
    from moe_course.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
