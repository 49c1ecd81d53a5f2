"""Our models on the reference code's checkpoints give the reference code's logits and routing.

The fixtures in tests/fixtures/reference were made by tools/make_reference_fixtures.py from checkouts of
google-research/vmoe (its ``VisionTransformerMoe``, router, einsum dispatcher and experts, float32 dispatch)
and google-research/big_vision (its ViT); neither is needed here. Each case: the checkpoint in the
reference's own format, the images, the reference logits, the reference code's logits in its own bfloat16 mode
(same float32 weights) and, for vmoe, which (token, expert) pairs each MoE layer served and with what combine
weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.reference import (
    read_npz, read_vmoe_checkpoint, resize_position_embeddings, vit_from_big_vision, vmoe_config_from_checkpoint,
    vmoe_from_checkpoint,
)
from moe_course.models import with_dtype
from moe_course.reference.evaluate import load_reference
from moe_course.reference.names import seeded_parameters

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")  # vmoe's rounding

FIXTURES = Path(__file__).parent / "fixtures" / "reference"
TOLERANCE = 2e-4  # float32, different op order (einsum vs gather dispatch, fused attention)
# Our bfloat16 logits may be this many times as far from the float32 reference logits as the reference code's own
# bfloat16 logits are (largest |error| per case; measured 0.54-0.98 with the float32 residual stream).
BFLOAT16_FACTOR = 1.5


def outputs(case: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{case}.outputs.npz") as data:
        return {name: data[name] for name in data.files}


def served_pairs(record, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Our RoutingRecord -> ((groups, tokens, experts) bool: served (token, expert) pairs, their gates)."""
    index, served, gates = (np.asarray(a) for a in (record.expert_index, record.served, record.gates))
    mask = np.zeros(index.shape[:2] + (num_experts,), bool)
    weight = np.zeros(mask.shape, np.float32)
    g, t, c = np.nonzero(served)
    mask[g, t, index[g, t, c]] = True
    weight[g, t, index[g, t, c]] = gates[g, t, c]
    return mask, weight


def assert_bfloat16_error_within_the_reference_codes(model, reference: dict, case: str) -> None:
    """``model`` (float32 weights) run at dtype="bfloat16": its logits' largest distance from the reference's
    float32 logits is within BFLOAT16_FACTOR x that of the reference code's own bfloat16 logits."""
    logits = nnx.jit(lambda m, x: m(x).logits)(with_dtype(model, "bfloat16"), jnp.asarray(reference["images"]))
    assert logits.dtype == jnp.float32
    ours = np.abs(np.asarray(logits) - reference["logits"])
    theirs = np.abs(reference["logits_bfloat16"] - reference["logits"])
    print(f"{case}: bfloat16 |logit error| ours max {ours.max():.4f} median {np.median(ours):.4f}, "
          f"reference code max {theirs.max():.4f} median {np.median(theirs):.4f}")
    assert ours.max() <= BFLOAT16_FACTOR * theirs.max(), (ours.max(), theirs.max())


def assert_vmoe_equal(model, reference: dict) -> None:
    out = model(jnp.asarray(reference["images"]))
    difference = float(np.max(np.abs(np.asarray(out.logits) - reference["logits"])))
    assert difference < TOLERANCE * max(1.0, float(np.abs(reference["logits"]).max())), difference
    blocks = model.config.moe_blocks()
    assert len(out.routing) == len(blocks)
    dropped = []
    for block, record in zip(blocks, out.routing):
        mask, gates = served_pairs(record, model.config.num_experts)
        np.testing.assert_array_equal(mask, reference[f"served_{block}"], err_msg=f"block {block} routing")
        np.testing.assert_allclose(gates, reference[f"gates_{block}"], atol=1e-5, err_msg=f"block {block} gates")
        dropped.append(1 - float(np.asarray(record.served).mean()))
    assert max(dropped) > 0, "the cases are chosen so that the capacity drops tokens"


@pytest.mark.parametrize("case, pool, posemb", [("bv_tok", "cls", "learned"), ("bv_gap_scan", "gap", "learned"),
                                                ("bv_sincos", "gap", "sincos2d")])
