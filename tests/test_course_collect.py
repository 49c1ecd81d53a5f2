"""Collecting an LMS export: any file name, symlinks and special files refused, one line per skipped entry,
never an abort for the class. Fast (no kernel, no nbgrader)."""

import os

import pytest

from moe_course.course.collect import collect, student_id

NAME = "00_tiny"


def test_student_ids_are_ascii_distinct_and_stable():
    assert student_id("Ada Lovelace_123_assignsubmission_file_") == "ada-lovelace_123"
    assert student_id("José Núñez") == "jose-nunez"
    assert student_id("王芳") == student_id("王芳") == "xn--" + "王芳".encode("punycode").decode()
    assert student_id("王芳") != student_id("李娜") and student_id("王芳").isascii()
    with pytest.raises(ValueError, match="no letters or digits"):
        student_id("___")


def test_lms_names_links_and_special_files(tmp_path):
    export, course = tmp_path / "export", tmp_path / "course"
    export.mkdir()
    for name in ("王芳.ipynb", "Ann Lee.ipynb", "ann lee.ipynb", "___.ipynb", "notes.txt"):
        (export / name).write_text(f'{{"from": "{name}"}}')
    secret = tmp_path / "secret.ipynb"
    secret.write_text("instructor only")
    (export / "linked.ipynb").symlink_to(secret)
    (export / "linked_dir").symlink_to(tmp_path)
    (export / "bob").mkdir()
    (export / "bob" / f"{NAME}.ipynb").symlink_to(secret)  # a link inside a student's folder is not taken
    os.mkfifo(export / "fifo.ipynb")
    found, skipped = collect(export, course, NAME)
    assert sorted(found) == ["ann-lee", student_id("王芳")]
    copied = course / "submitted" / student_id("王芳") / NAME / f"{NAME}.ipynb"
    assert copied.read_text() == '{"from": "王芳.ipynb"}'
    assert skipped["linked.ipynb"] == skipped["linked_dir"] == "a symbolic link (not followed)"
    assert skipped["fifo.ipynb"] == "a special file (FIFO, device or socket)"
    assert "a second submission for student 'ann-lee'" in skipped["ann lee.ipynb"]
    assert "no letters or digits" in skipped["___.ipynb"]
    assert skipped["notes.txt"] == "not a notebook or a folder"
    assert skipped["bob"] == "0 notebooks and none named 00_tiny.ipynb"
    assert "instructor only" not in "".join(p.read_text() for p in (course / "submitted").rglob("*.ipynb"))
