"""The optimizers (optax) with linear warm-up and cosine or linear decay: AdamW, as ViT and V-MoE train, and
big_vision's Adam and SGD-momentum wiring (``big_vision/optax.py``), as its ImageNet and transfer configs train."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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


def kernel_mask(params):
    """True for every parameter whose name ends in "kernel" (dense and convolution kernels, expert kernels
    ``fc1_kernel``/``fc2_kernel``, router kernels), False for biases, LayerNorm scales, position embeddings and
    class tokens: big_vision's default weight-decay pattern ``.*/kernel$``."""
    def is_kernel(path, _):
        names = [key.key for key in path if isinstance(key, jax.tree_util.DictKey)]
        return bool(names) and str(names[-1]).endswith("kernel")

    return jax.tree_util.tree_map_with_path(is_kernel, params)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping (``grad_clip``; 0 = none) then the ``config.optimizer``.

    "adamw": optax.adamw with the learning-rate schedule; weight decay (lr x weight_decay per step) only on the
    kernels (``kernel_mask``, big_vision's default ``wd_mults`` pattern: no decay of biases, LayerNorms, position
    embeddings or the class token). "adam" / "sgd": big_vision's chain (``big_vision/optax.py`` ``make``):
    ``scale_by_adam(mu_dtype)`` or ``trace(momentum, accumulator_dtype=mu_dtype)``, ``scale(learning_rate)``,
    ``add_decayed_weights(weight_decay, kernel_mask)``, ``scale_by_schedule(schedule / learning_rate)``,
    ``scale(-1)``: the weight decay is scaled by the schedule's multiplier, not by the learning rate.
    """
    clip = [optax.clip_by_global_norm(config.grad_clip)] if config.grad_clip else []
    mu_dtype = jnp.dtype(config.mu_dtype)
    if config.optimizer == "adamw":
        return optax.chain(*clip, optax.adamw(learning_rate_schedule(config), weight_decay=config.weight_decay,
                                              mask=kernel_mask, mu_dtype=None if config.mu_dtype == "float32"
                                              else mu_dtype))  # None: the parameters' dtype, as before
    schedule = learning_rate_schedule(config)
    direction = (optax.scale_by_adam(mu_dtype=mu_dtype) if config.optimizer == "adam"
                 else optax.trace(decay=config.momentum, accumulator_dtype=mu_dtype))
    decay = [optax.add_decayed_weights(config.weight_decay, kernel_mask)] if config.weight_decay else []
    multiplier = lambda step: schedule(step) / config.learning_rate  # noqa: E731 -- in [0, 1]
    return optax.chain(*clip, direction, optax.scale(config.learning_rate), *decay,
                       optax.scale_by_schedule(multiplier), optax.scale(-1.0))


def restart_schedule(opt_state):
    """``opt_state`` with the step of every learning-rate schedule (``optax.ScaleByScheduleState.count``) set to 0
    and everything else kept: a carried state (``models.upcycle(..., optimizer_state=...)``) then follows the new
    run's own schedule from its step 0, as the training loop's step numbers and logged learning rate assume,
    while Adam's moments and their bias-correction count stay the carried ones."""
    def restart(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.zeros_like(node.count))
        return node

    return jax.tree.map(restart, opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