def test_big_vision_vit_logits(case, pool, posemb):
    reference = outputs(case)
    size = reference["images"].shape[1]  # a sincos2d checkpoint records none: given
    model = vit_from_big_vision(FIXTURES / f"{case}.npz", image_size=size if posemb == "sincos2d" else None)
    assert (model.config.pool, model.config.gelu, model.config.posemb, model.config.image_size) == (
        pool, "tanh", posemb, size)
    logits = np.asarray(model(jnp.asarray(reference["images"])).logits)
    assert np.max(np.abs(logits - reference["logits"])) < TOLERANCE
    if "images_resized" in reference:  # 24 px: big_vision's resample_posemb vs our resize; sincos2d: both recompute
        size = reference["images_resized"].shape[1]
        resized = vit_from_big_vision(FIXTURES / f"{case}.npz", image_size=size)
        logits = np.asarray(resized(jnp.asarray(reference["images_resized"])).logits)
        assert np.max(np.abs(logits - reference["logits_resized"])) < TOLERANCE


def test_a_sincos2d_checkpoint_holds_every_parameter_and_nothing_else():
    """big_vision saves no table for posemb='sincos2d' (models/vit.py get_posemb recomputes it): our model's
    parameters are exactly the checkpoint's arrays, so the parameter counts agree; the fixed table is a constant."""
    from moe_course.models import vit_param_count

    arrays = read_npz(FIXTURES / "bv_sincos.npz")
    assert not any("pos_embedding" in name for name in arrays)
    model = load_reference(FIXTURES / "bv_sincos.npz", "big_vision", image_size=16)
    assert (model.config.posemb, model.config.image_size, model.pos_embed) == ("sincos2d", 16, None)
    params = nnx.state(model, nnx.Param)
    assert sum(a.size for a in arrays.values()) == vit_param_count(model.config) == sum(
        np.size(leaf) for leaf in jax.tree.leaves(params))


