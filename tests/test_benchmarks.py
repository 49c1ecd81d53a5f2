"""The benchmark scripts run at tiny sizes and print their comparison tables (no timing is checked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str, timeout: int = 120) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=BENCHMARKS.parent,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("device: "), result.stdout[:500]
    return result.stdout


def _row(out: str, header: str, first: str) -> list[str]:
    """The fields of the row starting with ``first`` in the table below the line containing ``header``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if header in line)
    return next(line.split() for line in lines[start + 1:] if line.split()[:1] == [first])


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_attention_benchmark():
    out = _run("attention.py", "--batch", "2", "--tokens", "4", "--repeats", "1")
    assert "maps/fused" in out
    row = _row(out, "maps/fused", "4")
    assert len(row) == 4 and all(_is_number(field) for field in row)


@pytest.mark.slow
def test_moe_layer_benchmark():
    # --max-onehot-gib small enough that the 256-token group of --quick takes the skip path, not the 64 one.
    out = _run("moe_layer.py", "--quick", "--max-onehot-gib", "0.0003")
    assert "moe/dense" in out and "einsum/gather ms" in out and "einsum/gather MiB" in out
    layer = _row(out, "moe/dense", "8")  # ... ratio, then "faulted MiB/call dense, moe" as "12, 34"
    assert len(layer) == 9 and all(_is_number(field.removesuffix(",")) for field in layer)
    small = _row(out, "einsum/gather ms", "64")
    assert len(small) == 8 and all(_is_number(field) for field in small)
    large = _row(out, "einsum/gather ms", "256")
    assert large[4] == "skipped" and "GiB one-hot" in " ".join(large)
    products = _row(out, "distinct/2-D", "8")  # experts, k, rows, MiB, three times, two ratios
    assert len(products) == 9 and all(_is_number(field) for field in products)


@pytest.mark.slow
def test_soft_moe_benchmark():
    out = _run("soft_moe.py", "--quick")
    assert "soft/dense" in out and "tc/soft" in out and "smallest batch with soft/dense <= 1.5:" in out
    dense = _row(out, "soft/dense", "4")
    assert len(dense) == 4 and all(_is_number(field) for field in dense)
    sweep = _row(out, "tc/soft", "8")
    assert len(sweep) == 6 and all(_is_number(field) for field in sweep)


@pytest.mark.slow
def test_limoe_benchmark():
    out = _run("limoe.py", "--quick")
    assert "limoe/dense: FLOPs" in out
    for name in ("dense", "limoe"):
        row = _row(out, "MFLOPs/pair", name)
        assert len(row) == 3 and all(_is_number(field) for field in row[1:])


@pytest.mark.parametrize("script", ["attention.py", "moe_layer.py", "soft_moe.py", "limoe.py", "grading.py"])
def test_benchmark_help(script):
    assert _run_help(script).startswith("usage:")


def _run_help(script: str) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.slow
def test_mod_benchmark():
    out = _run("mod.py", "--quick")
    row = _row(out, "MoD/full", "attention")
    assert row[1:3] == ["0.5", "8"] and all(_is_number(field) for field in row[1:])


def test_torch_vs_jax_benchmark():
    pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")
    assert "usage:" in _run_help("torch_vs_jax.py")
    out = _run("torch_vs_jax.py", "--quick", timeout=300)  # compiles seven JAX gradients: slow on a busy CPU
    assert "PyTorch" in out.splitlines()[0]
    for layer in ("SparseMoE", "SoftMoE", "MoD"):
        row = _row(out, "torch/jax", layer)
        assert all(_is_number(field) for field in row[-3:]), row


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "soft"])
def test_glyphs_sweep_trains_and_reports_one_json_line(kind, tmp_path):
    out = _run("glyphs_sweep.py", kind, "--width", "16", "--mlp", "16", "--heads", "2", "--experts", "4",
               "--steps", "3", "--batch", "8", "--glyphs-per-digit", "2", "--out", str(tmp_path / "rows.jsonl"),
               timeout=300)
    row = json.loads(out.splitlines()[-1])
    assert row["kind"] == kind and row["steps"] == 3 and row["flops"] > 0 and 0 <= row["test_accuracy"] <= 1
    assert json.loads((tmp_path / "rows.jsonl").read_text()) == row


