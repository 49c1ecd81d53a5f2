"""Load a trained model back from a run directory written by ``train``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from flax import nnx

from moe_course.configs import config_from_dict
from moe_course.models import build_model
from moe_course.train.checkpoint import RunCheckpoints, WorkdirError
from moe_course.train.config import TrainConfig
from moe_course.train.optim import make_optimizer


@dataclass
class TrainedRun:
    """model: parameters of the newest checkpoint. step: its step. history: metrics up to it. opt_state: the
    optimizer state saved with them (the optax state of ``make_optimizer(train_config)`` on the model's
    ``nnx.Param`` state), e.g. to carry into an upcycled V-MoE (``models.upcycle(..., optimizer_state=...)``)."""

    model: nnx.Module
    model_config: object
    train_config: TrainConfig
    data: dict
    step: int
    history: list[dict]
    opt_state: object = None


def load_run(workdir: str | Path, step: int | None = None) -> TrainedRun:
    """The newest checkpoint of the run in ``workdir`` that restores (a damaged newer one is skipped, saying so),
    or with ``step`` exactly that checkpoint (its restore errors propagate).

    Raises WorkdirError (a ValueError) naming the path when there is no run, no checkpoint, or none restores.
    """
    workdir = Path(workdir)
    record_path = workdir / "run.json"
    if not record_path.is_file():
        raise WorkdirError(f"{record_path}: not found; expected a run directory written by `moe-course train`")
    record = json.loads(record_path.read_text())
    model_config = config_from_dict(record["model"])
    train_config = TrainConfig(**record["train"]).validate()
    model = build_model(model_config, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    checkpoints = RunCheckpoints(workdir, keep=train_config.keep_checkpoints)
    try:
        opt_state = make_optimizer(train_config).init(params)
        like = {"params": params, "opt_state": opt_state}
        newest = checkpoints.restore_newest(like) if step is None else (step, *checkpoints.restore(step, like))
        if newest is None:
            raise WorkdirError(f"{workdir / 'checkpoints'}: no checkpoint; expected at least one saved step")
        step, state, history = newest
    finally:
        checkpoints.close()
    return TrainedRun(nnx.merge(graphdef, state["params"], rest), model_config, train_config, record["data"],
                      step, history, state["opt_state"])