@pytest.mark.parametrize("case", ["vmoe_small_bpr", "vmoe_small_vanilla_k1", "vmoe_small_gap_round"])
def test_vmoe_logits_and_routing(case):
    model_config = json.loads((FIXTURES / f"{case}.model.json").read_text())
    model = vmoe_from_checkpoint(FIXTURES / case, model_config)
    dispatcher = model_config["encoder"]["moe"]["router"]["dispatcher"]
    assert model.config.allocation == ("bpr" if dispatcher["batch_priority"] else "vanilla")
    assert model.config.capacity_ratio == dispatcher["capacity_factor"]
    assert_vmoe_equal(model, outputs(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["vmoe_s32_every2", "vmoe_s32_last2"])
def test_vmoe_paper_size_logits_and_routing(case):
    """V-MoE S/32 with 32 experts at 224 px, weights regenerated from their names (too large to store)."""
    shapes = json.loads((FIXTURES / f"{case}.shapes.json").read_text())
    model_config = json.loads((FIXTURES / f"{case}.model.json").read_text())
    model = vmoe_from_checkpoint(seeded_parameters(shapes, seed=0), model_config)
    assert (model.config.width, model.config.depth, model.config.num_experts, model.config.k) == (512, 8, 32, 2)
    assert_vmoe_equal(model, outputs(case))
    assert_bfloat16_error_within_the_reference_codes(model, outputs(case), case)


@pytest.mark.parametrize("case", ["bv_tok", "bv_gap_scan", "bv_sincos", "vmoe_small_bpr", "vmoe_small_vanilla_k1",
                                  "vmoe_small_gap_round", "vmoe_small_soft"])
def test_bfloat16_logits_are_as_close_as_the_reference_codes_own(case):
    """Our models at dtype="bfloat16" (float32 residual stream, branches in bfloat16) against the reference code
    in its own bfloat16 mode (big_vision's dtype_mm, vmoe's encoder.dtype), both on the same float32 weights."""
    if case.startswith("bv_"):
        model = vit_from_big_vision(FIXTURES / f"{case}.npz", image_size=16)
    else:
        model = vmoe_from_checkpoint(FIXTURES / case, json.loads((FIXTURES / f"{case}.model.json").read_text()))
    assert_bfloat16_error_within_the_reference_codes(model, outputs(case), case)


def test_first_misfit_is_named(tmp_path):
    arrays = read_vmoe_checkpoint(FIXTURES / "vmoe_small_bpr")
    model_config = json.loads((FIXTURES / "vmoe_small_bpr.model.json").read_text())
    name = "Encoder/encoderblock_1/Moe/Mlp/Dense_0/bias"
    with pytest.raises(ValueError, match=f"parameter '{name}' is missing"):
        vmoe_from_checkpoint({k: v for k, v in arrays.items() if k != name}, model_config)
    with pytest.raises(ValueError, match=rf"parameter '{name}' has shape \(4, 65\), but our "
                                         rf"blocks.1.mlp.experts.fc1_bias needs \(4, 64\)"):
        vmoe_from_checkpoint({**arrays, name: np.zeros((4, 65), np.float32)}, model_config)
    with pytest.raises(ValueError, match="unexpected parameter 'Encoder/extra' of shape \\(3,\\)"):
        vmoe_from_checkpoint({**arrays, "Encoder/extra": np.zeros(3, np.float32)}, model_config)
    with pytest.raises(ValueError, match="dispatcher.batch_priority is missing"):
        del model_config["encoder"]["moe"]["router"]["dispatcher"]["batch_priority"]
        vmoe_from_checkpoint(arrays, model_config)


def test_position_embeddings_resize_keeps_the_class_entry():
    posemb = np.random.default_rng(0).normal(size=(1, 1 + 16, 3)).astype(np.float32)
    resized = resize_position_embeddings(posemb, 36, class_token=True)
    assert resized.shape == (1, 37, 3)
    np.testing.assert_array_equal(resized[:, 0], posemb[:, 0])
    assert np.array_equal(resize_position_embeddings(posemb, 16, class_token=True), posemb)
    grid_only = resize_position_embeddings(posemb[:, 1:], 16, class_token=True)  # big_vision: no class entry
    assert np.array_equal(grid_only[:, 0], np.zeros((1, 3))) and np.array_equal(grid_only[:, 1:], posemb[:, 1:])
    with pytest.raises(ValueError, match="neither a square grid"):
        resize_position_embeddings(posemb[:, :7], 16, class_token=True)


def test_a_sincos2d_checkpoint_gets_our_fixed_table_at_the_given_image_size():
    """big_vision's posemb='sincos2d' ViTs (its vit_s16_i1k checkpoints) save no position embeddings: the fixture
    without them loads with image_size given, its table is posemb_sincos_2d's grid, and every other parameter
    is the checkpoint's; without image_size it is refused by name."""
    from moe_course.models.vit import fixed_position_embeddings, sincos2d_position_embeddings
    from moe_course.reference.big_vision import unscan

    arrays = {n: a for n, a in unscan(read_npz(FIXTURES / "bv_gap_scan.npz")).items() if n != "pos_embedding"}
    with pytest.raises(ValueError, match="no position embeddings .* pass image_size"):
        vit_from_big_vision(arrays)
    model = vit_from_big_vision(arrays, image_size=24)
    assert (model.config.posemb, model.config.image_size, model.pos_embed) == ("sincos2d", 24, None)
    np.testing.assert_array_equal(fixed_position_embeddings(model.config), sincos2d_position_embeddings(6, 32))
    np.testing.assert_array_equal(model.head.kernel[...], arrays["head/kernel"])


def test_cli_evaluates_a_vmoe_checkpoint_on_an_image_folder(tmp_path, capsys):
    """`moe-course evaluate --checkpoint` on a 7-class folder of 16 px images: the accuracy is that of our
    converted model on the same images scaled to [-1, 1]; bad flags are one line (exit 2)."""
    from PIL import Image

    from moe_course.cli import main
    from moe_course.data import load_dataset

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(7):
            folder = tmp_path / "data" / split / f"class{label}"
            folder.mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / "0.png")
    prefix, config = FIXTURES / "vmoe_small_bpr", FIXTURES / "vmoe_small_bpr.model.json"
    common = ["evaluate", "--checkpoint", str(prefix), "--dataset", "imagefolder", "--data-dir",
              str(tmp_path / "data"), "--split", "val", "--batch-size", "8"]
    # C = 4 serves every token, so each image's logits do not depend on its batch mates or the eval order
    assert main(common + ["--format", "vmoe", "--model-config", str(config), "--capacity-ratio", "4"]) == 0
    summary = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    model = vmoe_from_checkpoint(prefix, json.loads(config.read_text()))
    images = load_dataset("imagefolder", tmp_path / "data", image_size=16).get("val", np.arange(7))
    predictions = np.asarray(model(jnp.asarray(np.concatenate([images["image"] * 2 - 1] * 2)[:8])).logits)
    accuracy = float(np.mean(predictions[:7].argmax(-1) == images["label"]))
    assert float(summary["val_accuracy"]) == round(accuracy, 4)
    assert (summary["capacity_ratio"], summary["format"]) == ("4.0", "vmoe")
    assert main(common) == 2
    assert capsys.readouterr().err.strip().endswith("--checkpoint needs --format (vmoe or big_vision)")


