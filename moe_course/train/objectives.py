"""What the one training loop optimises, per kind of model: which batch entries a step reads and its loss.

- classification (ViT, V-MoE, Soft MoE, MoD): cross-entropy of the logits against ``label``;
- contrastive (LIMoE and its dense one-tower baseline): LIMoE Eq. 1 between the image and caption embeddings
  of the batch's pairs (``train.contrastive``), reading ``image``, ``text`` and ``text_mask``.
Both add the model's aux loss. An objective returns (task loss, aux loss, metrics); every metric is a
float32 scalar, and "accuracy" is always among them (for the contrastive objective: the in-batch retrieval
accuracy, the mean over both directions of the fraction of rows whose own pair scores highest).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from moe_course.analysis.modality import busiest_shares, success_rates
from moe_course.configs.limoe import LIMoEConfig
from moe_course.train.contrastive import contrastive_loss


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy. logits (batch, classes) float32, labels (batch,) int32 -> scalar (nats)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


class Objective(NamedTuple):
    """batch_keys: the batch entries a training step needs. loss: (model, batch, rngs) -> (task loss, aux loss,
    metrics dict)."""

    name: str
    batch_keys: tuple[str, ...]
    loss: Callable


def soft_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy against soft targets (big_vision's ``softmax_xent``). logits, targets
    (batch, classes) float -> scalar (nats)."""
    return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets.astype(jnp.float32)).mean()


def _classification(model, batch, rngs: nnx.Rngs):
    out = model(batch["image"], deterministic=False, rngs=rngs)
    if "soft_label" in batch:  # mixup (train.mixup): the mixed one-hot labels; accuracy against their argmax
        accuracy = (out.logits.argmax(-1) == batch["soft_label"].argmax(-1)).mean()
        return soft_cross_entropy(out.logits, batch["soft_label"]), out.aux_loss, {"accuracy": accuracy}
    accuracy = (out.logits.argmax(-1) == batch["label"]).mean()
    return cross_entropy(out.logits, batch["label"]), out.aux_loss, {"accuracy": accuracy}


def _contrastive(model, batch, rngs: nnx.Rngs):
    out = model(batch["image"], batch["text"], batch["text_mask"], deterministic=False, rngs=rngs)
    loss, parts = contrastive_loss(out.image_embedding, out.text_embedding, out.log_temperature)
    metrics = {
        "accuracy": 0.5 * (parts["image_to_text_accuracy"] + parts["text_to_image_accuracy"]),
        "temperature": jnp.exp(out.log_temperature),
        **{f"aux/{name}": value for name, value in out.aux_terms.items()},
        **success_rates(out.routing, out.modality),
        **busiest_shares(out.routing, out.modality),
    }
    return loss, out.aux_loss, metrics


CLASSIFICATION = Objective("classification", ("image", "label"), _classification)
CONTRASTIVE = Objective("contrastive", ("image", "text", "text_mask"), _contrastive)


def objective_for(model_config) -> Objective:
    """CONTRASTIVE for a LIMoEConfig (one-tower image-text models), else CLASSIFICATION."""
    return CONTRASTIVE if isinstance(model_config, LIMoEConfig) else CLASSIFICATION
