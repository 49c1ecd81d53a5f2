"""The ``moe-course`` command restarts itself once with glibc's huge pages for large allocations (launch.py)."""

import os
import platform
import subprocess
import sys

import pytest

from moe_course import launch

GLIBC = ("glibc", "2.36")
THP = "always [madvise] never"


def test_adds_the_tunable_and_keeps_other_tunables():
    env = launch.huge_pages_environment({"PATH": "/bin"}, "Linux", GLIBC, THP)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    env = launch.huge_pages_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "Linux", GLIBC, THP)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ, system, libc, thp", [
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "Linux", GLIBC, THP),  # the user chose: never overridden
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "Linux", GLIBC, THP),  # already re-executed
    ({"MOE_COURSE_HUGE_PAGES": "0"}, "Linux", GLIBC, THP),  # opted out
    ({}, "Darwin", ("", ""), None),
    ({}, "Linux", ("musl", "1.2"), THP),
    ({}, "Linux", ("glibc", "2.31"), THP),  # the tunable exists from 2.35 on
    ({}, "Linux", GLIBC, "always madvise [never]"),  # the kernel refuses transparent huge pages
    ({}, "Linux", GLIBC, None),  # unknown kernel setting
])
def test_runs_as_started_where_the_setting_cannot_help(environ, system, libc, thp):
    assert launch.huge_pages_environment(environ, system, libc, thp) is None


def test_reexec_replaces_the_process_once_with_the_same_command():
    """The real exec path: the child re-runs its own command line with the setting, then goes on unchanged."""
    code = ("import os, sys; from moe_course import launch; print('start', os.getpid(), flush=True); "
            "launch.reexec_with_huge_pages(); print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", launch.OPT_OUT)}
    proc = subprocess.run([sys.executable, "-c", code, "a", "b"], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    lines = proc.stdout.split("\n")
    expected = launch.huge_pages_environment(env, platform.system(), platform.libc_ver(),
                                             launch.THP_SETTING.read_text() if launch.THP_SETTING.exists() else None)
    if expected is None:
        assert lines[0].startswith("start ") and lines[1] == "None ['a', 'b']", proc.stdout
    else:  # "start" twice with one PID (the same process ran the command again), the setting on, arguments kept
        assert lines[0] == lines[1] == f"start {proc.stdout.split()[1]}", proc.stdout
        assert lines[2] == "glibc.malloc.hugetlb=1 ['a', 'b']", proc.stdout
    opted_out = subprocess.run([sys.executable, "-c", code], env={**env, launch.OPT_OUT: "0"},
                               capture_output=True, text=True, timeout=60, check=True)
    assert opted_out.stdout.split("\n")[1:3] == ["None []", ""], opted_out.stdout


def test_console_command_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "moe_course.launch", "train", "--help"], capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.startswith("usage: moe-course train"), proc.stdout
