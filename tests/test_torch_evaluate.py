"""A V-MoE trained with ``moe-course train vmoe`` converts to PyTorch and gives the same test accuracy there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from moe_course.cli import main  # noqa: E402
from moe_course.data import load_dataset  # noqa: E402
from moe_course.data.base import eval_batches  # noqa: E402
from moe_course.torch.convert import to_torch  # noqa: E402
from moe_course.train.restore import load_run  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")


def _summary(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.strip().splitlines() if ": " in line)


def test_trained_vmoe_has_the_same_test_accuracy_in_pytorch(tmp_path, capsys):
    train = ["train", "vmoe", "--preset", "digits-tiny-moe", "--image-size", "16", "--batch-size", "32",
             "--steps", "10", "--warmup-steps", "2", "--workdir", str(tmp_path),
             "--no-progress"]
    assert main(train) == 0
    trained = _summary(capsys.readouterr().out)
    # At C = 0.5 tokens are dropped: the dropped ones must be the same in both frameworks for equal accuracy.
    assert main(["evaluate", "--workdir", str(tmp_path), "--framework", "both", "--capacity-ratio", "0.5"]) == 0
    both = _summary(capsys.readouterr().out)
    assert main(["evaluate", "--workdir", str(tmp_path), "--framework", "torch"]) == 0
    torch_only = _summary(capsys.readouterr().out)
    assert torch_only["torch_test_accuracy"] == trained["test_accuracy"]
    assert abs(float(torch_only["torch_test_loss"]) - float(trained["test_loss"])) <= 1e-4
    assert both["torch_test_accuracy"] == both["test_accuracy"]
    assert abs(float(both["torch_test_loss"]) - float(both["test_loss"])) <= 1e-4
    assert "test_accuracy" not in torch_only
    # Beyond the summary numbers: every test image gets the same logits (to 1e-4) and so the same prediction.
    run = load_run(tmp_path)
    twin = to_torch(run.model)
    batch = next(eval_batches(load_dataset("digits", None, image_size=16), "test", 256, order_seed=0))
    ours = np.asarray(run.model(jnp.asarray(batch["image"])).logits)
    got = twin(torch.from_numpy(batch["image"]).permute(0, 3, 1, 2)).logits.detach().numpy()
    np.testing.assert_allclose(got, ours, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(got.argmax(-1), ours.argmax(-1))
