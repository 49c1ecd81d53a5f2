"""Checks of assignment 03 (your V-MoE with Batch Prioritized Routing): the inputs each answer is called on, and
the course library's reference (``moe_course.routing.batch_prioritized_allocation`` for the priority order and the
slots; ``moe_course.layers.SparseMoE`` with BPR and no router noise for the layer; ``moe_course.models.VMoE`` for the
forward, the loss and its gradient; the library's compiled training step ``moe_course.train.steps.make_train_step``
with optax's Adam for the training; ``moe_course.data.base.eval_batches`` for the evaluation's routing groups;
``noexpert_tests`` checks a predicted number, with no inputs).

Runs in two places: in the grading sandbox (``cases`` and ``call``: the inputs, drawn from the grading seed, and how
the answers are called, with NumPy and JAX alone) and in the grader (``reference``, with the library). Parameter
trees are drawn here as plain nested dicts of NumPy arrays with the paths and shapes of
``nnx.to_pure_dict(nnx.state(VMoE(config), nnx.Param))``, and the references load them into the library's modules
(``references.run_module``: one compiled computation per case; the training reference's model from shapes alone,
``_load``). Routings are drawn as such (gates as the k largest coordinates of a Dirichlet(1) point, random
experts), never computed by routing code here. See ``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check

LEARNING_RATE = 1e-3  # the notebook's OPTIMIZER = optax.adam(LEARNING_RATE)
TRAIN_STEPS = 30


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _drawn_gates(rng, shape, num_experts):
    """Gates (groups, tokens, k) float32: the k largest coordinates of a Dirichlet(1) draw, largest first."""
    points = rng.dirichlet(np.ones(num_experts), size=shape[:2])
    return -np.sort(-points, axis=-1)[..., :shape[2]].astype(np.float32)


def _drawn_choices(rng, shape, num_experts):
    """(groups, tokens, k) int32: k distinct experts per token."""
    return np.argsort(rng.normal(size=(*shape[:2], num_experts)), axis=-1)[..., :shape[2]].astype(np.int32)


def _tied_gates(rng, shape):
    """Gates from {1/8, ..., 8/8}, largest first: many equal priority scores (exactly, also for score="sum")."""
    return (-np.sort(-rng.integers(1, 9, size=shape), axis=-1) / 8).astype(np.float32)


# 1. priority_order: drawn gates by the max, tied gates by the sum; the reference is the inverse of BPR's priority_rank.
def _priority_cases(rng):
    return [(_drawn_gates(rng, (3, 10, 2), 4), "max"), (_tied_gates(rng, (3, 10, 3)), "sum")]


def _priority(gates, score):
    import jax.numpy as jnp

    from moe_course.routing import batch_prioritized_allocation

    k = gates.shape[-1]
    expert_index = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), gates.shape)  # the order ignores the experts
    rank = batch_prioritized_allocation(expert_index, jnp.asarray(gates), 1, k, score=score).priority_rank
    return np.argsort(np.asarray(rank), axis=1)


# 3. bpr_allocate: TOP-1 to TOP-3, tight and loose buffers, tied scores, both scores (sum for TOP-3).
def _allocate_cases(rng):
    cases = []
    for k, capacity, score in ((1, 2, "max"), (3, 1, "sum"), (2, 30, "max")):
        shape = (2, 12, k)
        cases.append((_drawn_choices(rng, shape, 5), _drawn_gates(rng, shape, 5), capacity, 5, score))
    shape = (2, 10, 2)
    return cases + [(_drawn_choices(rng, shape, 4), _tied_gates(rng, shape), 3, 4, "max")]


def _bpr_slots(expert_index, gates, capacity, num_experts, score):
    from moe_course.routing import batch_prioritized_allocation

    return np.asarray(batch_prioritized_allocation(expert_index, gates, capacity, num_experts, score=score).slot)


# 2. The predicted number of tokens of the task's table that BPR leaves without an expert: no inputs.
def _no_expert():
    import jax.numpy as jnp

    from moe_course.routing import batch_prioritized_allocation

    index = jnp.array([[[0, 1], [0, 1], [0, 2], [0, 2], [1, 2], [1, 0]]], jnp.int32)
    gates = jnp.array([[[0.5, 0.3], [0.9, 0.05], [0.6, 0.3], [0.7, 0.2], [0.4, 0.35], [0.55, 0.3]]], jnp.float32)
    served = np.asarray(batch_prioritized_allocation(index, gates, 2, 3).served)
    return int((~served.any(-1)).sum())


# Parameter trees. A model is (image_size, patch, channels, width, depth, heads, mlp_dim, classes, pool, experts,
# k, capacity_ratio, group_size, priority, MoE blocks, batch).
_MODELS = ((8, 4, 1, 8, 2, 2, 16, 3, "gap", 4, 2, 1.0, 2, "max", (1,), 4),
           (8, 2, 3, 12, 4, 3, 24, 5, "cls", 3, 1, 0.5, 1, "sum", (3,), 3))


def _linear_tree(rng, fan_in, fan_out):
    return {"kernel": _normal(rng, fan_in, fan_out) / np.float32(np.sqrt(fan_in)), "bias": 0.1 * _normal(rng, fan_out)}


def _norm_tree(rng, width):
    return {"scale": 1 + 0.2 * _normal(rng, width), "bias": 0.2 * _normal(rng, width)}


def _moe_tree(rng, width, hidden, num_experts):
    """A SparseMoE's tree; the router scaled so that some experts are popular and choices are dropped."""
    return {"router": {"kernel": 1.5 * _normal(rng, width, num_experts) / np.float32(np.sqrt(width))},
            "experts": {"fc1_kernel": _normal(rng, num_experts, width, hidden) / np.float32(np.sqrt(width)),
                        "fc1_bias": 0.3 * _normal(rng, num_experts, hidden),
                        "fc2_kernel": _normal(rng, num_experts, hidden, width) / np.float32(np.sqrt(hidden)),
                        "fc2_bias": 0.3 * _normal(rng, num_experts, width)}}


