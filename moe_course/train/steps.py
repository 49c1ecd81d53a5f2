"""The compiled train and eval steps, shared by every model: they see a model only through nnx.split/merge."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.experimental import checkify

from moe_course.data.randaugment import check_randaugment
from moe_course.train.mixup import mixup
from moe_course.train.objectives import CLASSIFICATION, Objective
from moe_course.train.randaugment import randaugment as randaugment_batch


def checks_enabled(config) -> bool:
    """True when a model config asks for checkify checks (``check_finite``, V-MoE's debug mode)."""
    return bool(getattr(config, "check_finite", False))


def as_float_images(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with a uint8 "image" (as the input pipeline delivers it) scaled to float32 in [0, 1], on the
    device inside the compiled step; a float "image" (the chapters' and ``get``'s batches) is left as it is."""
    image = batch.get("image")
    if image is None or image.dtype != jnp.uint8:
        return batch
    return {**batch, "image": image.astype(jnp.float32) / 255.0}


def _jit(step: Callable, checked: bool, donate_argnums: tuple[int, ...] = ()) -> Callable:
    """jax.jit(step); with ``checked``, functionalised by checkify first, raising the first failed check."""
    if not checked:
        return jax.jit(step, donate_argnums=donate_argnums)
    compiled = jax.jit(checkify.checkify(step, errors=checkify.user_checks), donate_argnums=donate_argnums)

    def run(*args):
        error, out = compiled(*args)
        error.throw()
        return out

    run.lower = compiled.lower  # ahead-of-time compilation (parallel.plan) of the checked program itself
    return run


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, checked: bool = False,
                    objective: Objective = CLASSIFICATION, shardings: tuple | None = None, mixup_p: float = 0.0,
                    num_classes: int | None = None, randaugment: tuple[int, float] | None = None,
                    donate: bool = False) -> Callable:
    """jit(params, rest, opt_state, batch, key) -> (params, opt_state, metrics).

    metrics: loss (task + aux), task_loss, aux_loss, accuracy and the objective's own metrics -- batch means,
    float32 scalars. ``batch`` holds ``objective.batch_keys``; "image" uint8 in [0, 255] or float in [0, 1]
    (``as_float_images``). ``key`` drives every random draw of the step
    (dropout, router noise). ``checked``: run the model's checkify checks and raise the first that fails
    (JaxRuntimeError, a ValueError); costs one sync per step.
    ``shardings``: (parameter shardings, optimizer state shardings), trees of ``NamedSharding`` matching
    params and opt_state, for a sharded run (``moe_course.parallel``): the updated state keeps that layout.
    ``mixup_p`` > 0 (classification only, needs ``num_classes``): big_vision's mixup (``train.mixup``) of the
    float images and one-hot labels first, its key split from ``key`` as big_vision does; accuracy is then
    against the argmax of the mixed labels. ``randaugment`` (N, M): RandAugment of the float images on the
    device (``train.randaugment``) before mixup, its key split from ``key`` first. Raises ValueError for
    mixup_p > 0 with another objective and for a bad ``randaugment``.
    ``donate``: the step donates ``params`` and ``opt_state`` (``donate_argnums``), so the updated state is
    written into their buffers and the old and new state are not live at once (big_vision, MaxText); the
    arrays passed in are deleted by the call -- pass arrays nothing else still reads.
    """
    if randaugment is not None:
        n, magnitude = check_randaugment(randaugment)
    if mixup_p and (objective is not CLASSIFICATION or not num_classes):
        raise ValueError(f"mixup_p={mixup_p} applies to classification with num_classes; this is the "
                         f"{objective.name} objective")

    def loss_fn(params, rest, batch, key):
        batch = as_float_images(batch)
        if randaugment is not None:
            key, augment_key = jax.random.split(key)
            batch = {**batch, "image": randaugment_batch(augment_key, batch["image"], n=n, magnitude=magnitude)}
        if mixup_p:
            onehot = jax.nn.one_hot(batch["label"], num_classes, dtype=jnp.float32)
            key, image, soft = mixup(key, batch["image"], onehot, p=mixup_p)
            batch = {**batch, "image": image, "soft_label": soft}
        model = nnx.merge(graphdef, params, rest)
        task, aux, metrics = objective.loss(model, batch, nnx.Rngs(key))
        return task + aux, {"task_loss": task, "aux_loss": aux, **metrics}

    def train_step(params, rest, opt_state, batch, key):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, batch, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if shardings is not None:
            params, opt_state = jax.lax.with_sharding_constraint((params, opt_state), shardings)
        return params, opt_state, {"loss": loss, **metrics}

    return _jit(train_step, checked, (0, 2) if donate else ())


def make_eval_step(graphdef: nnx.GraphDef, *, checked: bool = False) -> Callable:
    """jit(params, rest, batch) -> (summed loss, correct count, example count) over rows with mask = 1.
    "image" uint8 or float as in ``make_train_step``. ``checked`` as in ``make_train_step``."""

    def eval_step(params, rest, batch: dict[str, Any]):
        batch = as_float_images(batch)
        model = nnx.merge(graphdef, params, rest)
        logits = model(batch["image"], deterministic=True).logits
        losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["label"])
        mask = batch["mask"]
        return (losses * mask).sum(), ((logits.argmax(-1) == batch["label"]) * mask).sum(), mask.sum()

    return _jit(eval_step, checked)