def test_glyphs_sweep_defaults_are_the_cli_presets_and_recipes():
    """With no options, a sweep run trains exactly what `moe-course train` trains for the kind's glyphs-tiny preset
    (same model config, same schedule up to checkpointing and logging, same data), so the digit-glyphs tables
    (docs/results.md, benchmarks/README.md) hold for either command."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import glyphs_sweep
    finally:
        sys.path.remove(str(BENCHMARKS))
    from moe_course.configs import get_preset
    from moe_course.data import load_dataset
    from moe_course.recipes import recipe_for

    for kind, (family, name) in glyphs_sweep.KINDS.items():
        config, schedule, data = glyphs_sweep.configs(glyphs_sweep.parse([kind, "--seed", "2"]))
        preset, recipe = get_preset(family, name), recipe_for(get_preset(family, name))
        cli_data = load_dataset("digit-glyphs", image_size=preset.image_size, seed=2)
        assert config == preset.replace(num_classes=cli_data.num_classes) == preset, kind
        assert schedule.replace(checkpoint_every=recipe.checkpoint_every, log_every=recipe.log_every,
                                eval_every=recipe.eval_every, eval_batch_size=recipe.eval_batch_size) \
            == recipe.replace(seed=2), kind
        assert data.config == cli_data.config, kind
    config, schedule, _ = glyphs_sweep.configs(glyphs_sweep.parse(
        ["soft", "--experts", "8", "--slots", "2", "--placement", "second-half", "--steps", "50", "--lr", "3e-3"]))
    assert (config.num_experts, config.slots_per_expert, config.moe_blocks()) == (8, 2, (2, 3))
    assert (schedule.steps, schedule.learning_rate, schedule.warmup_steps) == (50, 3e-3, 5)
    config, _, _ = glyphs_sweep.configs(glyphs_sweep.parse(["tc", "--allocation", "vanilla", "--capacity-ratio", "0.25"]))
    assert (config.allocation, config.capacity_ratio) == ("vanilla", 0.25)
    with pytest.raises(ValueError, match="--allocation vanilla is for Tokens Choice"):
        glyphs_sweep.configs(glyphs_sweep.parse(["ec", "--allocation", "vanilla"]))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classic", "dense"])
def test_limoe_sweep_trains_and_reports_one_json_line(kind, tmp_path):
    out = _run("limoe_sweep.py", kind, "--patch-size", "16", "--experts", "4", "--steps", "4", "--batch", "16",
               "--log-every", "2", "--eval-every", "4", "--out", str(tmp_path / "rows.jsonl"), timeout=300)
    row = json.loads(out.splitlines()[-1])
    assert json.loads((tmp_path / "rows.jsonl").read_text()) == row
    assert row["variant"] == "--patch-size 16 --experts 4 --steps 4 --batch 16"
    assert row["image_tokens"] == 4 and 0 < row["text_tokens"] <= 16 and row["flops"] > 0
    assert 0 <= row["test_zero_shot"] <= 1 and [s for s, _ in row["curves"]["loss"]] == [2, 4]
    assert all(top >= mean for (_, top), (_, mean) in zip(row["curves"]["loss_max"], row["curves"]["loss"]))
    if kind == "dense":
        assert row["routing"] == {} and row["config"]["placement"] == "none"
    else:  # two MoE layers (blocks 1 and 3), both modalities: success, busiest share, experts for 90%
        assert row["config"]["num_experts"] == 4 and len(row["routing"]) == 16
        assert all(0.25 <= row["routing"][f"busiest/{m}/layer{i}"] <= 1 for m in ("image", "text") for i in (0, 1))
        assert 0.25 <= row["curves"]["busiest/text/layer1"][-1][1] <= 1
        assert sum(row["routing"]["shares/text/layer0"]) == pytest.approx(1, abs=1e-3)
    table = subprocess.run([sys.executable, str(BENCHMARKS / "limoe_table.py"), str(tmp_path / "rows.jsonl")],
                           check=True, capture_output=True, text=True, timeout=120).stdout.splitlines()
    (line,) = [line for line in table if line.startswith(("| classic", "| dense"))]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[2] == f"{row['test_zero_shot']:.3f} ± 0.000 ({row['test_zero_shot']:.3f}-{row['test_zero_shot']:.3f})"
    assert (cells[4] == "--") == (kind == "dense") and cells[-1] == "0"


def test_limoe_sweep_defaults_are_the_cli_presets_and_recipes():
    """With no options, a LIMoE sweep run trains what `moe-course train limoe --preset P --seed S` trains."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import limoe_sweep
    finally:
        sys.path.remove(str(BENCHMARKS))
    from moe_course.configs import get_preset
    from moe_course.data import load_dataset
    from moe_course.recipes import recipe_for

    for kind, name in limoe_sweep.KINDS.items():
        config, schedule, data = limoe_sweep.configs(limoe_sweep.parse([kind, "--seed", "2"]))
        preset, recipe = get_preset("limoe", name), recipe_for(get_preset("limoe", name))
        assert config == preset, kind
        assert schedule.replace(checkpoint_every=recipe.checkpoint_every, log_every=recipe.log_every,
                                eval_every=recipe.eval_every, eval_batch_size=recipe.eval_batch_size) \
            == recipe.replace(seed=2), kind
        assert data.digits.config == load_dataset("digits-captions", seed=2).digits.config, kind
    config, _, _ = limoe_sweep.configs(limoe_sweep.parse(["dense", "--patch-size", "4", "--experts", "16"]))
    assert (config.patch_size, config.placement, config.num_experts) == (4, "none", 8)  # MoE options skip dense


