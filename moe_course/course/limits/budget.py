"""One resource budget per submission, enforced by the Linux kernel: a cgroup, and a size-limited scratch folder.

The grading worker (``moe_course.course.limits.worker``) creates the budget before its kernel starts and removes it
after; the sandbox launcher moves itself into the cgroup before it becomes bubblewrap, so the kernel and
everything it starts are counted together:

- ``Cgroup.create``: memory (``memory.max``, swap included; tmpfs pages the submission writes are charged to
  it), processes and threads (``pids.max``) and an equal CPU weight for every submission, so 200 busy
  processes of one student get the CPU share of one student. Written to the cgroup files directly (the
  kernel's documented interface, Documentation/admin-guide/cgroup-v2.rst; cgroup v1's ``memory``, ``pids``
  and ``cpu`` controllers where those are what the host mounts). Only where this process may create cgroups
  (a root grader on most hosts); elsewhere ``create`` returns None and the per-process limits of ``prlimit``
  are what holds (docs/instructors.md, "Trust").
- ``user_scope``: a grader that is not root gets the same bound on a submission's memory as a whole where a
  systemd user manager has the memory controller delegated to it (``can_use_user_scope`` probes it): the worker
  starts under ``systemd-run --user --scope -p MemoryMax=...`` (``submission_bytes``: its kernel, tmpfs and
  itself). Elsewhere memory is capped per process only, which the batch says in one line (``per_process_only``).
- ``worker_cgroup``: a root batch's grading worker runs in its submission's cgroup too, so the two share the
  submission's CPU weight: ``moe-grade-<pid>`` holds ``worker`` (the worker process, WORKER_BYTES) and, while
  the kernel runs, ``kernel`` (``--memory-mb``). Whatever a submission makes its worker hold (messages it
  floods the worker with) is bounded by WORKER_BYTES, which the jobs x memory check counts.
- ``mount_scratch``: the worker's scratch folder (the kernel's writable copy of the submission's folder, the
  answers folder, its sockets) as a tmpfs of ``SCRATCH_BYTES`` and ``SCRATCH_INODES``, mounted with util-linux
  ``mount`` in the worker's own mount namespace (``grade`` starts a root worker under ``unshare --mount``), so
  that it disappears with the worker whatever happens. A root worker mounts it in the mount namespace the
  batch starts it in; a worker that is not root first enters a user namespace of its own
  (``own_scratch_command``: util-linux ``unshare --user --map-root-user --mount``), where it may mount a tmpfs,
  so no grader ever shares its TMPDIR between submissions.
- ``fits``: the batch starts only if ``--jobs`` submissions' worst case -- the kernel's memory limit, its
  scratch and the sandbox's writable tmpfs, all of which can be held in RAM at once -- fits in this machine's
  memory, its memory available now, and the memory limit of its cgroup and of every ancestor cgroup
  (``memory_limits``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CGROUPS_ENV = "MOE_COURSE_SANDBOX_CGROUPS"  # the cgroup folders the launcher joins, os.pathsep-separated
SCRATCH_TMPFS_ENV = "MOE_COURSE_SCRATCH_TMPFS"  # set by the batch where the worker can mount its scratch tmpfs
SCRATCH_BYTES = 512 * 2**20  # the submission's writable copy, its answers and sockets together
SCRATCH_INODES = 20_000
TMPFS_BYTES = 256 * 2**20  # the sandbox's /tmp and /dev/shm, each
WRITABLE_TMPFS_BYTES = 2 * TMPFS_BYTES  # /tmp and /dev/shm; /, /dev and the hiding tmpfs are read-only
MAX_PROCESSES = 512  # processes and threads of the kernel (XLA starts a thread pool per core)
MAX_OPEN_FILES = 1024
CPU_WEIGHT = 100  # cgroup v2 default; every submission gets the same (v1: cpu.shares 1024)
WORKER_BYTES = 1024 * 2**20  # the grading worker's cgroup: nbgrader, the references it computes, what it reads
WORKER_CGROUP_ENV = "MOE_COURSE_WORKER_CGROUP"  # set by a root batch whose host gives cgroups: see worker_cgroup
_V1 = ("memory", "pids", "cpu")
# the limit files a cgroup may have (v2, then v1), in the order they are written: v1's memsw after memory
_LIMITS = ("memory.max", "memory.swap.max", "pids.max", "cpu.weight",
           "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cpu.shares")


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, file system type, super options) of every mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        found.append((fields[4], fields[dash + 1], fields[dash + 3].split(",")))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: {"": path} for cgroup v2, {controller: path} for v1."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def _delegate(folder: Path) -> None:
    """Enable the memory, pids and (where offered) cpu controllers for the children of cgroup v2 ``folder``.
    Raises OSError (EBUSY) where ``folder`` holds processes of its own (cgroup v2's no-internal-process rule)."""
    enabled = set((folder / "cgroup.subtree_control").read_text().split())
    if not {"memory", "pids"} <= enabled:
        _write(folder / "cgroup.subtree_control", "+memory +pids")
    if "cpu" in (folder / "cgroup.controllers").read_text().split() and "cpu" not in enabled:
        try:
            _write(folder / "cgroup.subtree_control", "+cpu")
        except OSError:  # refused while a real-time process runs below (CONFIG_RT_GROUP_SCHED): no weight then
            pass


def _limit(folder: Path, memory_bytes: int, processes: int) -> None:
    """Write the limits into cgroup ``folder`` (v2, or one v1 controller's): memory with no swap, processes and
    threads, and the CPU weight every submission gets -- each where the folder has its file."""
    values = {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": processes, "cpu.weight": CPU_WEIGHT,
              "memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes,
              "cpu.shares": 1024}
    for name in _LIMITS:
        if (folder / name).exists():
            _write(folder / name, values[name])


@dataclass
class Cgroup:
    """The cgroup folders of one submission (one for cgroup v2, one per controller for v1)."""

    folders: list[Path]

    @classmethod
    def create(cls, name: str, *, memory_bytes: int, processes: int) -> "Cgroup | None":
        """A new cgroup ``name`` below this process's own, limited to ``memory_bytes`` (bytes, swap included)
        and ``processes`` (processes and threads), with the default CPU weight; None where this process may
        not create one (not root, no memory or pids controller, a cgroup v2 parent that cannot delegate)."""
        try:
            return cls._create_v2(name, memory_bytes, processes) or cls._create_v1(name, memory_bytes, processes)
        except OSError:
            return None

    @classmethod
    def _create_v2(cls, name, memory_bytes, processes):
        own = _own_paths().get("")
        mount = next((point for point, kind, _ in _mounts() if kind == "cgroup2"), None)
        if own is None or mount is None:
            return None
        parent = Path(mount) / own.lstrip("/")
        if not {"memory", "pids"} <= set((parent / "cgroup.controllers").read_text().split()):
            return None
        _delegate(parent)  # EBUSY where the parent has processes
        folder = parent / name
        folder.mkdir()
        group = cls([folder])
        try:
            _limit(folder, memory_bytes, processes)
        except OSError:
            group.remove()
            raise
        return group

    @classmethod
    def _create_v1(cls, name, memory_bytes, processes):
        own = _own_paths()
        points = {}
        for point, kind, options in _mounts():
            for controller in _V1:
                if kind == "cgroup" and controller in options and controller in own:
                    points[controller] = Path(point) / own[controller].lstrip("/")
        if not {"memory", "pids"} <= set(points):
            return None
        group = cls([])
        try:
            for parent in points.values():
                folder = parent / name
                folder.mkdir()
                group.folders.append(folder)
                _limit(folder, memory_bytes, processes)
        except OSError:
            group.remove()
            raise
        return group

    def child(self, name: str, *, memory_bytes: int, processes: int) -> "Cgroup":
        """A cgroup ``name`` below this one (in each of its folders), limited as ``create`` limits one; this
        cgroup (v2) must hold no process of its own. Raises OSError where the host refuses."""
        group = Cgroup([])
        try:
            for folder in self.folders:
                if (folder / "cgroup.subtree_control").exists():
                    _delegate(folder)
                (folder / name).mkdir()
                group.folders.append(folder / name)
                _limit(folder / name, memory_bytes, processes)
        except OSError:
            group.remove()
            raise
        return group

    def join(self, pid: int = 0) -> None:
        """Move process ``pid`` (0: this one) into the cgroup; its children then start inside."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", pid or os.getpid())

    def remove(self, timeout: float = 10.0) -> None:
        """Kill every process left in the cgroup and in the cgroups below it and remove their folders, the
        deepest first (OSError is left to the caller only when a folder cannot be removed within ``timeout``
        seconds)."""
        deadline = time.monotonic() + timeout
        below = [path for top in self.folders if top.is_dir() for path in top.rglob("*") if path.is_dir()]
        for folder in sorted(below, key=lambda path: -len(path.parts)) + self.folders:
            while folder.exists():
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    if not pids:
                        folder.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.05)

    def environment(self) -> dict[str, str]:
        """The environment entry that tells the sandbox launcher which cgroup to join."""
        return {CGROUPS_ENV: os.pathsep.join(str(f) for f in self.folders)}


LEFTOVER_PREFIX = "moe-grade-"  # a worker's cgroup is moe-grade-<pid>, its scratch folder moe-grade-<pid>-*


def worker_cgroup(memory_bytes: int) -> Cgroup | None:
    """For a grading worker: its submission's cgroup ``moe-grade-<pid>`` (``memory_bytes`` + WORKER_BYTES, twice
    MAX_PROCESSES), with this process moved into its child ``worker`` (WORKER_BYTES, MAX_PROCESSES: the XLA
    thread pools of the references it computes) -- the kernel's cgroup is made beside it (``Cgroup.child``
    "kernel"). None where no cgroup can be made; the batch removes it after the worker ends (``remove_leftovers``).
    """
    group = Cgroup.create(f"{LEFTOVER_PREFIX}{os.getpid()}", memory_bytes=memory_bytes + WORKER_BYTES,
                          processes=2 * MAX_PROCESSES)
    if group is None:
        return None
    try:
        group.child("worker", memory_bytes=WORKER_BYTES, processes=MAX_PROCESSES).join()
    except OSError:
        group.remove()
        return None
    return group


def _cgroup_parents() -> list[Path]:
    """The folders a worker's cgroup is created in: this process's own cgroup in every hierarchy it can see."""
    own, parents = _own_paths(), []
    for point, kind, options in _mounts():
        if kind == "cgroup2" and "" in own:
            parents.append(Path(point) / own[""].lstrip("/"))
        elif kind == "cgroup":
            parents += [Path(point) / own[c].lstrip("/") for c in _V1 if c in options and c in own]
    return parents


def _worker_runs(pid: int) -> bool:
    """Whether process ``pid`` is a running grading worker (``python -m moe_course.course.limits.worker``, or
    the worker module of another release: batches of two installations may share this machine's cgroups)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return re.search(rb"moe_course\.course\.(\w+\.)?worker\b", command) is not None


def remove_leftovers(tmpdir: Path, pids=None) -> list[Path]:
    """Remove what grading workers that no longer run left behind -- their cgroups (``moe-grade-<pid>`` below
    this process's own, every process still in them killed) and scratch folders (``moe-grade-<pid>-*`` in
    ``tmpdir``; their tmpfs went with the worker's mount namespace) -- of the workers ``pids`` (after the batch
    killed or lost one), or of every worker that is gone (None: at the start of a batch). Returns the folders
    removed; one that cannot be removed is left and not returned."""
    def gone(name: str, cut) -> bool:
        pid = name[len(LEFTOVER_PREFIX):]
        pid = cut(pid)
        return pid.isdigit() and (int(pid) in pids if pids is not None else not _worker_runs(int(pid)))

    pids = None if pids is None else set(pids)
    removed = []
    for parent in _cgroup_parents():
        for folder in parent.glob(f"{LEFTOVER_PREFIX}*"):
            if folder.is_dir() and gone(folder.name, lambda rest: rest):
                try:
                    Cgroup([folder]).remove(timeout=5)
                    removed.append(folder)
                except OSError:
                    pass
    for folder in Path(tmpdir).glob(f"{LEFTOVER_PREFIX}*-*"):
        if folder.is_dir() and not folder.is_symlink() and gone(folder.name, lambda rest: rest.split("-")[0]):
            remove_tree(folder)
            if not folder.exists():
                removed.append(folder)
    return removed


def remove_tree(folder: Path) -> None:
    """Remove ``folder`` and all it holds, however deep (coreutils ``rm``: a kernel may leave a tree thousands
    of folders deep, which ``shutil.rmtree`` cannot descend), without crossing into another file system. Every
    folder is first made readable, writable and searchable by its owner (coreutils ``chmod -R u+rwx``, which
    changes a folder before it reads it and follows no link), so that a folder a submission set to mode 000 does
    not keep its contents on the grader's disk when the grader is not root."""
    subprocess.run(["chmod", "-R", "u+rwx", "--", str(folder)], capture_output=True)
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(folder)], capture_output=True)


