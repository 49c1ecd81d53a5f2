"""AdamW with linear warm-up and cosine decay (optax), as ViT and V-MoE train."""

from __future__ import annotations

import jax
import optax

from moe_course.train.config import TrainConfig


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
    """Step -> learning rate: 0 -> peak linearly over warmup_steps, then cosine or linear down to
    end_lr_ratio * peak at the last step."""
    warmup = min(config.warmup_steps, config.steps)
    end = config.learning_rate * config.end_lr_ratio
    if config.decay == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=config.learning_rate, warmup_steps=warmup,
            decay_steps=max(config.steps, warmup + 1), end_value=end,
        )
    return optax.join_schedules(
        [optax.linear_schedule(0.0, config.learning_rate, max(warmup, 1)),
         optax.linear_schedule(config.learning_rate, end, max(config.steps - warmup, 1))],
        boundaries=[max(warmup, 1)],
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW; weight decay only on matrices and kernels (ndim >= 2)."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    adamw = optax.adamw(learning_rate_schedule(config), weight_decay=config.weight_decay, mask=decay_mask)
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw) if config.grad_clip else adamw
