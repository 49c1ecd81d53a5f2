"""The environment settings the chapters read (moe_course.settings)."""

import pytest

from moe_course.settings import chapter_seed, retrain_recorded, runs_dir


@pytest.mark.parametrize("value, seed", [(None, 0), ("", 0), ("0", 0), ("2", 2), (" 17 ", 17)])
def test_chapter_seed(value, seed):
    assert chapter_seed({} if value is None else {"MOE_COURSE_SEED": value}) == seed


@pytest.mark.parametrize("value", ["-1", "one", "1.5", "0x2", "\u00b2"])
def test_chapter_seed_refuses_what_is_not_a_non_negative_integer(value):
    with pytest.raises(ValueError, match=rf"MOE_COURSE_SEED='{value}' is not allowed; use a non-negative integer"):
        chapter_seed({"MOE_COURSE_SEED": value})


@pytest.mark.parametrize("value, retrain", [(None, False), ("", False), ("0", False), ("1", True)])
def test_retrain_recorded(value, retrain):
    assert retrain_recorded({} if value is None else {"MOE_COURSE_RETRAIN": value}) is retrain


def test_retrain_recorded_refuses_other_values():
    with pytest.raises(ValueError, match=r"MOE_COURSE_RETRAIN='yes' is not allowed; use 1 \(train again\) or 0"):
        retrain_recorded({"MOE_COURSE_RETRAIN": "yes"})


def test_runs_dir_is_the_repository_root_runs_from_a_notebook_folder(tmp_path):
    for folder in ("chapters", "moe_course", "exercises", "mywork"):
        (tmp_path / folder).mkdir()
    assert runs_dir({}, tmp_path / "chapters") == tmp_path / "runs"  # where `moe-course train` writes from the root
    assert runs_dir({}, tmp_path / "mywork") == tmp_path / "runs"
    assert runs_dir({}, tmp_path) == tmp_path / "runs"
    assert runs_dir({}, tmp_path / "moe_course") == tmp_path / "moe_course" / "runs"  # not a notebook folder
    assert runs_dir({"MOE_COURSE_WORKDIR": str(tmp_path / "mine")}, tmp_path / "chapters") == tmp_path / "mine"
