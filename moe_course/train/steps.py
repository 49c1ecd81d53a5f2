"""The compiled train and eval steps, shared by every model: they see a model only through nnx.split/merge."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy. logits (batch, classes) float32, labels (batch,) int32 -> scalar (nats)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation) -> Callable:
    """jit(params, rest, opt_state, batch, key) -> (params, opt_state, metrics).

    metrics: loss (task + aux), task_loss, aux_loss, accuracy -- batch means, float32 scalars.
    ``key`` drives every random draw of the step (dropout, router noise).
    """

    def loss_fn(params, rest, batch, key):
        model = nnx.merge(graphdef, params, rest)
        out = model(batch["image"], deterministic=False, rngs=nnx.Rngs(key))
        task = cross_entropy(out.logits, batch["label"])
        accuracy = (out.logits.argmax(-1) == batch["label"]).mean()
        return task + out.aux_loss, {"task_loss": task, "aux_loss": out.aux_loss, "accuracy": accuracy}

    @jax.jit
    def train_step(params, rest, opt_state, batch, key):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, batch, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, **metrics}

    return train_step


def make_eval_step(graphdef: nnx.GraphDef) -> Callable:
    """jit(params, rest, batch) -> (summed loss, correct count, example count) over rows with mask = 1."""

    @jax.jit
    def eval_step(params, rest, batch: dict[str, Any]):
        model = nnx.merge(graphdef, params, rest)
        logits = model(batch["image"], deterministic=True).logits
        losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["label"])
        mask = batch["mask"]
        return (losses * mask).sum(), ((logits.argmax(-1) == batch["label"]) * mask).sum(), mask.sum()

    return eval_step
