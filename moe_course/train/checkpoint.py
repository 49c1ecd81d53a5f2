"""Atomic checkpoints of a training run with orbax: parameters, optimizer state and metric history.

Layout: ``workdir/run.json`` (the model and train configs, written once, atomically) and
``workdir/checkpoints/<step>/`` (orbax; a step directory appears only when complete, so a run killed while
saving leaves the previous checkpoint intact).

The input pipeline's state is the step itself: batch s depends only on (seed, s) (``data.pipeline``), so a
run resumed from the checkpoint of step s restarts its pipeline at s, whatever the number of data workers.

On a mesh over several processes (``jax.distributed``) every process calls ``save`` and ``restore`` with its
own shards of the same global arrays on a workdir all of them see (a shared file system); orbax writes each
process's shards and commits the step directory once all have finished, so the step appears whole or not at
all, as on one process. The arrays carry no process count: a checkpoint written by P processes restores in
any other number (its ``like`` gives the new layout).

A checkpoint damaged after it was written (a truncated file: a full disk, a bad copy) is skipped when
restoring: ``restore_newest`` says in one line which step is damaged and which one is used instead, and
raises ``WorkdirError`` naming the workdir when none restores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class WorkdirError(ValueError):
    """A run directory (``--workdir``) is missing, holds no run, or none of its checkpoints restores."""


def _first_line(exc: BaseException, limit: int = 160) -> str:
    """The root cause of ``exc`` on one line, shortened (orbax wraps tensorstore's message several times)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _atomic_write_text(path: Path, text: str) -> None:
    # one temporary name per process: on a pod every process records the same run.json in the shared workdir
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# Orbax numbers its save operations with one process-wide counter (synchronization.OperationIdGenerator) and its
# background commit waits for signals under the current number: two runs saving at once from threads of one process
# (train.concurrent.train_side_by_side) can wait for each other's signal until orbax's 300 s timeout (seen in CI:
# "Timeout waiting for key 'awaitable_signals_contract_3/step_directory_creation'"). One save or restore at a time.
_ORBAX = threading.RLock()


class RunCheckpoints:
    """Save and restore the training state of one run directory."""

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 2):
        self.workdir = Path(workdir).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._manager = ocp.CheckpointManager(
            self.workdir / "checkpoints", options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        )

    def latest_step(self) -> int | None:
        """The newest checkpoint step on disk, or None when there is none."""
        return self._manager.latest_step()

    def steps(self) -> list[int]:
        """Every checkpoint step on disk, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: dict[str, Any], history: list[dict]) -> None:
        """Write the checkpoint of ``step`` (state: a pytree of arrays) and block until it is on disk."""
        with _ORBAX:
            self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), history=ocp.args.JsonSave(history)),
                force=True,
            )
            self._manager.wait_until_finished()

    def restore(self, step: int, like: dict[str, Any]) -> tuple[dict[str, Any], list[dict]]:
        """The state saved at ``step``, with the structure, shapes and dtypes of ``like``, and its history."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        with _ORBAX:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), history=ocp.args.JsonRestore())
            )
        return restored.state, list(restored.history)

    def restore_newest(self, like: dict[str, Any], *, set_aside_damaged: bool = False
                       ) -> tuple[int, dict[str, Any], list[dict]] | None:
        """(step, state, history) of the newest checkpoint that restores, or None when there is no checkpoint.

        A checkpoint that fails to restore is reported in one line on stderr, naming it and the step used
        instead. ``set_aside_damaged`` (for a run that will train on) renames damaged step directories to
        ``<step>.damaged`` so that the steps saved again later do not collide with them.
        Raises WorkdirError naming the workdir when no checkpoint restores.
        """
        steps = self.steps()[::-1]
        if not steps:
            return None
        damaged: list[str] = []
        for step in steps:
            try:
                state, history = self.restore(step, like)
            except Exception as exc:  # orbax/tensorstore raise many types for a damaged file; report, try older
                damaged.append(f"step {step} ({_first_line(exc)})")
                continue
            if damaged:
                moved = self._set_aside(steps[:len(damaged)]) if set_aside_damaged else ""
                print(f"the checkpoint of {'; '.join(damaged)} in {self.workdir / 'checkpoints'} is damaged{moved}; "
                      f"using the checkpoint of step {step}", file=sys.stderr)
            return step, state, history
        raise WorkdirError(
            f"{self.workdir}: none of the checkpoints restores ({'; '.join(damaged)}); move "
            f"{self.workdir / 'checkpoints'} away to start the run afresh, or restore it from a good copy"
        )

    def _set_aside(self, steps: list[int]) -> str:
        root = self.workdir / "checkpoints"
        for step in steps:
            os.replace(root / str(step), root / f"{step}.damaged")
        self._manager.reload()
        return f", moved to {', '.join(f'{s}.damaged' for s in steps)}"

    def check_run_config(self, configs: dict[str, Any], defaults: dict[str, dict] | None = None) -> None:
        """``configs``: {section: dataclass or flat dict}. Record the run's configs on first use; later, refuse to resume into a different model or data.

        Raises ValueError naming each field whose value differs from the one the checkpoints were made with
        (``train.steps`` may change: it extends or shortens the schedule). ``defaults`` {section: {field:
        default}}: a field that the saved record lacks (a field added to the library after the run was made)
        matches when the value now is its default, which is what the older run used.
        """
        record = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in configs.items()}
        record = json.loads(json.dumps(record))  # tuples -> lists, as they come back from disk
        path = self.workdir / "run.json"
        if not path.exists():
            _atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True))
            return
        saved = json.loads(path.read_text())
        defaults = json.loads(json.dumps(defaults or {}))
        for section, fields in saved.items():
            for field, value in defaults.get(section, {}).items():
                fields.setdefault(field, value)
        diffs = [
            f"{section}.{field}: saved {saved.get(section, {}).get(field)!r}, now {value!r}"
            for section, fields in record.items()
            for field, value in fields.items()
            if (section, field) != ("train", "steps") and saved.get(section, {}).get(field) != value
        ]
        if diffs:
            raise ValueError(
                f"workdir {self.workdir} holds a different run ({'; '.join(diffs)}); "
                "use a new workdir or the same settings to resume"
            )

    def close(self) -> None:
        """Waits for pending asynchronous checkpoint writes and releases the manager."""
        self._manager.close()
