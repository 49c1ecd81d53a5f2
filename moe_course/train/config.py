"""Training hyper-parameters, validated before anything is compiled."""

from __future__ import annotations

from dataclasses import dataclass

from moe_course.checks import check_integers, replace_validated

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

    def replace(self, **changes) -> "TrainConfig":
        """A copy with ``changes`` applied, validated. Unknown fields raise ValueError."""
        return replace_validated(self, changes)

    def validate(self) -> "TrainConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        check_integers(self, ("steps", "batch_size", "keep_checkpoints", "eval_batch_size"), minimum=1)
        check_integers(self, ("warmup_steps", "log_every", "eval_every", "checkpoint_every", "seed"), minimum=0)
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} is not allowed; use a value > 0")
        if not 0 <= self.end_lr_ratio <= 1:
            raise ValueError(f"end_lr_ratio={self.end_lr_ratio} is not allowed; use 0 <= ratio <= 1")
        if self.decay not in DECAYS:
            raise ValueError(f"decay={self.decay!r} is not allowed; use one of {', '.join(DECAYS)}")
        for field in ("weight_decay", "grad_clip"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field}={getattr(self, field)} is not allowed; use a value >= 0")
        return self
