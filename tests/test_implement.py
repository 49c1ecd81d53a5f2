"""moe_course.implement.use_yours: the learner's function runs in the chapter's next cells only where it agrees with
the library's on every case; otherwise the library's runs and one line says why."""

import jax.numpy as jnp
import numpy as np
import pytest

from moe_course.implement import differs, use_yours

CASES = [(jnp.arange(6.0).reshape(2, 3),), (jnp.linspace(-1, 1, 12).reshape(3, 4),)]


def library(x):
    return jnp.tanh(x) * 2


def test_a_matching_function_is_used(capsys):
    def mine(x):
        return 2 * np.tanh(np.asarray(x))

    assert use_yours(mine, library, CASES) is mine
    assert capsys.readouterr().out == "mine: yours matches the library on 2 cases: the cells below use yours\n"


def test_an_unwritten_function_falls_back_to_the_library(capsys):
    def mine(x):
        raise NotImplementedError("your code here")

    assert use_yours(mine, library, CASES) is library
    assert "not written yet" in capsys.readouterr().out


@pytest.mark.parametrize("mine, why", [
    (lambda x: jnp.tanh(x) * 2.001, "values differ, by up to"),
    (lambda x: (jnp.tanh(x) * 2)[0], "shape"),
    (lambda x: jnp.tanh(x) * 2 + jnp.log(x - 100), "non-finite"),
    (lambda x: (jnp.tanh(x), x), "returns 2 arrays"),
    (lambda x: x.nonexistent, "raised AttributeError"),
])
def test_a_wrong_function_is_named_and_not_used(capsys, mine, why):
    assert use_yours(mine, library, CASES, name="mine") is library
    out = capsys.readouterr().out
    assert out.startswith("mine: ") and why in out and "the library's" in out, out


def test_the_second_case_is_checked_too(capsys):
    def mine(x):  # right on the first case only
        return library(x) if x.shape == (2, 3) else library(x) + 1

    assert use_yours(mine, library, CASES) is library
    assert "case 2 of 2" in capsys.readouterr().out


def test_no_cases_refused():
    with pytest.raises(ValueError, match="at least one case"):
        use_yours(library, library, [])


def test_nan_where_the_library_has_nan_matches():
    assert differs(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), rtol=1e-5, atol=1e-5) is None


def test_compare_maps_both_outputs_before_they_are_compared(capsys):
    """A function returning a model is compared by what ``compare`` extracts (here its parameters): a model with
    the right parameters is used, one with a wrong parameter is named, and so is a
    function that returns no model."""
    from flax import nnx

    def library_model(seed):
        return nnx.Linear(2, 3, rngs=nnx.Rngs(seed))

    def wrong_bias(seed):
        model = library_model(seed)
        model.bias[...] = model.bias[...] + 1
        return model

    params = lambda model: nnx.state(model, nnx.Param)  # noqa: E731
    assert use_yours(library_model, library_model, [(0,), (1,)], name="same", compare=params) is library_model
    assert use_yours(wrong_bias, library_model, [(0,)], name="wrong", compare=params) is library_model
    assert use_yours(lambda seed: None, library_model, [(0,)], name="none", compare=params) is library_model
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("same: yours matches the library on 2 cases")
    assert "wrong: differs from the library on case 1 of 1 (output 0: 3 of 3 values differ" in lines[1]
    assert "none: differs from the library on case 1 of 1 (it returns 0 arrays where the library returns 2)" in lines[2]