def _image_folder(root: Path, size: int, classes: int = 7) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / "0.png")
    return root


def test_a_vmoe_checkpoint_loads_at_another_image_size_with_a_new_group_size(tmp_path, capsys):
    """At 32 px the fixture's group of 34 tokens (two 16 px images) is no whole number of 65-token images, so
    loading needs group_size -- and with it, loads (library and CLI); the S/32 case of 384 px, groups of 8."""
    from moe_course.cli import main

    model_config = json.loads((FIXTURES / "vmoe_small_bpr.model.json").read_text())
    with pytest.raises(ValueError, match="group_size=34 tokens is not a whole number of images of 65 tokens"):
        vmoe_from_checkpoint(FIXTURES / "vmoe_small_bpr", model_config, image_size=32)
    model = vmoe_from_checkpoint(FIXTURES / "vmoe_small_bpr", model_config, image_size=32, group_size=2)
    assert (model.config.image_size, model.config.group_size, np.shape(model.pos_embed[...])) == (32, 2, (1, 65, 32))
    logits = np.asarray(model(jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)))).logits)
    assert logits.shape == (4, 7) and np.isfinite(logits).all()

    shapes = json.loads((FIXTURES / "vmoe_s32_every2.shapes.json").read_text())
    paper = {name: np.broadcast_to(np.float32(0), shape) for name, shape in shapes.items()}
    paper_config = json.loads((FIXTURES / "vmoe_s32_every2.model.json").read_text())
    config = vmoe_config_from_checkpoint(paper, paper_config, image_size=384, group_size=8)
    assert (config.image_size, config.num_tokens, config.group_size) == (384, 145, 8)

    data = _image_folder(tmp_path / "data", 32)
    argv = ["evaluate", "--checkpoint", str(FIXTURES / "vmoe_small_bpr"), "--format", "vmoe", "--model-config",
            str(FIXTURES / "vmoe_small_bpr.model.json"), "--dataset", "imagefolder", "--data-dir", str(data),
            "--split", "val", "--batch-size", "8", "--image-size", "32"]
    assert main(argv + ["--group-size", "2"]) == 0
    assert "image_size: 32" in capsys.readouterr().out
    assert main(argv) == 2
    assert "pass group_size" in capsys.readouterr().err


def test_cli_names_a_missing_or_broken_checkpoint_file_in_one_line(tmp_path, capsys):
    """A missing data shard, a wrong prefix, a missing or empty .npz, a missing model config: exit 2 and one
    line naming the file (README: bad input is one line, never a traceback)."""
    import shutil

    from moe_course.cli import main

    data = _image_folder(tmp_path / "data", 16)
    shutil.copy(FIXTURES / "vmoe_small_bpr.index", tmp_path / "partial.index")
    shutil.copy(FIXTURES / "vmoe_small_bpr.data-00000-of-00002", tmp_path / "partial.data-00000-of-00002")
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "cut.index").write_bytes((FIXTURES / "vmoe_small_bpr.index").read_bytes()[:100])
    config = str(FIXTURES / "vmoe_small_bpr.model.json")
    cases = {
        ("partial", "vmoe", config): "partial.data-00001-of-00002: a data shard of the checkpoint is missing",
        ("nothere", "vmoe", config): "nothere.index: no vmoe checkpoint index there",
        ("cut", "vmoe", config): "cut.index: not a vmoe checkpoint file",
        ("nothere.npz", "big_vision", None): "--checkpoint: " + str(tmp_path / "nothere.npz") + ": No such file",
        ("empty.npz", "big_vision", None): "empty.npz: not a readable .npz checkpoint",
        (str(FIXTURES / "vmoe_small_bpr"), "vmoe", str(tmp_path / "none.json")):
            "--model-config: " + str(tmp_path / "none.json") + ": No such file",
    }
    for (checkpoint, checkpoint_format, model_config), message in cases.items():
        argv = ["evaluate", "--checkpoint", str(tmp_path / checkpoint), "--format", checkpoint_format,
                "--dataset", "imagefolder", "--data-dir", str(data), "--split", "val"]
        assert main(argv + (["--model-config", model_config] if model_config else [])) == 2, checkpoint
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (checkpoint, err)