def join_from_environment() -> None:
    """In the sandbox launcher: join the cgroup the worker named in ``CGROUPS_ENV`` (nothing when unset)."""
    folders = [Path(f) for f in os.environ.get(CGROUPS_ENV, "").split(os.pathsep) if f]
    if folders:
        Cgroup(folders).join()


def mount_scratch(folder: Path) -> None:
    """Mount a tmpfs of SCRATCH_BYTES and SCRATCH_INODES on ``folder`` (root, in a private mount namespace).
    Raises OSError with mount's message when it fails."""
    command = ["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_BYTES},nr_inodes={SCRATCH_INODES},mode=0711",
               "moe-grade", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise OSError(f"cannot mount the scratch tmpfs on {folder}: {done.stderr.strip()[:200]}")


def can_mount_scratch() -> bool:
    """Whether a worker started under ``unshare --mount`` can mount its scratch tmpfs here (root, and not a
    container that withholds CAP_SYS_ADMIN): tried once, in a mount namespace that ends with the probe."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="moe-grade-probe-") as folder:
        probe = ["unshare", "--mount", "--propagation", "private", "--", "mount", "-t", "tmpfs", "-o", "size=1m",
                 "moe-grade-probe", folder]
        try:
            return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


def cgroup_version() -> str | None:
    """"v2" or "v1" where this process can create a submission's cgroup (one is made and removed), else None."""
    group = Cgroup.create(f"moe-grade-probe-{os.getpid()}", memory_bytes=2**30, processes=16)
    if group is None:
        return None
    group.remove()
    return "v2" if group.folders[0].parent.joinpath("cgroup.controllers").exists() else "v1"


def own_scratch_command(command: list[str]) -> list[str]:
    """``command`` run in a user and mount namespace of its own, as root there (mapped to this process's uid),
    so that a worker that is not root can mount its scratch tmpfs (``mount_scratch``)."""
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--", *command]


def can_own_scratch() -> bool:
    """Whether this process (root or not) can give a worker a scratch tmpfs: mounted in a mount namespace of its
    own (root) or in a user namespace of its own first (``own_scratch_command``). Tried once, in a namespace that
    ends with the probe."""
    if os.geteuid() == 0:
        return can_mount_scratch()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="moe-grade-probe-") as folder:
        probe = own_scratch_command(["mount", "-t", "tmpfs", "-o", "size=1m", "moe-grade-probe", folder])
        try:
            return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


