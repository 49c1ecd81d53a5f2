"""The operating-system sandbox every grading kernel runs in: bubblewrap (``bwrap``, the sandbox Flatpak uses).

The grading kernelspec (``moe_course.course.inside.kernel.write_kernelspec`` with ``sandbox=True``) starts
``python -m moe_course.course.limits.sandbox CONNECTION_FILE`` in place of the kernel. That launcher runs in the
grading worker's process tree, outside the sandbox: it copies the submission's folder (nbgrader starts the
kernel in it) into the worker's private scratch folder and replaces itself with ``bwrap``, which runs
``prlimit ... python -m moe_course.course.inside.kernel`` with

- an unprivileged host uid: a grader running as root first drops, with ``setpriv`` (util-linux), to the host
  uid the worker names (``SANDBOX_UID_ENV``: one per parallel grading slot, belonging to no user), without
  supplementary groups, capabilities or the right to gain privileges; a grader that is not root is already
  unprivileged. Inside, bubblewrap maps that uid to 65534: no capability inside maps to one outside, so
  ``/proc/sys`` and every host file not the sandbox's own stay read-only to it, and its process limit holds;
- its own user, PID, IPC, network, UTS and cgroup namespaces (``--unshare-all``): no network at all, no view
  of any process outside (so no ``/proc/<pid>/mem``, no signals to the grader or other students), a new
  terminal session, killed with its parent; the cgroup of ``budget.Cgroup`` where the worker made one;
- a file system of only: the system's ``/usr`` and ``/lib*`` read-only, the Python installation read-only,
  in place of the ``moe_course`` package a runtime of four modules (``runtime_package``: the kernel, its
  guard, ``answers`` and the notebooks' ``notebook`` helpers, no course library -- so no reference routine to call or compare with, whether the
  package is installed or editable), the assignment's checks file (``/grading/checks.py``, read-only), the
  folder the hidden tests write their answers to (``/grading/answers``), the private writable copy of the
  submission's folder at the submission's own path, this kernel's connection file (read-only) and its
  socket folder, a fresh ``/dev`` and ``/proc``, and ``/tmp`` and ``/dev/shm`` as tmpfs of TMPFS_BYTES each;
  the tmpfs bwrap builds the root ``/`` on, the one under ``/dev`` and those that hide a package
  (``hidden``, HIDDEN_TMPFS_BYTES) are read-only once the mounts are made, so none of them can be filled
  (tmpfs pages belong to no process: only a size or a read-only mount bounds them), and the sandbox may create
  no user namespace of its own (``--disable-userns``, bwrap 0.8+), in which it could mount an unsized one.
  WRITABLE_TMPFS_BYTES is what all of them can hold together. The course folder, the gradebook, the
  solutions, ``.git``, other students, the grader's other sockets and connection files are not in it;
- a cleared environment (only what the kernel needs) and limits set by ``prlimit`` (util-linux) before
  Python starts: address space, CPU seconds, file size, open files, processes (threads count) and no core.

The kernel's own stdout and stderr (which ipykernel keeps a copy of) go to a file in the scratch folder, never
to the grader: writes past the file-size limit fail. Wall clock and output size are bounded outside, by the
worker (``output_cap.CappedExecute``) and the batch.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from moe_course.course.inside.answers import ANSWERS_ENV, CHECKS_ENV, SEED_ENV
from moe_course.course.limits.budget import MAX_OPEN_FILES, MAX_PROCESSES, TMPFS_BYTES, WRITABLE_TMPFS_BYTES

SCRATCH_ENV = "MOE_COURSE_SANDBOX_SCRATCH"  # set by the worker: its private folder for this submission
SANDBOX_CHECKS_ENV = "MOE_COURSE_SANDBOX_CHECKS"  # set by the worker: the checks without references (inputs.py)
SANDBOX_UID_ENV = "MOE_COURSE_SANDBOX_UID"  # set by a root grader: the host uid the kernel runs as
SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
HIDDEN_TMPFS_BYTES = 2**16  # a tmpfs that hides a package: one empty __init__.py bound on it, then read-only
MAX_COPY_DEPTH, MAX_COPY_ENTRIES = 32, 10_000  # of the submission's folder, copied into the sandbox
KERNEL_OUTPUT = "kernel-output.log"  # in the scratch folder: the kernel's stdout and stderr
INSTALL_HINT = ("bubblewrap (bwrap) is needed to grade submissions in a sandbox: install it with "
                "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora), or grade in "
                "the container of docs/Containerfile; `--no-sandbox` grades without it (recorded in "
                "grades.csv)")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group")
_KERNEL_ENV = ("MPLBACKEND", "JAX_PLATFORMS", "XLA_FLAGS", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL", SEED_ENV)
ANSWERS_INSIDE, CHECKS_INSIDE = "/grading/answers", "/grading/checks.py"
# all of moe_course inside the sandbox: four modules of the room that runs there (not even its compare)
RUNTIME_MODULES = ("course/inside/kernel.py", "course/inside/guard.py", "course/inside/answers.py",
                   "course/inside/notebook.py")
HIDDEN_INIT = 'raise ImportError("this package is not in the grading sandbox of this assignment")\n'


def drop_privileges(uid: int | None) -> list[str]:
    """The ``setpriv`` prefix that runs a command as host ``uid`` (group ``uid``) without supplementary groups,
    capabilities or a way to regain them; [] for None (a grader that is not root)."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]


