"""The operating-system sandbox every grading kernel runs in: bubblewrap (``bwrap``, the sandbox Flatpak uses).

The grading kernelspec (``moe_course.course.kernel.write_kernelspec`` with ``sandbox=True``) starts
``python -m moe_course.course.sandbox CONNECTION_FILE`` in place of the kernel. That launcher runs in the
grading worker's process tree, outside the sandbox: it copies the submission's folder (nbgrader starts the
kernel in it) into the worker's private scratch folder and replaces itself with ``bwrap``, which runs
``prlimit ... python -m moe_course.course.kernel`` with

- its own user, PID, IPC, network, UTS and cgroup namespaces (``--unshare-all``): no network at all, no view
  of any process outside (so no ``/proc/<pid>/mem``, no signals to the grader or other students), an
  unprivileged uid (65534) with no capabilities, a new terminal session, killed with its parent;
- a file system of only: the system's ``/usr`` and ``/lib*`` read-only, the Python installation read-only,
  in place of the ``moe_course`` package a runtime of three modules (``runtime_package``: the kernel, its
  guard and ``answers``, no course library -- so no reference routine to call or compare with, whether the
  package is installed or editable), the assignment's checks file (``/grading/checks.py``, read-only), the
  folder the hidden tests write their answers to (``/grading/answers``), the private writable copy of the
  submission's folder at the submission's own path, this kernel's connection file (read-only) and its
  socket folder, a fresh ``/tmp``, ``/dev`` and ``/proc``. The course folder, the gradebook, the
  solutions, ``.git``, other students, the grader's other sockets and connection files are not in it;
- a cleared environment (only what the kernel needs) and limits set by ``prlimit`` (util-linux) before
  Python starts: address space, CPU seconds, file size, open files, processes (threads count) and no core.

Wall clock and output size are bounded outside, by the worker (``worker.CappedExecute``) and the batch.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from moe_course.course.answers import ANSWERS_ENV, CHECKS_ENV, SEED_ENV

SCRATCH_ENV = "MOE_COURSE_SANDBOX_SCRATCH"  # set by the worker: its private folder for this submission
SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
MAX_PROCESSES = 512  # processes and threads of the kernel (XLA starts a thread pool per core)
MAX_OPEN_FILES = 1024
INSTALL_HINT = ("bubblewrap (bwrap) is needed to grade submissions in a sandbox: install it with "
                "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora), or grade in "
                "the container of docs/Containerfile; `--no-sandbox` grades without it (recorded in "
                "grades.csv)")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group")
_KERNEL_ENV = ("MPLBACKEND", "JAX_PLATFORMS", "XLA_FLAGS", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL", SEED_ENV)
ANSWERS_INSIDE, CHECKS_INSIDE = "/grading/answers", "/grading/checks.py"
RUNTIME_MODULES = ("course/kernel.py", "course/guard.py", "course/answers.py")  # all of moe_course inside


def unavailable() -> str | None:
    """None when ``bwrap`` is installed and can create its namespaces here; else why not (one line)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    try:
        probe = subprocess.run(["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap does not run: {err}"
    if probe.returncode != 0:
        return f"bwrap cannot create its namespaces here: {probe.stderr.strip()[:200]}"
    return None


def package_folder() -> Path:
    """The ``moe_course`` package folder the grader itself imports (bound read-only into the sandbox)."""
    import moe_course

    return Path(moe_course.__file__).resolve().parent


def python_folders() -> list[Path]:
    """The Python installation the kernel needs (read-only inside): this interpreter's prefixes, which hold
    its standard library and site-packages."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return sorted(prefixes)


def runtime_package(target: Path) -> Path:
    """Write the ``moe_course`` the sandbox gets into ``target``: RUNTIME_MODULES and empty package files."""
    package = package_folder()
    for module in RUNTIME_MODULES:
        (target / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / module, target / module)
    for init in ("__init__.py", "course/__init__.py"):
        (target / init).write_text('"""The grading sandbox\'s runtime: no course library here."""\n')
    return target


def bwrap_argv(home: Path, private_home: Path, connection_file: Path, sockets: Path, *, runtime: Path,
               answers: Path, checks: Path, memory_bytes: int, cpu_seconds: int, file_size_bytes: int,
               env: dict[str, str]) -> list[str]:
    """The ``bwrap`` command that runs the grading kernel (see the module docstring).

    home: the submission's folder (where nbgrader starts the kernel; the path it has inside the sandbox);
    private_home: its writable copy, bound there; connection_file: this kernel's (read-only inside);
    sockets: the folder of its Unix sockets (writable); runtime: the ``runtime_package`` bound where the
    ``moe_course`` package is; answers: the folder for ``answers.record`` (writable); checks: the checks
    file; memory_bytes, cpu_seconds, file_size_bytes: the limits (bytes, s, bytes); env: the kernel's whole
    environment besides PATH, HOME, PYTHONPATH and the answers' variables.
    """
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--clearenv"]
    for folder in _SYSTEM:
        if os.path.islink(folder):
            argv += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    # Fresh /proc, /dev and /tmp first: a later bind lands on top, so a Python or package that lives under
    # /tmp (a CI clone, say) is still visible inside.
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    for folder in python_folders():
        argv += ["--ro-bind", str(folder), str(folder)]
    package = package_folder()
    argv += ["--ro-bind", str(runtime), str(package),
             "--bind", str(answers), ANSWERS_INSIDE, "--ro-bind", str(checks), CHECKS_INSIDE,
             "--bind", str(sockets), str(sockets),
             "--ro-bind", str(connection_file), str(connection_file),
             "--bind", str(private_home), str(home), "--chdir", str(home)]
    environment = {**env, "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "MPLCONFIGDIR": "/tmp",
                   "PYTHONPATH": str(package.parent), "PYTHONNOUSERSITE": "1",
                   ANSWERS_ENV: ANSWERS_INSIDE, CHECKS_ENV: CHECKS_INSIDE}
    for name, value in sorted(environment.items()):
        argv += ["--setenv", name, value]
    argv += ["--", "prlimit", f"--as={memory_bytes}", f"--cpu={cpu_seconds}", f"--fsize={file_size_bytes}",
             f"--nofile={MAX_OPEN_FILES}", f"--nproc={MAX_PROCESSES}", "--core=0", "--",
             sys.executable, "-m", "moe_course.course.kernel", "-f", str(connection_file)]
    return argv


def private_copy(home: Path, target: Path) -> Path:
    """Copy the regular files and folders of ``home`` into ``target`` (links and special files are left out)."""
    target.mkdir(parents=True, exist_ok=False)
    for entry in home.iterdir():
        mode = entry.lstat().st_mode
        if stat.S_ISREG(mode):
            shutil.copyfile(entry, target / entry.name)
        elif stat.S_ISDIR(mode):
            private_copy(entry, target / entry.name)
    return target


def main(argv: list[str] | None = None) -> None:
    """Launcher (the kernelspec's argv): ``python -m moe_course.course.sandbox CONNECTION_FILE``; execs bwrap."""
    from moe_course.course import guard

    connection_file = Path((sys.argv[1:] if argv is None else argv)[0]).resolve()
    scratch = os.environ.get(SCRATCH_ENV)
    if not scratch:
        raise SystemExit(f"{SCRATCH_ENV} is not set: the sandboxed kernel is started by moe_course.course.worker")
    home = Path.cwd().resolve()
    private_home = private_copy(home, Path(scratch) / f"home-{os.getpid()}")
    env = {name: os.environ[name] for name in (*_KERNEL_ENV, guard.PROTECT_ENV, guard.MEMORY_ENV, guard.CPU_ENV)
           if name in os.environ}
    runtime = runtime_package(Path(scratch) / f"runtime-{os.getpid()}")
    command = bwrap_argv(home, private_home, connection_file, Path(scratch) / "ipc", runtime=runtime,
                         answers=Path(os.environ[ANSWERS_ENV]), checks=Path(os.environ[CHECKS_ENV]),
                         memory_bytes=int(env.get(guard.MEMORY_ENV, guard.DEFAULT_MEMORY_BYTES)),
                         cpu_seconds=int(env.get(guard.CPU_ENV, guard.DEFAULT_CPU_SECONDS)),
                         file_size_bytes=guard.FILE_SIZE_BYTES, env=env)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
