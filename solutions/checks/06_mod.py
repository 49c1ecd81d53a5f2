"""Checks of assignment 06 (Mixture-of-Depths routing): the inputs each answer is called on, and the course
library's reference (``moe_course.routing.mod`` for the pieces, ``moe_course.layers.mod.MoDBlock`` for the block).

Runs in two places: in the grading sandbox (``cases`` and ``call``: the inputs, drawn from the grading seed,
and how the answers are called, with NumPy alone) and in the grader (``reference``, with the library). Parameter
trees are drawn here as plain nested dicts of NumPy arrays with the paths and shapes of
``nnx.to_pure_dict(nnx.state(MoDBlock(...), nnx.Param))``, and the block's reference loads them into the library's
module (``references.run_module``: one compiled computation per case). See ``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _dense(rng, fan_in, fan_out):
    return {"kernel": _normal(rng, fan_in, fan_out) / np.float32(np.sqrt(fan_in)), "bias": 0.1 * _normal(rng, fan_out)}


def _norm(rng, width):
    return {"scale": 1 + 0.2 * _normal(rng, width), "bias": 0.2 * _normal(rng, width)}


def _mod_params(rng, width, mlp_dim, router):
    """An MoDBlock's tree: the wrapped encoder block, and a (width, 1) router under standard routing only."""
    block = {"norm1": _norm(rng, width), "attn": {n: _dense(rng, width, width) for n in ("query", "key", "value", "out")},
             "norm2": _norm(rng, width), "mlp": {"fc1": _dense(rng, width, mlp_dim), "fc2": _dense(rng, mlp_dim, width)}}
    return {"block": block, "router": {"kernel": _normal(rng, width, 1)}} if router == "standard" else {"block": block}


def _maps(rng, batch, heads, tokens):
    """Attention maps (batch, heads, tokens, tokens): rows drawn from a Dirichlet of concentration 0.3 (peaked,
    summing to 1), so that the tokens' received attention is spread far apart."""
    return rng.dirichlet(np.full(tokens, 0.3), size=(batch, heads, tokens)).astype(np.float32)


# scores_tests: both routers, each case with a tree of each kind (maps given to the standard one too: it ignores them).
def _scores_cases(rng):
    cases = []
    for batch, tokens, width, heads, router in ((2, 7, 8, 2, "standard"), (3, 5, 6, 3, "standard"),
                                                  (2, 7, 8, 2, "attention"), (1, 9, 4, 4, "attention")):
        cases.append((_mod_params(rng, width, 2 * width, router), _normal(rng, batch, tokens, width),
                      _maps(rng, batch, heads, tokens)))
    return cases


def _scores(params, x, previous_attention):
    import jax.numpy as jnp

    from moe_course.routing.mod import attention_router_scores, standard_router_scores

    if "router" in params:
        return np.asarray(standard_router_scores(jnp.asarray(x), jnp.asarray(params["router"]["kernel"])))
    return np.asarray(attention_router_scores(jnp.asarray(previous_attention)))


# forward_tests: the library's MoDBlock (deterministic) with the drawn tree loaded, on both routers, with and
# without keep_first, at capacities that keep one token, a third and most; its output and record.index.
_BLOCKS = ((2, 9, 8, 2, 16, "standard", 0.5, True), (1, 7, 12, 3, 24, "standard", 0.15, False),
           (2, 8, 8, 1, 16, "attention", 0.34, True), (3, 6, 8, 4, 8, "attention", 0.8, False))


def _forward_cases(rng):
    return [(_mod_params(rng, w, m, router), _normal(rng, b, t, w), h, c, first, _maps(rng, b, h, t))
            for b, t, w, h, m, router, c, first in _BLOCKS]


def _forward(params, x, heads, capacity, keep_first, previous_attention):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers.mod import MoDBlock

    width, mlp_dim = params["block"]["mlp"]["fc1"]["kernel"].shape
    router = "standard" if "router" in params else "attention"
    make = lambda: MoDBlock(width, heads, mlp_dim, capacity=capacity, router=router,  # noqa: E731
                            keep_first=keep_first, num_tokens=x.shape[1], rngs=nnx.Rngs(0))

    def forward(block, tokens, maps):
        y, _, record = block(tokens, previous_attention=maps)
        return y, record.index

    y, index = run_module(make, params, forward, x, previous_attention)
    return np.asarray(y), np.asarray(index)