def unavailable(uid: int | None = None) -> str | None:
    """None when ``bwrap`` is installed and, run as host ``uid`` (None: as this process), can create its
    namespaces here and start this Python; else why not (one line)."""
    for tool in ("bwrap", *(["setpriv"] if uid is not None else [])):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    as_whom = "" if uid is None else f" as host uid {uid}"
    command = [*drop_privileges(uid), "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
               "--proc", "/proc", "--dev", "/dev", sys.executable, "-c", "import ipykernel"]
    try:
        probe = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap does not run{as_whom}: {err}"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines()[-1:] or ["no message"])[0][:200]
        if uid is not None and "Permission denied" in why:
            return (f"host uid {uid} cannot run {sys.executable} ({why}): a root grader runs each kernel as an "
                    "unprivileged uid, which must be able to read the Python installation -- make every folder on "
                    "its path searchable by other users (e.g. `chmod o+x /root` for a Python under /root), or "
                    "run the grader as an unprivileged user")
        return f"bwrap cannot create its namespaces or start {sys.executable}{as_whom}: {why}"
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
    for init in ("__init__.py", "course/__init__.py", "course/inside/__init__.py"):
        (target / init).write_text('"""The grading sandbox\'s runtime: no course library here."""\n')
    return target


def bwrap_argv(home: Path, private_home: Path, connection_file: Path, sockets: Path, *, runtime: Path,
               answers: Path, checks: Path, memory_bytes: int, cpu_seconds: int, file_size_bytes: int,
               env: dict[str, str], connection_copy: Path | None = None,
               hidden: tuple[list[Path], Path] = ([], Path())) -> list[str]:
    """The ``bwrap`` command that runs the grading kernel (see the module docstring).

    home: the submission's folder (where nbgrader starts the kernel; the path it has inside the sandbox);
    private_home: its writable copy, bound there; connection_file: this kernel's (read-only inside; bound from
    ``connection_copy`` when given, a copy the sandbox's host uid may read); hidden: (package folders, a file):
    each folder is replaced by an empty tmpfs whose ``__init__.py`` is that file (HIDDEN_INIT: importing the
    package raises ImportError);
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
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp",
             "--size", str(TMPFS_BYTES), "--tmpfs", "/dev/shm"]
    for folder in python_folders():
        argv += ["--ro-bind", str(folder), str(folder)]
    folders, refusal = hidden
    for folder in folders:
        argv += ["--size", str(HIDDEN_TMPFS_BYTES), "--tmpfs", str(folder),
                 "--ro-bind", str(refusal), str(folder / "__init__.py"), "--remount-ro", str(folder)]
    package = package_folder()
    argv += ["--ro-bind", str(runtime), str(package),
             "--bind", str(answers), ANSWERS_INSIDE, "--ro-bind", str(checks), CHECKS_INSIDE,
             "--bind", str(sockets), str(sockets),
             "--ro-bind", str(connection_copy or connection_file), str(connection_file),
             "--bind", str(private_home), str(home), "--chdir", str(home)]
    # Last, once every mount point exists: bwrap's own tmpfs under / and /dev read-only (not recursive: the
    # binds and the sized tmpfs on them stay as they are).
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if _bwrap_offers("--disable-userns"):
        argv[1:1] = ["--unshare-user", "--disable-userns"]
    environment = {**env, "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "MPLCONFIGDIR": "/tmp",
                   "PYTHONPATH": str(package.parent), "PYTHONNOUSERSITE": "1",
                   ANSWERS_ENV: ANSWERS_INSIDE, CHECKS_ENV: CHECKS_INSIDE}
    for name, value in sorted(environment.items()):
        argv += ["--setenv", name, value]
    argv += ["--", "prlimit", f"--as={memory_bytes}", f"--cpu={cpu_seconds}", f"--fsize={file_size_bytes}",
             f"--nofile={MAX_OPEN_FILES}", f"--nproc={MAX_PROCESSES}", "--core=0", "--",
             sys.executable, "-m", "moe_course.course.inside.kernel", "-f", str(connection_file)]
    return argv


@functools.cache
def _bwrap_offers(option: str) -> bool:
    """Whether the installed ``bwrap`` knows ``option`` (its --help lists it; bubblewrap 0.8 added
    --disable-userns)."""
    try:
        shown = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in shown.stdout + shown.stderr


def package_folders(names) -> list[Path]:
    """The folders of the installed top-level packages ``names`` (found, not imported; absent ones left out)."""
    folders = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders += [Path(p).resolve() for p in spec.submodule_search_locations]
    return folders


def private_copy(home: Path, target: Path, owner: int | None = None) -> Path:
    """Copy the regular files and folders of ``home`` into ``target``, owned by host uid ``owner`` (and group
    ``owner``) when given. Links and special files are left out, and so is what lies deeper than
    MAX_COPY_DEPTH folders or past MAX_COPY_ENTRIES entries: a submission's folder is a notebook and a few
    files, and no tree it holds can exhaust the launcher."""
    target.mkdir(parents=True, exist_ok=False)
    pending, entries = [(home, target, 0)], 0
    while pending:
        source, copy, depth = pending.pop()
        if owner is not None:
            os.chown(copy, owner, owner)
        for entry in source.iterdir():
            entries += 1
            if entries > MAX_COPY_ENTRIES:
                return target
            mode = entry.lstat().st_mode
            if stat.S_ISREG(mode):
                shutil.copyfile(entry, copy / entry.name)
                if owner is not None:
                    os.chown(copy / entry.name, owner, owner)
            elif stat.S_ISDIR(mode) and depth < MAX_COPY_DEPTH:
                (copy / entry.name).mkdir()
                pending.append((entry, copy / entry.name, depth + 1))
    return target


def main(argv: list[str] | None = None) -> None:
    """Launcher (the kernelspec's argv): ``python -m moe_course.course.limits.sandbox CONNECTION_FILE``; execs bwrap."""
    from moe_course.course.limits import budget
    from moe_course.course.inside import guard
    from moe_course.course.limits.inputs import hidden_packages

    connection_file = Path((sys.argv[1:] if argv is None else argv)[0]).resolve()
    scratch = os.environ.get(SCRATCH_ENV)
    if not scratch:
        raise SystemExit(f"{SCRATCH_ENV} is not set: the sandboxed kernel is started by "
                         "moe_course.course.limits.worker")
    uid = int(os.environ[SANDBOX_UID_ENV]) if SANDBOX_UID_ENV in os.environ else None
    budget.join_from_environment()
    home = Path.cwd().resolve()
    private_home = private_copy(home, Path(scratch) / f"home-{os.getpid()}", owner=uid)
    connection_copy = Path(scratch) / f"connection-{os.getpid()}.json"
    shutil.copyfile(connection_file, connection_copy)
    checks_copy = Path(scratch) / f"checks-{os.getpid()}.py"  # without references; bound from here, as the
    shutil.copyfile(os.environ[SANDBOX_CHECKS_ENV], checks_copy)  # course folder may be closed to that uid
    refusal = Path(scratch) / f"hidden-{os.getpid()}.py"
    refusal.write_text(HIDDEN_INIT)
    if uid is not None:
        os.chown(connection_copy, uid, uid)
    env = {name: os.environ[name] for name in (*_KERNEL_ENV, guard.PROTECT_ENV, guard.MEMORY_ENV, guard.CPU_ENV)
           if name in os.environ}
    runtime = runtime_package(Path(scratch) / f"runtime-{os.getpid()}")
    command = bwrap_argv(home, private_home, connection_file, Path(scratch) / "ipc", runtime=runtime,
                         answers=Path(os.environ[ANSWERS_ENV]), checks=checks_copy,
                         memory_bytes=int(env.get(guard.MEMORY_ENV, guard.DEFAULT_MEMORY_BYTES)),
                         cpu_seconds=int(env.get(guard.CPU_ENV, guard.DEFAULT_CPU_SECONDS)),
                         file_size_bytes=guard.FILE_SIZE_BYTES, env=env, connection_copy=connection_copy,
                         hidden=(package_folders(hidden_packages(checks_copy)), refusal))
    output = os.open(Path(scratch) / KERNEL_OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for stream in (1, 2):
        os.dup2(output, stream)
    command = [*drop_privileges(uid), *command]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