def _number(path: Path, key: str | None = None) -> int | None:
    """The integer in file ``path`` (or on its line ``key VALUE``); None when unreadable or not a number ("max")."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if key is not None:
        text = next((line.split()[1] for line in text.splitlines() if line.split()[:1] == [key]), "")
    return int(text.strip()) if text.strip().isdigit() else None


def memory_limits() -> dict[str, int]:
    """Every bound on the memory this grader may use, {where: bytes}: "MemTotal" and "MemAvailable" (what the
    machine has, and what it can give now without swapping; ``/proc/meminfo``), and the memory limit of the
    cgroup this process runs in and of every ancestor it can see -- cgroup v2 ``memory.max`` up the tree, v1
    ``memory.limit_in_bytes`` up the tree and ``hierarchical_memory_limit`` (``memory.stat``: the lowest of its
    ancestors', also those a container hides) -- each under "cgroup PATH". A systemd slice or a container that
    limits a parent limits the grader as much as its own cgroup would."""
    meminfo = Path("/proc/meminfo")
    found = {name: value * 1024 for name in ("MemTotal", "MemAvailable")
             if (value := _number(meminfo, f"{name}:")) is not None}
    own = _own_paths()
    for point, kind, options in _mounts():
        if kind == "cgroup2" and "" in own:
            path, files = own[""], [("memory.max", None)]
        elif kind == "cgroup" and "memory" in options and "memory" in own:
            path = own["memory"]
            files = [("memory.limit_in_bytes", None), ("memory.stat", "hierarchical_memory_limit")]
        else:
            continue
        folder = Path(point) / path.lstrip("/")
        while True:
            for name, key in files:
                if (value := _number(folder / name, key)) is not None:
                    found[f"cgroup {folder}"] = min(value, found.get(f"cgroup {folder}", value))
            if folder == Path(point) or folder == folder.parent:
                break
            folder = folder.parent
    return found


def machine_memory_bytes() -> int:
    """The memory this grader may use (bytes): the lowest of ``memory_limits``."""
    return min(memory_limits().values())


PROBE_BYTES = 256 * 2**20  # the MemoryMax of can_use_user_scope's probe scope


def user_scope(memory_bytes: int) -> list[str]:
    """The prefix that runs a command in a transient systemd user scope of its own whose memory, swap excluded,
    is capped at ``memory_bytes`` (systemd.resource-control(5) ``MemoryMax``, ``MemorySwapMax``); systemd-run
    execs the command, so its process id stays the command's."""
    return ["systemd-run", "--user", "--scope", "--quiet", "-p", f"MemoryMax={memory_bytes}", "-p",
            "MemorySwapMax=0", "--"]


def can_use_user_scope() -> bool:
    """Whether this grader, not root, can cap a submission's memory with a systemd user scope (``user_scope``):
    ``systemd-run`` is installed, a user manager answers, and it has the memory controller delegated -- a probe
    scope of PROBE_BYTES reads that number in its own cgroup's ``memory.max`` (cgroup v2)."""
    if os.geteuid() == 0 or shutil.which("systemd-run") is None:
        return False
    own_limit = 'cat "/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup)/memory.max"'
    try:
        probe = subprocess.run([*user_scope(PROBE_BYTES), "sh", "-c", own_limit], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == str(PROBE_BYTES)


def per_process_only(memory_bytes: int) -> str:
    """The one line a batch prints where no cgroup caps a submission as a whole (a grader that is not root, or
    a host that lets it create none): what ``memory_bytes`` per process then allows one submission to hold."""
    from moe_course.course.inside.guard import FILE_SIZE_BYTES

    return (f"memory is capped per process only (no cgroup per submission: grade as root, or as a user whose "
            f"systemd manager has the memory controller delegated, for one): each of a "
            f"submission's up to {MAX_PROCESSES} processes may take {memory_bytes // 2**20} MiB (--memory-mb), and "
            f"memfd files, which count against no process, {FILE_SIZE_BYTES // 2**20} MiB each with "
            f"{MAX_OPEN_FILES} open per process")


def submission_bytes(memory_bytes: int, sandbox: bool = True) -> int:
    """What one submission can hold in RAM at once (bytes): its kernel's memory limit ``memory_bytes``, its
    scratch tmpfs (SCRATCH_BYTES), in the sandbox its writable tmpfs (WRITABLE_TMPFS_BYTES), and its grading
    worker (WORKER_BYTES, the limit of the worker's cgroup where a root grader gets one)."""
    return memory_bytes + SCRATCH_BYTES + (WRITABLE_TMPFS_BYTES if sandbox else 0) + WORKER_BYTES


def fits(jobs: int, memory_bytes: int, sandbox: bool = True, machine_bytes: int | None = None) -> None:
    """Check that ``jobs`` submissions graded at once fit in ``machine_bytes`` (default: the lowest of
    ``memory_limits``, named in the message): ``submission_bytes`` each. Raises ValueError with one line naming
    the numbers (MiB) and the limit otherwise. jobs < 1 is left to ``grade.autograde`` to refuse."""
    if not isinstance(jobs, int) or jobs < 1:
        return
    if machine_bytes is None:
        where, machine = min(memory_limits().items(), key=lambda item: item[1])
        where = {"MemTotal": "this machine's", "MemAvailable": "this machine's available (MemAvailable)"}.get(
            where, f"the memory limit of {where}:")
    else:
        where, machine = "this machine's", machine_bytes
    each = submission_bytes(memory_bytes, sandbox)
    if each * jobs > machine:
        tmpfs = each - memory_bytes - WORKER_BYTES
        lower = [f"--jobs to {machine // each}"] if machine >= each else []
        if (memory := (machine // jobs - tmpfs - WORKER_BYTES) // 2**20) >= 1:
            lower.append(f"--memory-mb to {memory}")
        raise ValueError(f"--jobs {jobs} x ({memory_bytes // 2**20} MiB --memory-mb + {tmpfs // 2**20} MiB of "
                         f"tmpfs + {WORKER_BYTES // 2**20} MiB for the grading worker per submission) = "
                         f"{each * jobs // 2**20} MiB is more than {where} {machine // 2**20} MiB: "
                         + (f"lower {' or '.join(lower)}" if lower else "not one submission fits"))
