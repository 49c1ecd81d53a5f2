"""`moe-course plan`: the run's own steps compiled for a TPU slice on compile-only devices (libtpu), and the
checks that refuse a bad topology or mesh before anything is compiled (those run without libtpu)."""

import importlib.util

import pytest

from moe_course.cli import main
from moe_course.configs import get_preset
from moe_course.parallel.chips import TPU_CHIPS, parse_topology
from moe_course.parallel.plan import check_plan_inputs, collectives, format_plan, shape_bytes
from moe_course.train import TrainConfig

TINY = get_preset("vmoe", "digits-tiny-moe")  # 8 experts, MoE in blocks 1 and 3, k = 2, groups of 8 images


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_collectives_are_read_from_the_hlo_text_sync_and_async():
    hlo = "\n".join([
        "  %all-to-all.1 = bf16[4,2,2176]{2,1,0:T(2,128)} all-to-all(%reshape.1), channel_id=1, dimensions={0}",
        "  %all-reduce.2 = (f32[4,128]{1,0}, f32[]{:T(128)}) all-reduce(%a, %b), to_apply=%add",
        "  %ag-start = (f32[8]{0}, f32[32]{0}) all-gather-start(%p), dimensions={0}",
        "  %ag-done = f32[32]{0} all-gather-done(%ag-start)",
        "  ROOT %tuple = (f32[4]{0}) tuple(%x)",
        "  %fusion = f32[4]{0} fusion(%all-to-all.1), kind=kLoop",  # an operand, not an instruction of that kind
    ])
    assert collectives(hlo) == {"all-to-all": {"count": 1, "bytes": 4 * 2 * 2176 * 2},
                                "all-reduce": {"count": 1, "bytes": 4 * 128 * 4 + 4},
                                "all-gather": {"count": 1, "bytes": 32 * 4}}
    assert shape_bytes("(pred[3]{0}, s8[2,2]{1,0}, f64[])") == 3 + 4 + 8


@pytest.mark.parametrize("name, expected", [
    ("v5x:2x2", "topology='v5x:2x2' is not a TPU topology; write chip:AxB[xC] with chip one of v3, v4, v5e, v5p, v6e"),
    ("v5e", "topology='v5e' is not a TPU topology"),
    ("v5e:2x2x2", "topology='v5e:2x2x2': v5e is a 2D torus, so it takes 2 sizes (e.g. v5e:2x2), not 3"),
    ("v4:2x2", "topology='v4:2x2': v4 is a 3D torus, so it takes 3 sizes (e.g. v4:2x2x1), not 2"),
    ("v5e:2x0", "topology='v5e:2x0': the sizes '2x0' are not positive integers"),
])
def test_bad_topology_is_refused_by_name_without_libtpu(name, expected, capsys):
    with pytest.raises(ValueError, match="topology=") as info:
        parse_topology(name)
    assert expected in str(info.value)
    assert main(["plan", "vmoe", "--preset", "digits-tiny-moe", "--topology", name]) == 2
    assert f"moe-course plan: error: {expected}" in _error_line(capsys)


def test_topology_device_counts_follow_the_chips():
    assert parse_topology("v5e:4x4").num_devices == 16
    assert parse_topology("v4:2x4x4").num_devices == 32  # megacore: one device per chip
    assert parse_topology("v3:2x2").num_devices == 8  # two TensorCores, two devices per chip
    assert parse_topology("v5p:2x2x1", num_slices=2).num_devices == 8
    assert TPU_CHIPS["v5e"].device_hbm_bytes == 16 * 2 ** 30 and TPU_CHIPS["v3"].device_peak_flops == 61.5e12
    with pytest.raises(ValueError, match="num_slices=0 is not allowed"):
        parse_topology("v5e:2x2", num_slices=0)


def test_bad_mesh_is_refused_before_any_compilation_without_libtpu(capsys):
    assert main(["plan", "vmoe", "--preset", "digits-tiny-moe", "--topology", "v5e:2x2", "--mesh", "data=3"]) == 2
    assert ("mesh='data=3,expert=1' has 3 devices, but 4 are in topology v5e:2x2; the axis sizes must multiply to 4"
            in _error_line(capsys))
    with pytest.raises(ValueError, match="num_experts=8 is not divisible by the mesh's expert axis"):
        check_plan_inputs(TINY, TrainConfig(), "v5e:4x4", "expert=16")
    with pytest.raises(ValueError, match="unknown axis 'model'"):
        check_plan_inputs(TINY, TrainConfig(), "v5e:2x2", "model=4")
    assert check_plan_inputs(TINY, TrainConfig(), "v5e:4x4", None)[1] == {"data": 2, "expert": 8}  # train's default


