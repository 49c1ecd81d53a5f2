"""LIMoE's bidirectional contrastive loss (Mustafa et al. 2022, Eq. 1; CLIP, Radford et al. 2021).

For n image-text pairs with L2-normalised embeddings z_i (images) and z_t (texts), the similarity logits are
``s_jk = <z_i_j, z_t_k> * scale`` with a learned ``scale = exp(log_temperature)``: the paper's 1/T, kept as a
log so it stays positive, initialised at 10 (SPEC Sec. 3; big_vision keeps the same log value). Pair j's
loss is half the cross-entropy of picking text j among all texts for image j (image-to-text) plus half that
of picking image j among all images for text j (text-to-image); the batch loss is the mean over pairs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def similarity_logits(image_embedding: jax.Array, text_embedding: jax.Array, log_temperature: jax.Array) -> jax.Array:
    """(n, d) image and (m, d) text embeddings -> (n, m) float32 logits ``<z_i, z_t> * exp(log_temperature)``."""
    scale = jnp.exp(jnp.asarray(log_temperature, jnp.float32))
    return jnp.einsum("id,td->it", image_embedding.astype(jnp.float32), text_embedding.astype(jnp.float32)) * scale


def contrastive_loss(image_embedding: jax.Array, text_embedding: jax.Array,
                     log_temperature: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean over pairs of Eq. 1: 0.5 CE(image->text) + 0.5 CE(text->image). Returns (loss, metrics).

    image_embedding, text_embedding: (n, d) float, row j of both is pair j (L2-normalised by the model).
    log_temperature: scalar, the log of the logit scale. metrics: image_to_text and text_to_image losses
    (nats) and in-batch retrieval accuracies (fraction of rows whose own pair scores highest).
    Raises ValueError unless both are (n, d) with the same n and d.
    """
    if image_embedding.ndim != 2 or image_embedding.shape != text_embedding.shape:
        raise ValueError(f"image_embedding {image_embedding.shape} and text_embedding {text_embedding.shape} must "
                         "both be (pairs, dim) of the same shape")
    logits = similarity_logits(image_embedding, text_embedding, log_temperature)
    pairs = jnp.arange(logits.shape[0])
    image_to_text = -jnp.mean(jax.nn.log_softmax(logits, axis=1)[pairs, pairs])
    text_to_image = -jnp.mean(jax.nn.log_softmax(logits, axis=0)[pairs, pairs])
    metrics = {
        "image_to_text": image_to_text,
        "text_to_image": text_to_image,
        "image_to_text_accuracy": jnp.mean(jnp.argmax(logits, axis=1) == pairs),
        "text_to_image_accuracy": jnp.mean(jnp.argmax(logits, axis=0) == pairs),
    }
    return 0.5 * image_to_text + 0.5 * text_to_image, metrics
