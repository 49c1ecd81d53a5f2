"""Zero-shot classification and image-text retrieval with a contrastive one-tower model (LIMoE Sec. 3; CLIP).

Evaluation embeds images and texts in separate, single-modality forward passes (as a retrieval index would),
at evaluation settings (no router noise, no dropout), compiled once per batch size.
- Zero-shot: each class is described by several prompts (``data.captions.ZERO_SHOT_TEMPLATES``); their
  normalised text embeddings are averaged and renormalised (prompt ensembling, CLIP Sec. 3.1.4), and an image
  gets the class whose embedding is most similar to its own.
- Retrieval: image j's caption is text j. Image-to-text recall@k is the fraction of images whose caption is
  among the k texts most similar to them; text-to-image the same the other way round (big_vision's
  retrieval evaluator computes it from the same similarity matrix).
"""

from __future__ import annotations

from functools import lru_cache

import jax
import numpy as np
from flax import nnx

from moe_course.data.base import eval_batches


@lru_cache(maxsize=8)
def _encoders(graphdef: nnx.GraphDef):
    @jax.jit
    def images(params, rest, x):
        return nnx.merge(graphdef, params, rest)(images=x).image_embedding

    @jax.jit
    def texts(params, rest, ids, mask):
        return nnx.merge(graphdef, params, rest)(text=ids, text_mask=mask).text_embedding

    return images, texts


def _batch_size(model, batch_size: int) -> int:
    group = getattr(model.config, "group_size", 1)
    if batch_size <= 0 or batch_size % group:
        raise ValueError(f"batch_size={batch_size} is not a positive multiple of the model's group_size={group}")
    return batch_size


def _padded(array: np.ndarray, size: int) -> np.ndarray:
    return np.pad(array, [(0, size - len(array))] + [(0, 0)] * (array.ndim - 1))


def embed_images(model, images: np.ndarray, *, batch_size: int = 256) -> np.ndarray:
    """(n, S, S, C) images -> (n, embed_dim) float32 L2-normalised embeddings, image-only passes. The last batch
    is padded with blank images (routed with the real ones, then discarded). Raises ValueError for a batch size
    that is not a multiple of the model's group_size."""
    batch_size = _batch_size(model, batch_size)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    encode = _encoders(graphdef)[0]
    out = [np.asarray(encode(params, rest, _padded(images[s:s + batch_size], batch_size)))[:len(images[s:s + batch_size])]
           for s in range(0, len(images), batch_size)]
    return np.concatenate(out)


def embed_texts(model, ids: np.ndarray, mask: np.ndarray, *, batch_size: int = 256) -> np.ndarray:
    """(n, seq_len) ids and bool mask -> (n, embed_dim) float32 L2-normalised embeddings, text-only passes.
    Padding rows of the last batch are all padding: they take no expert slot. Errors as ``embed_images``."""
    batch_size = _batch_size(model, batch_size)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    encode = _encoders(graphdef)[1]
    out = []
    for s in range(0, len(ids), batch_size):
        n = len(ids[s:s + batch_size])
        out.append(np.asarray(encode(params, rest, _padded(ids[s:s + batch_size], batch_size),
                                     _padded(mask[s:s + batch_size], batch_size)))[:n])
    return np.concatenate(out)


def zero_shot_weights(prompt_embeddings: np.ndarray) -> np.ndarray:
    """(classes, templates, d) normalised prompt embeddings -> (classes, d): their mean per class, renormalised."""
    mean = np.asarray(prompt_embeddings, np.float64).mean(axis=1)
    return (mean / np.linalg.norm(mean, axis=1, keepdims=True)).astype(np.float32)


def zero_shot_predictions(image_embeddings: np.ndarray, class_weights: np.ndarray) -> np.ndarray:
    """(n, d) images, (classes, d) class embeddings -> (n,) int64 argmax of the cosine similarity."""
    return np.argmax(np.asarray(image_embeddings) @ np.asarray(class_weights).T, axis=1)


def recall_at_k(image_embeddings: np.ndarray, text_embeddings: np.ndarray, k: int) -> dict[str, float]:
    """Retrieval recall@k with pair j = (image j, text j): {"image_to_text": fraction, "text_to_image": fraction}.
    A tie with the true pair counts against it (the true item must beat every other to rank first).
    Raises ValueError for different numbers of images and texts or k outside [1, n]."""
    sim = np.asarray(image_embeddings, np.float64) @ np.asarray(text_embeddings, np.float64).T
    n = sim.shape[0]
    if sim.shape != (n, n) or not 1 <= k <= n:
        raise ValueError(f"need as many texts as images (got {sim.shape}) and 1 <= k <= {n} (got k={k})")
    own = np.diag(sim)
    i2t = (sim >= own[:, None]).sum(axis=1)  # rank of the own caption, counting ties against it (1 = first)
    t2i = (sim >= own[None, :]).sum(axis=0)
    return {"image_to_text": float(np.mean(i2t <= k)), "text_to_image": float(np.mean(t2i <= k))}


def evaluate_contrastive(model, dataset, split: str = "test", *, batch_size: int = 256) -> dict[str, float]:
    """Zero-shot accuracy (prompt ensembling over ``dataset.prompts()``) and retrieval recall@1/@5 on ``split``
    of an image-caption dataset in the course's batch format: {"zero_shot_accuracy", "i2t_recall@1",
    "t2i_recall@1", "i2t_recall@5", "t2i_recall@5", "examples"}; zero_shot_accuracy only for data with
    classes (``num_classes`` > 0 and a ``prompts()`` method, as ``CaptionedDigits``). Every example once, in
    index order."""
    images, ids, masks, labels = [], [], [], []
    for batch in eval_batches(dataset, split, batch_size):
        images.append(batch["image"]), ids.append(batch["text"]), masks.append(batch["text_mask"])
        labels.append(batch["label"])
    image_emb = embed_images(model, np.concatenate(images), batch_size=batch_size)
    text_emb = embed_texts(model, np.concatenate(ids), np.concatenate(masks), batch_size=batch_size)
    result = {"examples": len(image_emb)}
    if dataset.num_classes:  # caption-only data has no classes to name: retrieval only
        prompt_ids, prompt_mask = dataset.prompts()
        classes, templates, seq_len = prompt_ids.shape
        prompt_emb = embed_texts(model, prompt_ids.reshape(-1, seq_len), prompt_mask.reshape(-1, seq_len),
                                 batch_size=batch_size).reshape(classes, templates, -1)
        predictions = zero_shot_predictions(image_emb, zero_shot_weights(prompt_emb))
        result["zero_shot_accuracy"] = float(np.mean(predictions == np.concatenate(labels)))
    for k in (1, 5):
        recall = recall_at_k(image_emb, text_emb, min(k, len(image_emb)))
        result[f"i2t_recall@{k}"], result[f"t2i_recall@{k}"] = recall["image_to_text"], recall["text_to_image"]
    return result