def _capacity_cases(rng):
    # Python's round goes half to even: capacity * tokens lands on a half for 0.5 and odd tokens (4m + 1
    # rounds down, 4m + 3 up), for 0.25 and tokens 4m + 2, for 0.125 and tokens 8m + 4; one token (at least 1)
    tokens = [1, int(4 * rng.integers(1, 16) + 1), int(4 * rng.integers(1, 16) + 3), int(4 * rng.integers(1, 16) + 2),
              int(8 * rng.integers(1, 8) + 4), int(rng.integers(2, 100))]
    return [(t, c) for t in tokens for c in (0.05, 0.125, 0.25, 0.5, 0.7, 1.0)]


def _capacity(tokens, capacity):
    from moe_course.routing import mod_capacity

    return mod_capacity(tokens, capacity)


def _select_cases(rng):
    # scores rounded to one decimal: equal scores at the cut, which go to the earlier token. + 0.0 turns the
    # -0.0 of rounding into 0.0: the reference (jax.lax.top_k) ranks -0.0 below 0.0, a NumPy sort as equal
    return [(np.round(rng.normal(size=(4, 17)), 1).astype(np.float32) + np.float32(0.0), capacity, first)
            for capacity in (0.125, 0.5, 0.75) for first in (False, True)]


def _select(scores, capacity, keep_first):
    import jax.numpy as jnp

    from moe_course.routing import mod_select

    selection = mod_select(jnp.asarray(scores), capacity, keep_first=keep_first)
    return np.asarray(selection.index), np.asarray(selection.processed)


# gradient_tests: router_gradient against jax.grad of sum(y * grad_out) through the library's scores, selection
# and gate (A-MoD Eq. 1-2 with the bounded gate ``mod_gate``), at two capacities.
def _gradient_cases(rng):
    cases = []
    for batch, tokens, width, capacity in ((2, 8, 4, 0.5), (3, 10, 5, 0.25)):
        x, update, grad_out = rng.normal(size=(3, batch, tokens, width)).astype(np.float32)
        cases.append((x, rng.normal(size=width).astype(np.float32), update, grad_out, capacity))
    return cases


def _gradient(x, w, update, grad_out, capacity):
    import jax
    import jax.numpy as jnp

    from moe_course.routing.mod import mod_gate, mod_select, standard_router_scores

    def loss(w):
        scores = standard_router_scores(jnp.asarray(x), w)
        kept = mod_select(scores, capacity).processed
        return jnp.sum((x + jnp.where(kept, mod_gate(scores), 0.0)[..., None] * update) * grad_out)

    return np.asarray(jax.grad(loss)(jnp.asarray(w)))


# block_tests: mod_block, the port fixed, against the library's scores, selection and bounded gate (mod_gate),
# with router weights of scale 1 and 50 (where an unbounded gate moves the tokens far).
def _block_cases(rng):
    cases = []
    for (batch, tokens, width, capacity), scale in zip(((2, 8, 4, 0.5), (3, 10, 5, 0.25)), (1.0, 50.0)):
        x, update = rng.normal(size=(2, batch, tokens, width)).astype(np.float32)
        cases.append((x, (scale * rng.normal(size=width)).astype(np.float32), update, capacity))
    return cases


def _block(x, w, update, capacity):
    import jax.numpy as jnp

    from moe_course.routing.mod import mod_gate, mod_select, standard_router_scores

    scores = standard_router_scores(jnp.asarray(x), jnp.asarray(w))
    kept = mod_select(scores, capacity).processed
    return np.asarray(x + jnp.where(kept, mod_gate(scores), 0.0)[..., None] * update)


# 2. the predicted number of patch tokens a block of capacity 0.125 processes out of 196 (+ the class token,
# kept), checked after task 3: no inputs (the question is fixed); the reference counts them with the library's
# mod_select.
def _patches():
    import jax.numpy as jnp

    from moe_course.routing.mod import mod_select

    scores = jnp.asarray(np.random.default_rng(0).random(size=(2, 197)), jnp.float32)
    return int(np.asarray(mod_select(scores, 0.125, keep_first=True).processed)[0, 1:].sum())


CHECKS = {
    "capacity_tests": Check(_capacity_cases, _capacity, exact=True, scalar=True),
    "scores_tests": Check(_scores_cases, _scores, rtol=1e-5, atol=1e-6),
    "select_tests": Check(_select_cases, _select, exact=True),
    "block_tests": Check(_block_cases, _block, rtol=1e-4, atol=1e-4),
    "forward_tests": Check(_forward_cases, _forward, rtol=1e-4, atol=1e-5),
    "gradient_tests": Check(_gradient_cases, _gradient, rtol=1e-4, atol=1e-5),
    "patches_tests": Check(lambda rng: [()], _patches, exact=True, scalar=True),  # a prediction: no inputs
}
