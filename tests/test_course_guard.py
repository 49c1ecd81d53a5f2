"""The grading kernel's protections, checked in this process (the audit hook itself, which cannot be removed
once added, is exercised in the grading kernel by tests/test_course_hostile.py)."""

import os
import sys

import numpy
import pytest

import moe_course.routing
from moe_course.course.inside.guard import FilePolicy, ModuleSnapshot, reset_shell
from moe_course.routing.allocation import Allocation


def test_snapshot_undoes_replaced_functions_code_modules_and_class_attributes():
    snapshot = ModuleSnapshot()
    allclose, routing, top_k = numpy.allclose, sys.modules["moe_course.routing"], moe_course.routing.top_k_routing
    code, served = top_k.__code__, Allocation.__dict__["served"]
    try:
        numpy.allclose = lambda *a, **k: True
        moe_course.routing.top_k_routing = lambda *a, **k: None
        top_k.__code__ = (lambda logits, k, key=None, *, noise_std=None, order="": None).__code__
        sys.modules["moe_course.routing"] = type(sys)("fake")
        Allocation.served = property(lambda self: True)
        snapshot.restore()
        assert numpy.allclose is allclose and moe_course.routing.top_k_routing is top_k
        assert top_k.__code__ is code and sys.modules["moe_course.routing"] is routing
        assert Allocation.__dict__["served"] is served
        assert not numpy.allclose(0.0, 1.0)
    finally:
        numpy.allclose, moe_course.routing.top_k_routing, top_k.__code__ = allclose, top_k, code
        sys.modules["moe_course.routing"], Allocation.served = routing, served


def test_reset_shell_undoes_hidden_tracebacks():
    class Shell:
        def showtraceback(self):
            return "shown"

    shell = Shell()
    shell.custom_exceptions = (Exception,)
    shell.showtraceback = lambda: None
    sys.excepthook = lambda *a: None
    reset_shell(shell)
    assert shell.custom_exceptions == () and shell.showtraceback() == "shown" and sys.excepthook is sys.__excepthook__


def test_file_policy(tmp_path):
    course, home, solutions = tmp_path / "course", tmp_path / "course" / "autograded" / "ada" / "a1", tmp_path / "sol"
    for folder in (home, solutions):
        folder.mkdir(parents=True)
    policy = FilePolicy(str(home), [str(course), str(solutions)])
    assert policy.may_read(home / "a1.ipynb") and policy.may_write(home / "scratch.npy")
    assert not policy.may_read(course / "gradebook.db") and not policy.may_read(solutions / "01_vit.py")
    assert not policy.may_read(home / ".." / ".." / "bob" / "a1" / "a1.ipynb")
    assert policy.may_read(os.__file__) and not policy.may_write(tmp_path / "outside.txt")
    (home / "link").symlink_to(course / "gradebook.db")
    assert not policy.may_read(home / "link"), "a symlink out of the submission's folder is resolved"
    assert policy.may_write(os.devnull) and policy.may_read(3)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_limits_reject_bad_values(value):
    from moe_course.course.limits.config import Limits

    with pytest.raises(ValueError, match="cell_timeout"):
        Limits(cell_timeout=value)


def test_a_kernel_may_interrupt_itself_and_signal_nothing_else():
    import signal

    from moe_course.course.inside.guard import GradingViolation, audit_hook

    hook = audit_hook(FilePolicy(os.getcwd(), []))
    hook("os.kill", (os.getpid(), signal.SIGINT))  # ipykernel's interrupt_request: allowed
    hook("os.killpg", (os.getpgid(0), signal.SIGINT))
    for event, args in (("os.kill", (os.getpid(), signal.SIGKILL)), ("os.kill", (os.getppid(), signal.SIGINT)),
                        ("os.killpg", (0, signal.SIGINT))):
        with pytest.raises(GradingViolation):
            hook(event, args)