def test_peers_benchmark():
    pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")
    assert "usage:" in _run_help("peers.py")
    out = _run("peers.py", "--quick", timeout=300)
    assert "skipped vmoe: no --vmoe PATH given" in out  # the peers that are absent are named, not silently left out
    rows = {line[:24].strip(): line[24:].split() for line in out.splitlines()
            if line.startswith(("ours (PyTorch)", "ours (JAX)", "ours, Tokens Choice", "ours, Experts Choice"))}
    assert len(rows) == 4, out
    for name, fields in rows.items():  # median, min-max, then one ours/peer ratio per peer that imported
        assert _is_number(fields[0]) and all(_is_number(f) for f in fields[1].split("-") + fields[2:]), name


def test_input_pipeline_benchmark():
    out = _run("input_pipeline.py", "--quick", timeout=300)
    # images/s at 0 and 1 workers, the ratio, images/s per CPU-second of a worker, the main process's ms a batch
    for kind in ("digits", "imagefolder"):
        row = _row(out, "Table 1", kind)
        assert len(row) == 6 and all(_is_number(field) for field in row[1:]) and float(row[5]) > 0, row
    transport = _row(out, "Table 1", "transport")  # no sender at 0 workers; bare queues at 1
    assert len(transport) == 6 and transport[1] == "nan" and float(transport[2]) > 0, transport
    assert float(transport[5]) > 0, transport
    # batch, bare steps/s, loop steps/s with 0 workers, loop/bare and its range, the pipeline's and the bare images/s
    loop = _row(out, "Table 2", "digits-tiny")
    folder = _row(out, "Table 2", "digits-tiny-moe")  # a V-MoE read from the JPEG folder
    assert folder[1] == "(JPEGs)", folder
    for row in (loop, folder[:1] + folder[2:]):
        assert len(row) == 8 and all(_is_number(field) for field in row[1:5] + row[6:]), row
        assert all(_is_number(f) for f in row[5].strip("[]").split("-")), row
    # the i1k step with and without RandAugment on the device, and RandAugment + mixup alone: ms, images/s
    for label in ("step without RandAugment", "step with RandAugment (2, 10)", "RandAugment (2, 10) + mixup alone"):
        ms, images = out.split(label, 1)[1].split("\n", 1)[0].split()[::2]
        assert float(ms) > 0 and float(images) > 0, (label, ms, images)
    assert "RandAugment's cost: " in out


