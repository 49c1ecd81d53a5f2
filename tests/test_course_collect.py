"""Collecting an LMS export: any file name, symlinks and special files refused, one line per skipped entry,
never an abort for the class. Fast (no kernel, no nbgrader)."""

import os

import pytest

from moe_course.course.instructor.collect import collect, student_id

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


def test_long_names_get_bounded_distinct_ids_and_deep_trees_are_skipped(tmp_path):
    """An LMS folder name of 300 characters becomes an id of at most MAX_ID characters (a hash keeps two long
    names apart); a folder tree too deep to walk is one student's skipped line, never the class's abort."""
    from moe_course.course.instructor.collect import MAX_ID

    long_a, long_b = "Ada " + "x" * 296, "Ada " + "x" * 295 + "y"
    assert len(student_id(long_a)) <= MAX_ID and student_id(long_a) != student_id(long_b)
    assert student_id(long_a).startswith("ada-xxx") and student_id(long_a) == student_id(long_a)
    assert student_id("Ada Lovelace") == "ada-lovelace"  # short names keep their plain id
    export, course = tmp_path / "export", tmp_path / "course"
    (export / (long_a[:250])).mkdir(parents=True)
    (export / long_a[:250] / "00_tiny.ipynb").write_text("{}")
    (export / "Bo.ipynb").write_text("{}")
    deep = export / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    try:  # 1,200 nested folders, made relative to each parent (a full path would pass PATH_MAX)
        for _ in range(1200):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(fd)
        found, skipped = collect(export, course, NAME)
    finally:
        _remove_nested(deep, "d")  # shutil.rmtree (pytest's clean-up) recurses as deep as the tree
    assert set(found) == {student_id(long_a[:250]), "bo"}, found
    assert "deep" in skipped and skipped["deep"].startswith(("could not be read", "0 notebooks")), skipped
    assert (course / "submitted" / student_id(long_a[:250]) / NAME / f"{NAME}.ipynb").exists()


def _remove_nested(top, name):
    """Remove the chain top/name/name/... of empty folders without recursion or many open files: lift the
    chain below the first folder up one level, remove that folder, repeat."""
    fd = os.open(top, os.O_RDONLY)
    try:
        while True:
            try:
                os.rename(f"{name}/{name}", "lifted", src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                break
            os.rmdir(name, dir_fd=fd)
            os.rename("lifted", name, src_dir_fd=fd, dst_dir_fd=fd)
        os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)


def test_grades_csv_cells_are_inert():
    """OWASP's CSV-injection advice: a cell a spreadsheet would run as a formula is made text; control characters
    and long logs do not reach grades.csv."""
    from moe_course.course.instructor.grade import CELL_CHARS, csv_cell

    assert csv_cell('=HYPERLINK("http://x","click")') == '\'=HYPERLINK("http://x","click")'
    for start in ("+", "-", "@"):
        assert csv_cell(start + "1+1").startswith("'"), start
    # invisible or blank characters before the formula: removed first, then the formula is made text
    for hidden in ("\t", "\r", "\u202e", "\u200b", "\x00", " ", "\u00a0", "\ufeff", " \u200b\t"):
        assert csv_cell(hidden + "=1+1") == "'=1+1", repr(hidden)
    assert csv_cell("right\u202eleft") == "right left"
    assert csv_cell("failed: cell timed out") == "failed: cell timed out"
    assert csv_cell("line one\nline two\x1b[31m") == "line one line two [31m"
    assert len(csv_cell("e" * 10_000)) == CELL_CHARS
    assert csv_cell(7.5) == 7.5 and csv_cell(None) is None


def test_grades_csv_flags_column_joins_reasons_and_keeps_a_lone_one_whole():
    from moe_course.course.instructor.grade import flags_text

    assert flags_text(["not scanned: RecursionError"]) == "not scanned: RecursionError"
    assert flags_text(["a", "b"]) == "a; b" and flags_text([]) == ""
    assert flags_text("not scanned: MemoryError") == "not scanned: MemoryError"  # a record written before the fix


def test_collect_prints_no_control_character_of_a_student(tmp_path, capsys):
    """Entry names are the students' own: an escape sequence (retitle the terminal, clear the screen), a carriage
    return that would overwrite the line and a newline that would forge one reach the instructor's terminal as
    spaces (``grade.terminal_text``), in what ``moe-course course collect`` prints."""
    pytest.importorskip("nbgrader", reason="moe-course course needs the instructor extra")
    from moe_course.cli import main

    export = tmp_path / "export"
    export.mkdir()
    hostile = ["\x1b]0;owned\x07Eve\x1b[2J.txt", "Mallory\rcollected: 99\nok.txt", "Ann.ipynb"]
    for name in hostile:
        (export / name).write_text("{}")
    assert main(["course", "collect", str(export), "--assignment", NAME, "--course-dir", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out
    assert not [char for char in printed.replace("\n", "") if ord(char) < 32 or ord(char) == 127], repr(printed)
    assert "collected: 1\n" in printed and "collected: 99" in printed  # the forged line is shown, on a line of its own
    assert len(printed.splitlines()) == 4, printed  # collected, skipped, one line per skipped entry: none forged
