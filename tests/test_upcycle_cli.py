"""`moe-course train vmoe --upcycle-from PATH [--init-format big_vision|moe-course]`: the big_vision ViT fixture and a
course dense run upcycled into V-MoEs and trained; bad combinations refused before anything compiles."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moe_course.cli import main
from moe_course.reference.upcycle import UPCYCLING_MOE
from moe_course.train.restore import load_run
from test_finetune_cli import _folder

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

BV_TOK = Path(__file__).parent / "fixtures" / "reference" / "bv_tok.npz"
FAST = ["--batch-size", "8", "--warmup-steps", "1", "--no-progress", "--data-workers", "0"]


def _summary(out: str) -> dict:
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def test_a_big_vision_vit_upcycles_with_the_papers_moe_layers_and_trains(tmp_path, capsys):
    """bv_tok (16 px, 2 blocks, 7 classes) at 32 px on a 3-class folder: block 1 becomes 32 experts with Expert
    Choice at C = 2, the head is new; 3 steps run and the run directory holds the V-MoE."""
    argv = ["train", "vmoe", "--upcycle-from", str(BV_TOK), "--init-format", "big_vision", "--image-size", "32",
            "--dataset", "imagefolder", "--data-dir", str(_folder(tmp_path / "data")), "--steps", "3",
            "--workdir", str(tmp_path / "run"), *FAST]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "into upcycled-big_vision: MoE in blocks [1], 32 experts" in out
    assert _summary(out)["steps"] == "3" and np.isfinite(float(_summary(out)["val_loss"]))
    config = load_run(tmp_path / "run").model_config
    assert {k: getattr(config, k) for k in UPCYCLING_MOE} == UPCYCLING_MOE
    assert (config.num_classes, config.image_size, config.value_range, config.gelu) == (3, 32, "signed", "tanh")


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory) -> Path:
    """digits-tiny trained for 2 steps (``moe-course train vit``)."""
    workdir = tmp_path_factory.mktemp("dense") / "run"
    assert main(["train", "vit", "--preset", "digits-tiny", "--steps", "2", "--workdir", str(workdir), *FAST]) == 0
    return workdir


def test_a_course_dense_run_upcycles_into_its_preset(dense_run, tmp_path, capsys):
    """digits-tiny -> digits-tiny-moe (the format read from the directory): after one step at a learning rate of
    1e-9 every expert of blocks 1 and 3 still is the dense run's MLP, and attention is the dense run's."""
    dense = load_run(dense_run).model
    argv = ["train", "vmoe", "--preset", "digits-tiny-moe", "--upcycle-from", str(dense_run), "--steps", "1",
            "--learning-rate", "1e-9", "--workdir", str(tmp_path / "moe"), *FAST]
    assert main(argv) == 0
    assert "(moe-course) into digits-tiny-moe: MoE in blocks [1, 3], 8 experts" in capsys.readouterr().out
    moe = load_run(tmp_path / "moe").model
    for block in (1, 3):
        experts = np.asarray(moe.blocks[block].mlp.experts.fc1_kernel[...])
        for expert in experts:
            np.testing.assert_allclose(expert, dense.blocks[block].mlp.fc1.kernel[...], atol=1e-6)
    np.testing.assert_allclose(moe.blocks[0].attn.query.kernel[...], dense.blocks[0].attn.query.kernel[...], atol=1e-6)


@pytest.mark.parametrize("flags, message", [
    (["train", "vit", "--upcycle-from", str(BV_TOK)], "builds a V-MoE; run `moe-course train vmoe"),
    (["train", "vmoe", "--upcycle-from", str(BV_TOK), "--init-format", "vmoe"],
     "init_format='vmoe' cannot be upcycled"),
    (["train", "vmoe", "--upcycle-from", "missing.npz"], "--upcycle-from: .*missing.npz"),
    (["train", "vmoe", "--upcycle-from", str(BV_TOK), "--preset", "digits-tiny-moe", "--dataset", "imagefolder",
      "--data-dir", "{data}"], r"'digits-tiny-moe' puts MoE layers in blocks \[3\], where the dense model .* has no "
                                "block \\(depth=2: blocks 0 to 1\\)"),
    (["train", "vmoe", "--upcycle-from", str(BV_TOK)], "--dataset digits has 1 channel"),
    (["train", "vmoe", "--upcycle-from", str(BV_TOK), "--init-checkpoint", str(BV_TOK), "--init-format",
      "big_vision"], "--upcycle-from and --init-checkpoint exclude each other"),
])
def test_bad_upcycling_flags_exit_2_with_one_line(flags, message, tmp_path, capsys):
    if "{data}" in flags:
        data = str(_folder(tmp_path / "data"))
        flags = [data if flag == "{data}" else flag for flag in flags]
    assert main(flags + ["--workdir", str(tmp_path / "run"), *FAST]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err


@pytest.mark.parametrize("flags, message", [
    (["--preset", "digits-fine-moe"], "patch_size=4 of config 'digits-fine-moe' differs from the dense model's "
                                      "patch_size=8"),
    (["--preset", "digits-tiny-moe", "--image-size", "64"],
     "image_size=64 is not allowed for run .*: it was trained at 32 px"),
    (["--init-format", "big_vision"], "--upcycle-from: .*run: Is a directory"),
])
def test_a_course_run_that_does_not_fit_exits_2(dense_run, flags, message, tmp_path, capsys):
    assert main(["train", "vmoe", "--upcycle-from", str(dense_run), *flags, "--workdir", str(tmp_path / "moe"),
                 *FAST]) == 2
    assert re.search(message, capsys.readouterr().err)


def _adam_and_schedule_counts(workdir: Path) -> tuple[int, int]:
    import jax
    import optax

    state = load_run(workdir).opt_state
    kinds = (optax.ScaleByAdamState, optax.ScaleByScheduleState)
    nodes = [n for n in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kinds)) if isinstance(n, kinds)]
    adam = next(n for n in nodes if isinstance(n, optax.ScaleByAdamState))
    schedule = next(n for n in nodes if isinstance(n, optax.ScaleByScheduleState))
    return int(adam.count), int(schedule.count)


@pytest.mark.parametrize("flags, carried", [([], True), (["--no-carry-optimizer-state"], False)])
def test_a_course_run_carries_its_optimizer_state_by_default(dense_run, flags, carried, tmp_path, capsys):
    """The dense run's Adam state (2 steps) is carried into the upcycled run: after its 1 step Adam has counted 3
    and the schedule 1 (restarted at 0); with --no-carry-optimizer-state Adam has counted 1."""
    argv = ["train", "vmoe", "--preset", "digits-tiny-moe", "--upcycle-from", str(dense_run), "--steps", "1",
            "--workdir", str(tmp_path / "moe"), *flags, *FAST]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ("optimizer state carried from the dense run" in out) == carried
    assert ("fresh optimizer" in out) == (not carried)
    assert _adam_and_schedule_counts(tmp_path / "moe") == ((3, 1) if carried else (1, 1))


def test_carrying_the_optimizer_state_is_refused_where_it_cannot_be(dense_run, tmp_path, capsys):
    """--carry-optimizer-state with a big_vision .npz (it holds no optimizer state), and the flag without
    --upcycle-from, exit 2 with one line (a state that does not fit the run's optimizer:
    tests/test_upcycle_optimizer.py)."""
    argv = ["train", "vmoe", "--upcycle-from", str(BV_TOK), "--init-format", "big_vision", "--image-size", "32",
            "--dataset", "imagefolder", "--data-dir", str(_folder(tmp_path / "data")), "--carry-optimizer-state",
            "--workdir", str(tmp_path / "run"), *FAST]
    assert main(argv) == 2
    assert "--carry-optimizer-state: " in capsys.readouterr().err
    assert main(["train", "vmoe", "--preset", "digits-tiny-moe", "--no-carry-optimizer-state", "--steps", "1",
                 "--workdir", str(tmp_path / "x"), *FAST]) == 2
    assert "apply with --upcycle-from only" in capsys.readouterr().err


def test_two_processes_upcycle_a_course_run(dense_run, tmp_path):
    """--upcycle-from with --num-processes 2 (one CPU device each, gloo): jax.distributed is joined before the
    dense run is read (reading it builds arrays, after which initialize raises), and both processes train."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["train", "vmoe", "--preset", "digits-tiny-moe", "--upcycle-from", str(dense_run), "--steps", "2",
            "--workdir", str(tmp_path / "moe"), "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
            *FAST, "--batch-size", "16"]  # a multiple of processes x group_size
    code = "import sys; from moe_course.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    processes = [subprocess.Popen([sys.executable, "-c", code, *argv, "--process-id", str(i)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    for process, out in zip(processes, outputs):
        assert process.returncode == 0, out[-3000:]
        assert "mesh {'expert': 2} over 2 devices in 2 process(es)" in out, out[-3000:]
        assert _summary(out)["steps"] == "2" and np.isfinite(float(_summary(out)["test_loss"])), out[-3000:]