def test_on_to_pytorch_through_the_twins():
    """The converted V-MoE's PyTorch twin (``to_torch``) gives vmoe's logits and routing too."""
    torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (the torch extra)")
    from moe_course.torch.convert import to_torch

    reference = outputs("vmoe_small_bpr")
    model = vmoe_from_checkpoint(FIXTURES / "vmoe_small_bpr",
                                 json.loads((FIXTURES / "vmoe_small_bpr.model.json").read_text()))
    with torch.no_grad():
        out = to_torch(model)(torch.from_numpy(reference["images"]).permute(0, 3, 1, 2))
    assert np.max(np.abs(out.logits.numpy() - reference["logits"])) < TOLERANCE
    for block, record in zip(model.config.moe_blocks(), out.routing):
        mask, _ = served_pairs(record, model.config.num_experts)
        np.testing.assert_array_equal(mask, reference[f"served_{block}"])


def test_vmoe_soft_moe_logits_and_weights():
    """vmoe's Soft MoE (its SoftRouter, float32 dispatch) -> our SoftMoEViT: logits and every layer's dispatch
    and combine weights."""
    model_config = json.loads((FIXTURES / "vmoe_small_soft.model.json").read_text())
    model = vmoe_from_checkpoint(FIXTURES / "vmoe_small_soft", model_config)
    reference = outputs("vmoe_small_soft")
    assert (type(model).__name__, model.config.num_slots) == ("SoftMoEViT", 8)
    out = model(jnp.asarray(reference["images"]))
    assert np.max(np.abs(np.asarray(out.logits) - reference["logits"])) < TOLERANCE
    for block, record in zip(model.config.moe_blocks(), out.routing):
        np.testing.assert_allclose(record.dispatch_weights, reference[f"dispatch_{block}"], atol=1e-5)
        np.testing.assert_allclose(record.combine_weights, reference[f"combine_{block}"], atol=1e-5)


def test_qk_norm_checkpoints_are_refused_by_name():
    """vmoe's Soft MoE configs normalise queries and keys (key_ln, query_ln); our attention does not, so such a
    checkpoint is refused with a message saying so, not an "unexpected parameter" deep in the mapping."""
    arrays = read_vmoe_checkpoint(FIXTURES / "vmoe_small_soft")
    model_config = json.loads((FIXTURES / "vmoe_small_soft.model.json").read_text())
    width = model_config["hidden_size"]
    qk = {f"Encoder/encoderblock_0/SelfAttention/{name}/scale": np.ones(width // 2, np.float32)
          for name in ("key_ln", "query_ln")}
    with pytest.raises(ValueError, match="key_ln.*QK-norm checkpoints are not supported"):
        vmoe_from_checkpoint({**arrays, **qk}, model_config)



@pytest.mark.parametrize("case", ["bv_tok", "vmoe_small_bpr"])
def test_load_reference_takes_the_unit_pixels_of_the_course_datasets(case):
    """Both reference codes train on pixels in [-1, 1]: the model ``load_reference`` returns maps [0, 1] images to
    that range itself (``value_range="signed"``), so its logits on a course dataset's [0, 1] images are the
    stored model's on the same images in [-1, 1] -- the fixtures' reference logits -- and not those of [0, 1] fed
    to the stored model unchanged."""
    if case == "bv_tok":
        stored, fmt, config = vit_from_big_vision(FIXTURES / f"{case}.npz"), "big_vision", None
        path = FIXTURES / f"{case}.npz"
    else:
        config = json.loads((FIXTURES / f"{case}.model.json").read_text())
        path, fmt = FIXTURES / case, "vmoe"
        stored = vmoe_from_checkpoint(path, config)
    loaded = load_reference(path, fmt, model_config=config)
    assert (stored.config.value_range, loaded.config.value_range) == ("unit", "signed")
    signed = jnp.asarray(outputs(case)["images"])  # the fixtures' images are drawn in [-1, 1]
    unit = (signed + 1) / 2
    np.testing.assert_allclose(np.asarray(loaded(unit).logits), np.asarray(stored(signed).logits), atol=1e-4)
    assert np.max(np.abs(np.asarray(loaded(unit).logits) - np.asarray(stored(unit).logits))) > 1e-2
