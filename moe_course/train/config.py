"""Training hyper-parameters, validated before anything is compiled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moe_course.checks import check_choices, check_integers, check_number, replace_validated
from moe_course.data.randaugment import check_randaugment

DECAYS = ("cosine", "linear")
OPTIMIZERS = ("adamw", "adam", "sgd")
MOMENT_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    steps: optimizer steps. batch_size: examples per step. learning_rate: peak AdamW learning rate, reached
    after ``warmup_steps`` of linear warm-up and then decayed ("cosine" or "linear", as V-MoE Table 5) to
    ``end_lr_ratio`` of it.
    weight_decay: decoupled decay on the kernels only (``optim.kernel_mask``: big_vision's ``.*/kernel$``).
    grad_clip: global-norm clipping (0 = off).
    seed: parameter init, dropout/noise keys and data order. log_every / eval_every / checkpoint_every: in
    steps (0 = never; the last step always logs, evaluates and checkpoints). keep_checkpoints: newest kept.
    eval_batch_size: examples per evaluation batch.
    optimizer: "adamw" (optax.adamw: the decay step is learning rate x weight_decay, on the kernels;
    the default), or big_vision's wiring (``big_vision/optax.py`` ``make``) of "adam" (``optax.scale_by_adam``)
    or "sgd" (``big_vision.momentum_hp``: ``optax.trace`` with ``momentum``): update = -m(t) x (learning_rate x
    direction + weight_decay x parameter), where m(t) in [0, 1] is the schedule's multiplier -- the weight
    decay is decoupled and NOT multiplied by the learning rate, only by the schedule -- and it decays kernels
    only (big_vision's default ``wd_mults`` ``.*/kernel$``: every parameter whose name ends in "kernel").
    mu_dtype: dtype of Adam's first moment / SGD's momentum accumulator, "float32" (for "adamw": the parameters'
    dtype, optax's default) or "bfloat16" (big_vision's
    ``optax=dict(mu_dtype='bfloat16')``; ``momentum_hp`` keeps bfloat16). momentum: SGD's trace decay.
    mixup_p: mixup (``train.mixup``, big_vision ``utils.get_mixup``): 0 = off; else each step mixes its batch
    with itself rolled by one at a ratio max(a, 1 - a), a ~ Beta(p, p). randaugment: RandAugment (N, M) of the
    training images on the accelerator, inside the compiled step before mixup (``train.randaugment``; the same
    operations and magnitudes as an image folder's ``randaugment`` in the input workers); None = off. recipe: the
    recipe's name (``moe_course.recipes``), written to run.json; "" for none.
    Raises ValueError from ``validate`` (and ``replace``) naming the field, e.g. ``warmup_steps`` > ``steps``.
    """

    steps: int = 1000
    batch_size: int = 128
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    end_lr_ratio: float = 0.01
    decay: str = "cosine"
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 50
    eval_every: int = 0
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    eval_batch_size: int = 512
    optimizer: str = "adamw"
    mu_dtype: str = "float32"
    momentum: float = 0.9
    mixup_p: float = 0.0
    randaugment: tuple[int, float] | None = None
    recipe: str = ""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"decay": DECAYS, "optimizer": OPTIMIZERS,
                                                     "mu_dtype": MOMENT_DTYPES}

    def replace(self, **changes) -> "TrainConfig":
        """A copy with ``changes`` applied, validated. Unknown fields raise ValueError."""
        return replace_validated(self, changes)

    def validate(self) -> "TrainConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        check_integers(self, ("steps", "batch_size", "keep_checkpoints", "eval_batch_size"), minimum=1)
        check_integers(self, ("warmup_steps", "log_every", "eval_every", "checkpoint_every", "seed"), minimum=0)
        check_number(self, "learning_rate", minimum=0, above_minimum=True)
        check_number(self, "end_lr_ratio", minimum=0, maximum=1)
        check_choices(self)
        check_number(self, "weight_decay", minimum=0)
        check_number(self, "grad_clip", minimum=0)
        check_number(self, "momentum", minimum=0, maximum=1, below_maximum=True)
        check_number(self, "mixup_p", minimum=0)
        if self.randaugment is not None:
            check_randaugment(self.randaugment)
        if not isinstance(self.recipe, str):
            raise ValueError(f"recipe={self.recipe!r} is not allowed; use a recipe name (str) or ''")
        if self.warmup_steps > self.steps:  # the learning rate would never leave warm-up
            raise ValueError(f"warmup_steps={self.warmup_steps} is larger than steps={self.steps}: the run would "
                             f"end inside its learning-rate warm-up; use warmup_steps <= {self.steps}")
        return self