def test_unknown_preset_and_checkpoint_flags_are_refused_in_one_line(capsys):
    assert main(["plan", "vmoe", "--preset", "vmoe-z/3", "--topology", "v5e:2x2"]) == 2
    assert "preset='vmoe-z/3' is not a vmoe preset; allowed: " in _error_line(capsys)
    assert main(["plan", "vit", "--upcycle-from", "x.npz", "--topology", "v5e:2x2"]) == 2
    assert "--upcycle-from does not apply to plan" in _error_line(capsys)


def test_without_libtpu_the_plan_says_what_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    assert main(["plan", "vmoe", "--preset", "digits-tiny-moe", "--topology", "v5e:2x2", "--mesh", "expert=4"]) == 2
    assert ("--topology v5e:2x2: compile-only TPU devices need libtpu, which is not installed; "
            "pip install 'moe-course[tpu]'" in _error_line(capsys))


def test_tiny_vmoe_compiled_for_v5e_with_an_expert_axis():
    pytest.importorskip("libtpu", reason="libtpu (pip install 'moe-course[tpu]') gives the compile-only TPU devices")
    from moe_course.parallel.plan import plan_run

    plan = plan_run(TINY, TrainConfig(batch_size=32, eval_batch_size=32), "v5e:2x2", "data=2,expert=2",
                    evaluation=False)
    train = plan.train
    assert plan.topology.num_devices == 4 and plan.mesh == {"data": 2, "expert": 2} and plan.eval is None
    assert train.collectives["all-to-all"]["count"] >= 4  # dispatch + combine of 2 MoE layers, forward and backward
    assert train.collectives["all-to-all"]["bytes"] > 0 and "all-reduce" in train.collectives  # the gradients
    assert min(train.argument_bytes, train.output_bytes, train.temp_bytes, train.code_bytes) > 0
    # donation: the new parameters and optimizer state are written into the old ones' buffers
    assert train.alias_bytes >= 0.9 * train.output_bytes
    assert 0 < train.total_bytes < plan.hbm_bytes and plan.fits()
    assert train.flops > 0 and train.bytes_accessed > 0
    assert 0.8 < train.flops * 4 / train.analytic_flops < 1.5  # XLA's count beside the analytic one
    seconds = plan.roofline_seconds()
    assert seconds == max(train.flops / 197e12, train.bytes_accessed / 819e9) and 0 < plan.mfu_at_bound() < 1
    report = format_plan(plan)
    assert "fits (" in report and "all-to-all x" in report and "an estimate" in report


def test_a_batch_that_does_not_fit_shows_the_compilers_out_of_memory_message():
    pytest.importorskip("libtpu", reason="libtpu (pip install 'moe-course[tpu]') gives the compile-only TPU devices")
    from moe_course.parallel.plan import plan_run

    plan = plan_run(TINY, TrainConfig(batch_size=2 ** 18, eval_batch_size=32), "v5e:2x2", "expert=4",
                    evaluation=False)  # about 19 GiB of activations per device, on 16 GiB chips
    assert not plan.fits() and plan.train.total_bytes is None and plan.roofline_seconds() is None
    assert "RESOURCE_EXHAUSTED" in plan.train.out_of_memory and "HBM" in plan.train.out_of_memory
    assert "does not fit: the compiler ran out of memory: RESOURCE_EXHAUSTED" in format_plan(plan)


@pytest.mark.slow
def test_plan_command_prints_the_report(capsys):
    pytest.importorskip("libtpu", reason="libtpu (pip install 'moe-course[tpu]') gives the compile-only TPU devices")
    assert main(["plan", "vmoe", "--preset", "digits-tiny-moe", "--topology", "v5e:2x2", "--mesh", "expert=4",
                 "--batch-size", "32", "--no-eval"]) == 0
    out = capsys.readouterr().out
    assert "plan: digits-tiny-moe on v5e:2x2 (4 TPU v5 lite chips, 4 devices" in out
    assert "train step, batch 32 (compiled in" in out and "of 16.00 GiB HBM: fits" in out and "fits: True" in out