def _vmoe_tree(rng, model):
    size, patch, channels, width, depth, _, mlp_dim, classes, pool, experts, *_, moe_blocks, _ = model
    blocks = {}
    for i in range(depth):
        mlp = (_moe_tree(rng, width, mlp_dim, experts) if i in moe_blocks else
               {"fc1": _linear_tree(rng, width, mlp_dim), "fc2": _linear_tree(rng, mlp_dim, width)})
        blocks[i] = {"norm1": _norm_tree(rng, width), "norm2": _norm_tree(rng, width), "mlp": mlp,
                     "attn": {n: _linear_tree(rng, width, width) for n in ("query", "key", "value", "out")}}
    tokens = (size // patch) ** 2 + (pool == "cls")
    tree = {"patch_embed": {"proj": {"kernel": _normal(rng, patch, patch, channels, width) / np.float32(patch),
                                     "bias": 0.1 * _normal(rng, width)}},
            "pos_embed": 0.3 * _normal(rng, 1, tokens, width), "blocks": blocks, "norm": _norm_tree(rng, width),
            "head": _linear_tree(rng, width, classes)}
    return {**tree, "cls_token": 0.3 * _normal(rng, 1, 1, width)} if pool == "cls" else tree


def _settings(model):
    heads, k, capacity_ratio, group_size, priority = model[5], model[10], model[11], model[12], model[13]
    return {"heads": heads, "k": k, "capacity_ratio": capacity_ratio, "group_size": group_size, "priority": priority,
            "aux_loss_weight": 0.01}


def _images(rng, model, *batch):
    return rng.random(size=(*batch, model[0], model[0], model[2])).astype(np.float32)


def _load(make, params):
    """The nnx.Module ``make()`` builds, from shapes alone (``nnx.eval_shape``), with its parameters the plain
    dict ``params`` (a missing or extra path raises)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    module = nnx.eval_shape(make)
    state = nnx.state(module, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(module, state)
    return module


def _config(params, settings):
    """The VMoEConfig of a drawn tree (BPR, no router noise, the mean of the layers' aux losses)."""
    from moe_course.configs.vmoe import VMoEConfig

    patch, _, channels, width = params["patch_embed"]["proj"]["kernel"].shape
    blocks = params["blocks"]
    moe = tuple(i for i in sorted(blocks) if "router" in blocks[i]["mlp"])
    dense = next(blocks[i]["mlp"] for i in sorted(blocks) if i not in moe)
    depth = len(blocks)
    tokens = params["pos_embed"].shape[1] - ("cls_token" in params)
    every_2 = moe == tuple(range(1, depth, 2))
    return VMoEConfig(image_size=patch * int(round(np.sqrt(tokens))), patch_size=patch, channels=channels, width=width,
                      depth=depth, heads=settings["heads"], mlp_dim=dense["fc1"]["kernel"].shape[1],
                      num_classes=params["head"]["kernel"].shape[1], pool="cls" if "cls_token" in params else "gap",
                      num_experts=blocks[moe[0]]["mlp"]["router"]["kernel"].shape[1], k=settings["k"],
                      capacity_ratio=settings["capacity_ratio"], placement="every-2" if every_2 else "last-n",
                      moe_last_n=len(moe), group_size=settings["group_size"], allocation="bpr",
                      priority=settings["priority"], noise_std=0.0, aux_loss_weight=settings["aux_loss_weight"])


def _vmoe_maker(params, settings):
    """A function making the library's VMoE of the drawn tree's config."""
    from flax import nnx

    from moe_course.models import VMoE

    config = _config(params, settings)
    return lambda: VMoE(config, rngs=nnx.Rngs(0))


def _quiet(function):
    """``function`` with the library's capacity-rounding warnings silenced (the tiny groups round away from C)."""
    import functools

    @functools.wraps(function)
    def run(*args):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return function(*args)

    return run


# 4. moe_layer: the MoE block's tree of each model, its tokens (batch, tokens, width), the model's settings.
def _layer_cases(rng):
    cases = []
    for model in _MODELS:
        width, mlp_dim, experts, tokens = model[3], model[6], model[9], (model[0] // model[1]) ** 2
        cases.append((_moe_tree(rng, width, mlp_dim, experts), _normal(rng, model[-1] * 2, tokens, width),
                      _settings(model)))
    return cases


@_quiet
def _bpr_layer(p, x, settings):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers import SparseMoE

    num_experts, width, hidden = p["experts"]["fc1_kernel"].shape
    make = lambda: SparseMoE(width, hidden, num_experts, k=settings["k"],  # noqa: E731
                             capacity_ratio=settings["capacity_ratio"], group_size=settings["group_size"],
                             allocation="bpr", priority=settings["priority"], noise_std=0.0,
                             aux_loss_weight=settings["aux_loss_weight"], rngs=nnx.Rngs(0))
    out = run_module(make, p, lambda module, tokens: module(tokens), x)
    return np.asarray(out.output), np.asarray(out.routing.served), float(out.aux_loss)


# 5. vmoe_forward: both models, drawn images.
def _forward_cases(rng):
    return [(_vmoe_tree(rng, model), _images(rng, model, model[-1]), _settings(model)) for model in _MODELS]


@_quiet
def _vmoe_logits(params, images, settings):
    from moe_course.course.instructor.references import run_module

    out = run_module(_vmoe_maker(params, settings), params, lambda model, x: model(x), images)
    return np.asarray(out.logits), float(out.aux_loss)


# 6. loss_fn: drawn labels; the loss and its gradient (every parameter's, in jax.tree.leaves order, as one vector).
# One model, the second (class token, k = 1, priority by the sum): compiling a model's gradient is the slowest part
# of grading, and train_tests differentiates the first.
def _loss_cases(rng):
    model = _MODELS[1]
    return [(_vmoe_tree(rng, model), _images(rng, model, model[-1]),
             rng.integers(0, model[7], size=model[-1]).astype(np.int32), _settings(model))]


def _value_and_gradient(function, params, images, labels, settings):
    """``call`` of loss_tests: jax.value_and_grad of the learner's loss, compiled; (loss, every parameter's gradient
    flattened, in jax.tree.leaves order, into one vector: the grader reads at most 64 outputs a case)."""
    import jax

    loss, grads = jax.jit(jax.value_and_grad(lambda p: function(p, images, labels, settings)))(params)
    return loss, np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree.leaves(grads)])


@_quiet
def _vmoe_loss(params, images, labels, settings):
    import jax
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.train.objectives import CLASSIFICATION

    def loss(model, x, y):
        task, aux, _ = CLASSIFICATION.loss(model, {"image": x, "label": y}, nnx.Rngs(0))
        return task + aux

    value, grads = run_module(_vmoe_maker(params, settings), params, nnx.value_and_grad(loss), images, labels)
    return float(value), np.concatenate([np.ravel(g) for g in jax.tree.leaves(nnx.to_pure_dict(grads))])


# 8. train_step: TRAIN_STEPS batches of the first model, drawn images and labels.
def _train_cases(rng):
    model = _MODELS[0]
    return [(_vmoe_tree(rng, model), _images(rng, model, TRAIN_STEPS, model[-1]),
             rng.integers(0, model[7], size=(TRAIN_STEPS, model[-1])).astype(np.int32), _settings(model))]


def _train_losses(functions, params, images, labels, settings):
    """``call`` of train_tests: the learner's (train_step, OPTIMIZER.init); the step compiled with jax.jit and run
    once per batch from the drawn parameters; the loss of every step."""
    import jax

    step, init = functions
    opt_state, losses = init(params), []
    compiled = jax.jit(lambda p, s, x, y: step(p, s, x, y, settings))
    for x, y in zip(images, labels):
        params, opt_state, loss = compiled(params, opt_state, x, y)
        losses.append(np.asarray(loss, np.float32))
    return np.stack(losses)


@_quiet
def _library_losses(params, images, labels, settings):
    import jax
    import optax
    from flax import nnx

    from moe_course.train.steps import make_train_step

    graphdef, state, rest = nnx.split(_load(_vmoe_maker(params, settings), params), nnx.Param, ...)
    optimizer = optax.adam(LEARNING_RATE)
    step, opt_state, losses = make_train_step(graphdef, optimizer), optimizer.init(state), []
    for x, y in zip(images, labels):
        state, opt_state, metrics = step(state, rest, opt_state, {"image": x, "label": y}, jax.random.key(0))
        losses.append(float(metrics["loss"]))
    return np.array(losses, np.float32)


# 7. evaluation_groups (the debug task): class-sorted labels of random class sizes, several group sizes and seeds;
# the reference reads the order from the library's eval_batches, run on a stand-in dataset whose examples are
# their own indices.
def _evaluation_cases(rng):
    cases = []
    for classes, group_size in ((4, 8), (10, 6), (3, 5)):
        labels = np.repeat(np.arange(classes), rng.integers(group_size, 3 * group_size, size=classes))
        cases.append((labels, group_size, int(rng.integers(0, 1000))))
    return cases


def _evaluation_order(labels, group_size, seed):
    from moe_course.data.base import eval_batches

    class Indices:  # a split of len(labels) examples, each its own index
        name = "indices"

        def split_size(self, split):
            return len(labels)

        def get(self, split, indices):
            return {"index": np.asarray(indices)}

    order = np.concatenate([batch["index"] for batch in eval_batches(Indices(), "test", group_size, order_seed=seed)])
    usable = len(labels) - len(labels) % group_size
    return order[:usable].reshape(-1, group_size)


def _static(*positions):
    """``call`` compiling the learner's function with jax.jit, the arguments at ``positions`` static."""
    def call(function, *args):
        import jax

        return jax.jit(function, static_argnums=positions)(*args)

    return call


def _with_settings(function, *args):
    """``call`` compiling the learner's function with jax.jit, its last argument (the settings dict) fixed."""
    import jax

    *arrays, settings = args
    return jax.jit(lambda *a: function(*a, settings))(*arrays)


_FLOAT = {"rtol": 1e-4, "atol": 1e-5}
CHECKS = {
    "priority_tests": Check(_priority_cases, _priority, exact=True, call=_static(1)),
    "allocate_tests": Check(_allocate_cases, _bpr_slots, exact=True, call=_static(2, 3, 4)),
    "noexpert_tests": Check(lambda rng: [()], _no_expert, exact=True, scalar=True),  # a prediction: no inputs
    "layer_tests": Check(_layer_cases, _bpr_layer, **_FLOAT, call=_with_settings),
    "forward_tests": Check(_forward_cases, _vmoe_logits, **_FLOAT, call=_with_settings),
    "loss_tests": Check(_loss_cases, _vmoe_loss, rtol=1e-4, atol=1e-5, call=_value_and_gradient),
    "evaluation_tests": Check(_evaluation_cases, _evaluation_order, exact=True),
    "train_tests": Check(_train_cases, _library_losses, rtol=1e-4, atol=1e-5, call=_train_losses),
}
