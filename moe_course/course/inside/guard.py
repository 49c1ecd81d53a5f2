"""Protections installed inside the grading kernel before any student code runs.

A submission's code runs in the same Python process as the hidden tests that call it. Grades are not
decided there (the hidden tests only record the learner's outputs, ``answers.record``; the grader judges
them outside, ``verdict``), and the kernel runs in bubblewrap (``sandbox``). The grading kernel
(``moe_course.course.inside.kernel``) still calls ``install`` first -- the only protection left with
``--no-sandbox`` -- which sets up three layers, each for a class of hostile or broken submissions:

1. Resource limits (``resource.setrlimit``, inherited by nothing else because the kernel spawns nothing):
   address space (a memory bomb raises ``MemoryError`` in its own cell instead of waking the OOM killer),
   CPU seconds (a loop that swallows the timeout's KeyboardInterrupt still ends: SIGXCPU kills the kernel),
   file size (no disk bomb) and no core dumps.
2. A Python audit hook (PEP 578, cannot be removed once added): no reading or listing of the protected
   paths (the course directory with the gradebook and the hidden tests, the ``solutions/`` sources) except
   the submission's own folder, no writing, deleting or renaming outside that folder, and no new processes,
   signals, ``ctypes`` calls or ``os.fork`` -- each of which could step around the hook.
3. Before every cell, the modules the hidden tests use (numpy, jax, ``moe_course``, ``builtins``, ``math``)
   are put back as they were when the kernel started: replaced attributes, swapped ``sys.modules`` entries
   and rewritten function code (``f.__code__ = ...``) are undone, and IPython's error display is reset, so
   monkeypatching in an answer cell cannot change what a later hidden test records.

What this does not do: it is not an operating-system sandbox (``moe_course.course.limits.sandbox`` is: the kernel
runs in bubblewrap, where the files and processes this hook guards are absent in the first place). Code that unregisters the restore callback
(``get_ipython().events``) and then patches, code that changes objects a hidden test already holds while
the test calls it, or code that crashes the interpreter, is out of its reach; the batch
(``moe_course.course.instructor.grade``) still survives such a submission (a per-student process with a wall-clock
limit) and marks it, and ``moe_course.course.instructor.flags`` lists suspicious answer code for a human to read.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import types

MEMORY_ENV = "MOE_COURSE_GRADER_MEMORY_BYTES"
CPU_ENV = "MOE_COURSE_GRADER_CPU_SECONDS"
PROTECT_ENV = "MOE_COURSE_GRADER_PROTECT"
DEFAULT_MEMORY_BYTES = 6 * 2**30  # address space; JAX's CPU client maps ~1.5 GiB of it at start-up
DEFAULT_CPU_SECONDS = 300
FILE_SIZE_BYTES = 64 * 2**20
# Modules whose attributes and function code are restored before every cell (plus every loaded moe_course.*).
RESTORED_MODULES = ("builtins", "math", "numpy", "numpy.testing", "numpy.linalg", "numpy.random", "jax",
                    "jax.numpy", "jax.lax", "jax.nn", "jax.random", "jax.scipy.stats.norm")
_BLOCKED_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "sys.setprofile", "sys.settrace")
_WRITE_EVENTS = ("os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link",
                 "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move")
_LIST_EVENTS = ("os.listdir", "os.scandir", "glob.glob", "os.chdir")


class GradingViolation(PermissionError):
    """Raised inside the kernel when submitted code does something grading forbids (named in the message)."""


def set_limits(memory_bytes: int, cpu_seconds: int) -> None:
    """Address space ``memory_bytes`` (bytes), CPU time ``cpu_seconds`` (s), files <= 64 MiB, no core dumps."""
    for limit, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds),
                         (resource.RLIMIT_FSIZE, FILE_SIZE_BYTES), (resource.RLIMIT_CORE, 0)):
        soft, hard = resource.getrlimit(limit)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, hard))


class FilePolicy:
    """Which paths submitted code may read, list and write. ``home``: the submission's folder (read and
    write); ``protected``: folders nothing may read or list except inside ``home``; ``writable``: further
    folders that may be read and written (the answers folder of ``answers.record``); ``readable``: files or
    folders inside a protected one that may still be read (the assignment's checks file)."""

    def __init__(self, home: str, protected: list[str], writable: list[str] = (), readable: list[str] = ()):
        self.home = os.path.realpath(home)
        self.protected = [os.path.realpath(p) for p in protected if p]
        self.writable = [os.path.realpath(p) for p in writable if p]
        self.readable = [os.path.realpath(p) for p in readable if p] + self.writable

    @staticmethod
    def _inside(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)

    def _resolve(self, path) -> str | None:
        if isinstance(path, int):  # an fd that is already open
            return None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        return os.path.realpath(os.fspath(path))

    def may_read(self, path) -> bool:
        """True unless ``path`` lies in a protected folder (course folder, solutions) outside the submission's own."""
        resolved = self._resolve(path)
        if resolved is None or any(self._inside(resolved, p) for p in (self.home, *self.readable)):
            return True
        return not any(self._inside(resolved, p) for p in self.protected)

    def may_write(self, path) -> bool:
        """True only inside the submission's folder or a ``writable`` folder (and for os.devnull)."""
        resolved = self._resolve(path)
        return (resolved is None or resolved == os.devnull
                or any(self._inside(resolved, folder) for folder in (self.home, *self.writable)))


def _is_write(mode, flags) -> bool:
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))


