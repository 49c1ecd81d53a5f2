"""Checks of assignment 04: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases``: the inputs, drawn from the grading seed, with
NumPy alone) and in the grader (``reference``, with the library: ``moe_course.routing.entropy`` for the
entropy losses and the predicted value, ``moe_course.routing.losses`` for the z-loss, and the aux loss of
``moe_course.layers.multimodal_moe.MultimodalMoE``, into which the references load the parameter trees drawn here
as plain nested dicts with the paths and shapes of ``nnx.to_pure_dict(nnx.state(layer, nnx.Param))``). See
``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check


# 1. entropy: peaked distributions over 6 experts (Dirichlet 0.3: some entries are tiny) with one
# exactly one-hot row (0 log 0 = 0: no NaN), batched (3, 5, 6) -> (3, 5), and one plain (6,) distribution.
def _entropy_cases(rng):
    probs = rng.dirichlet(np.full(6, 0.3), size=(3, 5)).astype(np.float32)
    probs[0, 0] = np.eye(6, dtype=np.float32)[rng.integers(6)]
    return [(probs,), (rng.dirichlet(np.full(6, 0.3)).astype(np.float32),)]


def _entropy(probs):
    import jax.numpy as jnp

    from moe_course.routing.entropy import entropy

    return np.asarray(entropy(jnp.asarray(probs)))


# 2. local_entropy_loss: a random modality mask with one group that has no token of the modality (it must
# not count in the mean over groups) and different counts in the others (the mean is per group first, not
# over all selected tokens at once), and a mask that selects everything.
def _local_cases(rng):
    logits = (2 * rng.normal(size=(3, 8, 5))).astype(np.float32)
    mask = rng.random(size=(3, 8)) < np.array([[0.3], [0.5], [0.8]])  # unequal counts: not a pooled mean
    mask[[0, 2], rng.integers(8, size=2)] = True
    mask[1] = False  # a group without tokens of this modality
    return [(logits, mask), (logits, np.ones((3, 8), bool))]


def _local(logits, mask):
    import jax.numpy as jnp

    from moe_course.routing.entropy import local_entropy_loss

    return float(local_entropy_loss(jnp.asarray(logits), jnp.asarray(mask)))


# 6. modality_marginal (the debug task): masks of unequal counts in which every group keeps a token (a group
# without any gets the library's uniform placeholder, which the task does not ask for), and padding whose
# logits all lean one way, as id 0's do; the reference is the library's marginal_probs.
def _marginal_cases(rng):
    cases = []
    for groups, tokens, experts in ((3, 8, 4), (2, 16, 6)):
        logits = (2 * rng.normal(size=(groups, tokens, experts))).astype(np.float32)
        mask = rng.random(size=(groups, tokens)) < 0.5
        mask[:, 0] = True
        logits[~mask] = (4 * np.eye(experts)[0]).astype(np.float32)  # the padding: one embedding, one preference
        cases.append((logits, mask))
    return cases


def _marginal(logits, mask):
    import jax.numpy as jnp

    from moe_course.routing.entropy import marginal_probs

    return np.asarray(marginal_probs(jnp.asarray(logits), jnp.asarray(mask))[0])


# 3. global_entropy_loss on one set of logits: a random mask with an empty group (it must not count, with or
# without a threshold), without a threshold (-H), and with tau = log 3 (nearly always below every group's
# marginal entropy: the loss is 0); everything selected with tau = log 5 (near the largest entropy, log 6:
# in some groups the threshold still pushes, in others it does not); the random mask with tau = log 6 (the
# threshold is active in every group with tokens).
def _global_cases(rng):
    logits = (2 * rng.normal(size=(4, 9, 6))).astype(np.float32)
    mask = rng.random(size=(4, 9)) < np.array([[0.4], [0.6], [0.6], [0.9]])  # unequal counts
    mask[2] = False  # a group without tokens of this modality
    return [(logits, mask, None), (logits, mask, float(np.log(3))), (logits, np.ones((4, 9), bool), float(np.log(5))),
            (logits, mask, float(np.log(6)))]


def _global(logits, mask, tau):
    import jax.numpy as jnp

    from moe_course.routing.entropy import global_entropy_loss

    return float(global_entropy_loss(jnp.asarray(logits), jnp.asarray(mask), tau=tau))


# 4. router_z_loss: the local loss's masks (a group without tokens of the modality, unequal counts), logits
# large enough that exp overflows float32 without the shift (an answer must subtract the maximum), and a mask
# that selects nothing (0).
def _z_cases(rng):
    logits = (3 * rng.normal(size=(3, 8, 5))).astype(np.float32)
    mask = rng.random(size=(3, 8)) < np.array([[0.3], [0.5], [0.8]])
    mask[[0, 2], rng.integers(8, size=2)] = True
    mask[1] = False
    large = (100 + 5 * rng.normal(size=(2, 6, 4))).astype(np.float32)
    return [(logits, mask), (large, np.ones((2, 6), bool)), (logits, np.zeros((3, 8), bool))]


def _z(logits, mask):
    import jax.numpy as jnp

    from moe_course.routing.losses import router_z_loss

    return float(router_z_loss(jnp.asarray(logits), jnp.asarray(mask)))


# 5. the predicted thresholded global loss (tau = log 4) of the text in two groups of 8 tokens: 6 + 2 tokens
# certain of experts 0 and 1, and 8 uniform tokens (8 experts): no inputs (the question is fixed); the reference
# is the library's loss on such logits.
def _global_prediction():
    logits = np.zeros((2, 8, 8), np.float32)
    logits[0, :6, 0] = logits[0, 6:, 1] = 50.0
    return _global(logits, np.ones((2, 8), bool), float(np.log(4)))


# 7. limoe_aux_loss: a MultimodalMoE's parameter tree (router and experts), tokens, and a modality array of
# image patches, captions and padding (-1) in (batch, tokens); (batch, tokens, width, experts, group_size):
# several examples per routing group, and one per group with a group that has no text (the text terms average
# over the groups with text only); thresholds that push in some groups, and an unthresholded text loss.
_MOES = ((4, 6, 8, 4, 2, {"image": float(np.log(3.9)), "text": float(np.log(3.9))}, 0.04),
         (3, 8, 6, 8, 1, {"image": float(np.log(7.5)), "text": None}, 0.01))


def _moe_params(rng, width, hidden, experts):
    return {"router": {"kernel": (0.6 * rng.normal(size=(width, experts))).astype(np.float32)},
            "experts": {"fc1_kernel": rng.normal(size=(experts, width, hidden)).astype(np.float32),
                        "fc1_bias": rng.normal(size=(experts, hidden)).astype(np.float32),
                        "fc2_kernel": rng.normal(size=(experts, hidden, width)).astype(np.float32),
                        "fc2_bias": rng.normal(size=(experts, width)).astype(np.float32)}}


def _aux_cases(rng):
    cases = []
    for batch, tokens, width, experts, group_size, taus, weight in _MOES:
        patches = tokens // 2
        modality = np.zeros((batch, tokens), np.int32)
        for b in range(batch):
            text = rng.integers(1, tokens - patches + 1)
            modality[b, patches:patches + text], modality[b, patches + text:] = 1, -1
        if group_size == 1:
            modality[0, patches:] = 0  # a group without text
        x = rng.normal(size=(batch, tokens, width)).astype(np.float32)
        cases.append((_moe_params(rng, width, 2 * width, experts), x, modality, group_size, taus, weight))
    return cases


def _aux(params, x, modality, group_size, taus, weight):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers.multimodal_moe import MultimodalMoE

    width, experts = params["router"]["kernel"].shape
    make = lambda: MultimodalMoE(  # noqa: E731
        width, params["experts"]["fc1_bias"].shape[1], experts, taus=taus, joint=("z_loss",),
        losses={"image": ("global_entropy",), "text": ("local_entropy", "global_entropy")}, k=1, capacity_ratio=1.0,
        group_size=group_size, aux_loss_weight=weight, rngs=nnx.Rngs(0))
    return float(run_module(make, params, lambda layer, tokens, kinds: layer(tokens, modality=kinds,
                                                                              token_mask=kinds >= 0).aux_loss,
                            x, modality))


CHECKS = {
    "entropy_tests": Check(_entropy_cases, _entropy, rtol=1e-4, atol=1e-6),
    "local_tests": Check(_local_cases, _local, rtol=1e-4, atol=1e-6, scalar=True),
    "global_tests": Check(_global_cases, _global, rtol=1e-4, atol=1e-6, scalar=True),
    "z_tests": Check(_z_cases, _z, rtol=1e-4, atol=1e-6, scalar=True),
    "marginal_tests": Check(_marginal_cases, _marginal, rtol=1e-4, atol=1e-6),
    "global_prediction_tests": Check(lambda rng: [()], _global_prediction, rtol=0.0, atol=1e-3, scalar=True),
    "aux_tests": Check(_aux_cases, _aux, rtol=1e-4, atol=1e-7, scalar=True),
}
