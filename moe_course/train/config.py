"""Training hyper-parameters, validated before anything is compiled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moe_course.checks import check_choices, check_integers, check_number, replace_validated

DECAYS = ("cosine", "linear")


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    steps: optimizer steps. batch_size: examples per step. learning_rate: peak AdamW learning rate, reached
    after ``warmup_steps`` of linear warm-up and then decayed ("cosine" or "linear", as V-MoE Table 5) to
    ``end_lr_ratio`` of it.
    weight_decay: decoupled AdamW decay on matrices (ndim >= 2). grad_clip: global-norm clipping (0 = off).
    seed: parameter init, dropout/noise keys and data order. log_every / eval_every / checkpoint_every: in
    steps (0 = never; the last step always logs, evaluates and checkpoints). keep_checkpoints: newest kept.
    eval_batch_size: examples per evaluation batch.
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

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"decay": DECAYS}

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
        if self.warmup_steps > self.steps:  # the learning rate would never leave warm-up
            raise ValueError(f"warmup_steps={self.warmup_steps} is larger than steps={self.steps}: the run would "
                             f"end inside its learning-rate warm-up; use warmup_steps <= {self.steps}")
        return self