def _interrupts_itself(event: str, args: tuple) -> bool:
    """True for SIGINT to this very process or its own group: how ipykernel carries out an interrupt that came
    as a message (the sandboxed kernel's interrupt mode; no signal reaches it from outside)."""
    own = os.getpid() if event == "os.kill" else os.getpgid(0)
    return len(args) >= 2 and args[0] == own and args[1] == signal.SIGINT


def audit_hook(policy: FilePolicy):
    """The PEP 578 hook enforcing ``policy`` and the blocked events (see the module docstring)."""
    busy = []

    def hook(event: str, args: tuple) -> None:
        if busy:  # the checks themselves call os functions
            return
        busy.append(1)
        try:
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None))[:3]
                if _is_write(mode, flags) and not policy.may_write(path):
                    raise GradingViolation(f"grading: writing {path!r} is not allowed (outside {policy.home})")
                if not policy.may_read(path):
                    raise GradingViolation(f"grading: reading {path!r} is not allowed")
            elif event in _LIST_EVENTS and args and args[0] is not None and not policy.may_read(args[0]):
                raise GradingViolation(f"grading: {event} of {args[0]!r} is not allowed")
            elif event in _WRITE_EVENTS and args and not all(policy.may_write(a) for a in args[:2]
                                                             if isinstance(a, (str, bytes, os.PathLike))):
                raise GradingViolation(f"grading: {event}{args[:2]!r} is not allowed (outside {policy.home})")
            elif event in ("os.kill", "os.killpg") and _interrupts_itself(event, args):
                pass
            elif event in _BLOCKED_EVENTS or event.startswith("ctypes."):
                raise GradingViolation(f"grading: {event} is not allowed in a graded notebook")
        finally:
            busy.pop()

    return hook


def _functions(namespace: dict) -> dict:
    return {name: (value, value.__code__, value.__defaults__, value.__kwdefaults__)
            for name, value in namespace.items() if isinstance(value, types.FunctionType)}


class ModuleSnapshot:
    """The attributes, function code and class attributes of ``names`` (and every loaded moe_course module)
    at the time of the snapshot; ``restore`` undoes any change made since (see the module docstring)."""

    def __init__(self, names=RESTORED_MODULES):
        loaded = [n for n in sys.modules if n == "moe_course" or n.startswith("moe_course.")]
        self.modules = {}
        for name in list(names) + loaded:
            module = sys.modules.get(name)
            if module is None:
                continue
            namespace = dict(vars(module))
            classes = {k: (v, dict(vars(v))) for k, v in namespace.items()
                       if isinstance(v, type) and getattr(v, "__module__", "").startswith("moe_course")}
            self.modules[name] = (module, namespace, _functions(namespace), classes)

    def restore(self) -> None:
        """Put every snapshotted module, its functions and its classes' attributes back as they were taken."""
        for name, (module, namespace, functions, classes) in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
            current = vars(module)
            for key, value in namespace.items():
                if current.get(key, _MISSING) is not value:
                    current[key] = value
            for func, code, defaults, kwdefaults in functions.values():
                if func.__code__ is not code:
                    func.__code__ = code
                if func.__defaults__ is not defaults:
                    func.__defaults__ = defaults
                if func.__kwdefaults__ is not kwdefaults:
                    func.__kwdefaults__ = kwdefaults
            for cls, attributes in classes.values():
                for key, value in attributes.items():
                    if key not in ("__dict__", "__weakref__") and vars(cls).get(key, _MISSING) is not value:
                        type.__setattr__(cls, key, value)


_MISSING = object()
_SHELL_OVERRIDES = ("showtraceback", "_showtraceback", "showsyntaxerror", "run_cell", "run_ast_nodes",
                    "run_code", "_run_cell", "run_cell_async")


def reset_shell(shell) -> None:
    """Undo what would hide a failing test: custom exception handlers, instance-level overrides of the
    shell's error display and cell execution, and a replaced ``sys.excepthook``."""
    shell.custom_exceptions = ()
    for name in _SHELL_OVERRIDES:
        shell.__dict__.pop(name, None)
    sys.excepthook = sys.__excepthook__


def install(shell, home: str | None = None) -> ModuleSnapshot:
    """Arm every protection for the kernel whose IPython shell is ``shell`` (see the module docstring).

    home: the submission's folder (default: the working directory, where nbgrader starts the kernel).
    Reads the limits and protected paths from MOE_COURSE_GRADER_* environment variables (set in the kernelspec).
    Returns the module snapshot restored before each cell.
    """
    import numpy  # noqa: F401  -- loaded now so that the snapshot holds the real modules
    import numpy.testing  # noqa: F401

    try:
        import jax  # noqa: F401
        import jax.numpy  # noqa: F401
        import jax.scipy.stats  # noqa: F401
    except ImportError:  # an assignment whose sandbox goes without JAX (moe_course.course.limits.inputs)
        pass
    import moe_course.course.inside.answers  # noqa: F401  -- what the hidden tests call

    snapshot = ModuleSnapshot()
    policy = FilePolicy(home or os.getcwd(), os.environ.get(PROTECT_ENV, "").split(os.pathsep),
                        [os.environ.get(moe_course.course.inside.answers.ANSWERS_ENV, "")],
                        [os.environ.get(moe_course.course.inside.answers.CHECKS_ENV, "")])

    def before_cell(*_):
        snapshot.restore()
        reset_shell(shell)

    shell.events.register("pre_run_cell", before_cell)
    set_limits(int(os.environ.get(MEMORY_ENV, DEFAULT_MEMORY_BYTES)), int(os.environ.get(CPU_ENV, DEFAULT_CPU_SECONDS)))
    sys.addaudithook(audit_hook(policy))
    return snapshot
