"""The training command under failures: a corrupt image in the data, and SIGKILL at any moment.

Both run ``moe-course train`` as a separate process (as a user would), with a timeout, so a hang fails the
test instead of stalling CI.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from moe_course.data.base import epoch_order
from moe_course.data.folders import ImageFolder
from moe_course.train.checkpoint import RunCheckpoints
from moe_course.train.restore import load_run

TIMEOUT = 180  # seconds; a healthy run here takes well under a minute


def _env(tmp_path: Path) -> dict[str, str]:
    """The environment of every launch: one persistent XLA compilation cache, so that restarts do not compile
    again (the compiled programs, hence the numbers, are the same)."""
    return {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _command(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "moe_course.cli", "train", "vit", "--preset", "digits-tiny", "--image-size", "16",
            "--warmup-steps", "1", "--workdir", str(workdir), "--no-progress", *args]


def _image_tree(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", 5), ("val", 1), ("test", 1)):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / split / name / f"{i}.png")
    return root


def test_corrupt_image_stops_the_run_with_one_line_and_keeps_its_checkpoints(tmp_path):
    root = _image_tree(tmp_path / "data")
    bad = root / "train" / "dog" / "9.jpeg"
    bad.write_bytes(b"\xff\xd8 this is not a JPEG")  # 11 training images, 5 steps of 2 per epoch
    files = ImageFolder(root, image_size=16).files("train")
    # A seed whose first epoch reads the corrupt file at step 3, so that checkpoints 1 and 2 exist before it.
    seed = next(s for s in range(100) if np.argmax(epoch_order(len(files), seed=s, epoch=0) == files.index(str(bad))) // 2 == 2)
    workdir = tmp_path / "run"
    result = subprocess.run(
        _command(workdir, "--dataset", "imagefolder", "--data-dir", str(root), "--batch-size", "2", "--steps", "10",
                 "--checkpoint-every", "1", "--seed", str(seed)),
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(tmp_path),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"moe-course train: error: --data-dir: {bad}: not a readable image")
    run = load_run(workdir)
    assert run.step == 2 and _every_checkpoint_restores(workdir) == [1, 2]


def _checkpoint_entries(workdir: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(workdir / "checkpoints"))
    except FileNotFoundError:
        return []


def _every_checkpoint_restores(workdir: Path) -> list[int]:
    """Restore every checkpoint step on disk, not only the newest; return the steps."""
    if not (workdir / "run.json").exists():
        return []
    checkpoints = RunCheckpoints(workdir)
    steps = checkpoints.steps()
    checkpoints.close()
    for step in steps:
        assert load_run(workdir, step).step == step
    return steps


def _summary(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.strip().splitlines() if ": " in line and not line.startswith("Resum"))


def _run_until(command: list[str], moment, env: dict, *, poll: float = 0.002) -> bool:
    """Start ``command``; SIGKILL it as soon as ``moment()`` is true. Returns True if it was killed, False if it
    ended first (a failure of the test's timing, asserted by the caller)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + TIMEOUT
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if moment():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(poll)
        assert proc.poll() is not None, "the run neither reached the moment nor ended"
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sigkill_at_any_moment_then_restart_ends_like_an_uninterrupted_run(tmp_path):
    args = ("--batch-size", "16", "--steps", "8", "--checkpoint-every", "4")
    env = _env(tmp_path)
    straight = subprocess.run(_command(tmp_path / "straight", *args), capture_output=True, text=True, timeout=TIMEOUT,
                              env=env)
    assert straight.returncode == 0, straight.stderr[-3000:]

    workdir = tmp_path / "killed"
    command = _command(workdir, *args)

    def after(seconds):
        start = time.monotonic()
        return lambda: time.monotonic() - start >= seconds

    def writing_a_checkpoint():  # orbax writes into a new temporary directory and renames it when complete
        before = set(_checkpoint_entries(workdir))
        return lambda: any(not name.isdigit() and name not in before for name in _checkpoint_entries(workdir))

    def checkpoint_appeared(step):
        return lambda: str(step) in _checkpoint_entries(workdir)

    moments = [  # (what, when to kill, the checkpoints that must then restore)
        ("while starting (imports, run.json, compilation)", lambda: after(1.5), []),
        ("during the first checkpoint write", writing_a_checkpoint, []),
        ("right after a checkpoint is complete", lambda: checkpoint_appeared(4), [4]),
        ("during a later checkpoint write", writing_a_checkpoint, [4]),
        ("after the last checkpoint, during the test evaluation", lambda: checkpoint_appeared(8), [4, 8]),
    ]
    for what, moment, expected in moments:
        assert _run_until(command, moment(), env), f"the run ended before it could be killed {what}"
        assert _every_checkpoint_restores(workdir) == expected, what  # never a checkpoint that fails to restore
    final = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "Resuming from the checkpoint of step 8" in final.stdout
    ours, theirs = _summary(final.stdout), _summary(straight.stdout)
    assert (ours["test_accuracy"], ours["test_loss"]) == (theirs["test_accuracy"], theirs["test_loss"])
    a, b = load_run(tmp_path / "straight"), load_run(workdir)
    assert a.step == b.step == 8 and [h["step"] for h in a.history] == [h["step"] for h in b.history]
    for p, q in zip(jax.tree.leaves(nnx.state(a.model, nnx.Param)), jax.tree.leaves(nnx.state(b.model, nnx.Param))):
        np.testing.assert_allclose(p, q, rtol=1e-6, atol=1e-7)