@pytest.mark.slow
def test_upcycle_benchmark():
    """benchmarks/upcycle.py: the dense step and its two upcycled V-MoEs' in one table, ratios to the dense row."""
    out = _run("upcycle.py", "--quick", "--rounds", "1", "--steps", "1", timeout=300)
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| digits-tiny")]
    assert [row[0].strip() for row in rows] == ["digits-tiny", "digits-tiny-moe (upcycled)",
                                                "digits-tiny-upcycled-paper (E=32, EC, C=2)"]
    assert rows[0][2:4] == [" 1.00 ", " 1.000 "] and all(_is_number(field) for row in rows for field in row[1:4])


def test_accelerator_script_runs_a_part_and_refuses_an_unknown_one(tmp_path):
    """benchmarks/accelerator.sh (the GPU measurements in one run) as a dry run on the CPU: the device facts and
    the part's log in $OUT; an unknown part is named before anything runs."""
    env = {**os.environ, "QUICK": "1", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["bash", str(BENCHMARKS / "accelerator.sh")]
    wrong = subprocess.run(command + ["main", "warp"], env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "unknown part 'warp'" in wrong.stderr and not list(tmp_path.iterdir())
    result = subprocess.run(command + ["main"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "usable cores" in (tmp_path / "device.txt").read_text()
    log = (tmp_path / "main.log").read_text()
    assert "train_seconds:" in log and "test_accuracy:" in log and "== main: exit 0" in log, log


def test_chapter_robustness_reports_kept_runs_later_folders_winning(tmp_path):
    """--report rebuilds the table from --keep folders (the chapters themselves run in tests/test_chapters.py,
    through the same runner): key numbers read from each run's printed text, a later folder's run replacing
    an earlier one's, a failure listed with its reason, exit status 1."""
    def keep(folder, rows, texts):
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps({"cpu": "test", "rows": rows}))
        for (stem, run), text in texts.items():
            (folder / f"{stem}-{run}").mkdir()
            (folder / f"{stem}-{run}" / "outputs.json").write_text(json.dumps([{"text": text}]))

    row = dict(chapter="01_vit", isa="native", seed=0, seconds=90, numbers="", failure="")
    keep(tmp_path / "a", [{**row, "passed": False, "failure": "AssertionError: 0.7"},
                          {**row, "isa": "avx2", "passed": True}],
         {("01_vit", "native-seed0"): "x", ("01_vit", "avx2-seed0"): "trained; test accuracy 0.901 (logistic"})
    keep(tmp_path / "b", [{**row, "passed": True}],
         {("01_vit", "native-seed0"): "trained; test accuracy 0.905 (logistic regression: 0.146)"})
    result = subprocess.run([sys.executable, str(BENCHMARKS / "chapter_robustness.py"), "--report",
                             str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "2 of 2 runs passed" in result.stdout, result.stdout + result.stderr
    assert "native:0: test acc 0.905" in result.stdout and "avx2:0: test acc 0.901" in result.stdout
    failing = subprocess.run([sys.executable, str(BENCHMARKS / "chapter_robustness.py"), "--report",
                              str(tmp_path / "a")], capture_output=True, text=True, timeout=60)
    assert failing.returncode == 1 and "FAIL 01_vit native:0: AssertionError: 0.7" in failing.stdout


def test_chapter_robustness_refuses_a_run_that_is_not_isa_and_seed():
    result = subprocess.run([sys.executable, str(BENCHMARKS / "chapter_robustness.py"), "--runs", "avx512:0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "run 'avx512:0' is not ISA:SEED" in result.stderr, result.stderr


@pytest.mark.slow
def test_isa_drift_trains_under_both_instruction_sets():
    out = _run("isa_drift.py", "--quick", "--preset", "vmoe:digits-tiny-moe", timeout=600)
    assert "first MoE layer's expert choices for batch 0 at initialisation" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["6"]]
    assert len(rows) == 1 and all(_is_number(field) for field in rows[0]), out
    assert "test metric after 6 steps: native" in out


def test_multihost_input_benchmark():
    out = _run("multihost_input.py", "--quick", timeout=300)
    # P, images per process per step before and after, CPU-s per global batch before and after, their ratio
    for p in ("1", "2"):
        row = _row(out, "images/process/step", p)
        assert len(row) == 6 and all(_is_number(field) for field in row), row
        assert float(row[1]) == 8 and float(row[2]) == 8 / int(p), row  # --quick: a global batch of 8


def _upcycle_sweep():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import upcycle_sweep
    finally:
        sys.path.remove(str(BENCHMARKS))
    return upcycle_sweep


def test_upcycle_sweep_defaults_are_the_papers_moe_layers_on_the_glyphs_backbone():
    """benchmarks/upcycle_sweep.py with no options: glyphs-tiny's backbone (MLP 32) on 300 glyph classes, the
    paper's MoE layers (reference.upcycle.UPCYCLING_MOE) in blocks 1 and 3, the dense start's schedule."""
    from moe_course.configs import get_preset
    from moe_course.reference.upcycle import UPCYCLING_MOE

    sweep = _upcycle_sweep()
    args = sweep.parse(["--seed", "3"])
    dense, moe, data, schedule = sweep.configs(args)
    assert sweep.variant(args) == "" and data.num_classes == 300 and data.config.seed == 3
    assert dense == get_preset("vit", "glyphs-tiny").replace(mlp_dim=32, num_classes=300)
    assert moe.moe_blocks() == (1, 3) and all(getattr(moe, k) == v for k, v in UPCYCLING_MOE.items())
    assert (schedule.steps, schedule.batch_size, schedule.learning_rate, schedule.seed) == (5000, 128, 3e-3, 3)
    extra = sweep.extra_schedule(schedule, 240, 1e-3)
    assert (extra.steps, extra.learning_rate, extra.warmup_steps, extra.decay) == (240, 1e-3, 24, "cosine")
    assert sweep.variant(sweep.parse(["--experts", "8", "--extra-steps", "100"])) == "--extra-steps 100 --experts 8"
    with pytest.raises(ValueError, match="--extra-steps=0"):
        sweep.parse(["--extra-steps", "0"])


@pytest.mark.slow
def test_upcycle_sweep_trains_the_four_arms_at_equal_extra_flops(tmp_path):
    out = _run("upcycle_sweep.py", "--glyphs-per-digit", "2", "--batch", "8", "--experts", "4", "--dense-steps",
               "4", "--extra-steps", "2", "--measure-every", "1", "--out", str(tmp_path / "rows.jsonl"), timeout=600)
    rows = {row["kind"]: row for row in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
    assert list(rows) == ["dense-start", "upcycled", "dense", "scratch"]
    assert [json.loads(line)["kind"] for line in (tmp_path / "rows.jsonl").read_text().splitlines()] == list(rows)
    dense_flops = rows["dense"]["flops"]
    assert rows["upcycled"]["steps"] == round(2 * dense_flops / rows["upcycled"]["flops"])
    assert rows["scratch"]["steps"] == round(6 * dense_flops / rows["scratch"]["flops"])
    points = rows["upcycled"]["divergence"]
    assert [p["step"] for p in points] == list(range(rows["upcycled"]["steps"] + 1))
    assert points[0]["expert_distance"] == [0.0, 0.0] and points[-1]["expert_distance"][0] > 0
    assert rows["scratch"]["divergence"][0]["expert_distance"][0] > 1
    assert all(0 <= p[key][i] <= 1 for p in points for key in ("importance_entropy", "unserved") for i in (0, 1))
