"""Mesh specs and their errors (one process, one device: the checks run before any device is touched)."""

import pytest

from moe_course import parallel
from moe_course.parallel import distributed_settings, make_mesh, parse_mesh_spec

FAKE = [object()] * 8  # make_mesh checks the spec against the device count before building the mesh


def test_spec_parses_and_size_one_axes_disappear():
    assert parse_mesh_spec("data=2,expert=4") == {"data": 2, "expert": 4}
    assert parse_mesh_spec(" expert = 8 ") == {"data": 1, "expert": 8}
    mesh = make_mesh("data=1")
    assert mesh.axis_names == ("data",) and mesh.devices.size == 1
    assert parallel.format_mesh(mesh) == "data=1,expert=1"


def test_default_mesh_puts_as_many_experts_as_divide_on_the_expert_axis():
    assert parallel.default_mesh_sizes(8, 32) == {"data": 1, "expert": 8}
    assert parallel.default_mesh_sizes(8, 4) == {"data": 2, "expert": 4}
    assert parallel.default_mesh_sizes(6, 4) == {"data": 3, "expert": 2}
    assert parallel.default_mesh_sizes(8) == {"data": 8, "expert": 1}


@pytest.mark.parametrize("spec, devices, experts, message", [
    ("data=2,expert=2", 8, None,
     r"^mesh='data=2,expert=2' has 4 devices, but 8 are visible; the axis sizes must multiply to 8$"),
    ("data=2,model=4", 8, None, r"^mesh='data=2,model=4': unknown axis 'model'; allowed axes: data, expert$"),
    ("expert=4,expert=2", 8, None, r"axis 'expert' is given twice"),
    ("data=two", 8, None, r"the size of axis 'data' is 'two'; it must be a positive integer"),
    ("data:8", 8, None, r"'data:8' is not axis=size"),
    ("data=0,expert=8", 8, None, r"size of axis 'data' is '0'"),
    ("expert=8", 8, 12, r"^num_experts=12 is not divisible by the mesh's expert axis \(8 devices\)"),
])
def test_invalid_spec_is_one_line_naming_the_field(spec, devices, experts, message):
    with pytest.raises(ValueError, match=message) as err:
        make_mesh(spec, devices=FAKE[:devices], num_experts=experts)
    assert "\n" not in str(err.value)


def test_mesh_must_fit_the_run(tiny_vit_config):
    from moe_course.configs import VMoEConfig
    from moe_course.train import TrainConfig

    mesh = make_mesh("data=1")
    config = VMoEConfig(**{**tiny_vit_config.__dict__, "num_experts": 4, "group_size": 4})
    parallel.check_mesh_fits(mesh, config, TrainConfig(batch_size=8, eval_batch_size=16))
    with pytest.raises(ValueError, match=r"^batch_size=6 does not split over mesh 'data=1,expert=1': it must be a "
                                         r"multiple of group_size x devices = 4$"):
        parallel.check_mesh_fits(mesh, config, TrainConfig(batch_size=6))


def test_distributed_settings_from_flags_then_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert distributed_settings(environ=env) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                                 "process_id": 3}
    assert distributed_settings(process_id=1, environ=env)["process_id"] == 1
    assert distributed_settings(environ={}) == {}  # JAX detects SLURM / MPI / TPU pods itself
    with pytest.raises(ValueError, match=r"^process_id=4 must be in 0\.\.3 \(num_processes=4\)$"):
        distributed_settings(process_id=4, environ=env)
    with pytest.raises(ValueError, match=r"^coordinator_address='node0' must be host:port"):
        distributed_settings(coordinator_address="node0", environ={})
    with pytest.raises(ValueError, match=r"^JAX_NUM_PROCESSES='many': num_processes must be"):
        distributed_settings(environ={"JAX_NUM_PROCESSES": "many"})


def test_cli_refuses_a_mesh_that_does_not_fit_in_one_line(capsys, tmp_path):
    from moe_course.cli import main

    code = main(["train", "vmoe", "--preset", "digits-tiny-moe", "--mesh", "data=2,expert=2", "--workdir",
                 str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("moe-course train: error: mesh='data=2,expert=2' has 4 devices, but 1 are visible")
    assert not (tmp_path / "run").exists()  # refused before anything was written or compiled


def test_shard_model_names_num_experts_when_the_experts_do_not_split(tiny_vit_config):
    """Before anything is placed: a model with 6 experts on an expert axis of 4 (fake devices, never touched)."""
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh

    from moe_course.configs import SoftMoEConfig, VMoEConfig
    from moe_course.models import build_model

    model = build_model(VMoEConfig(**{**tiny_vit_config.__dict__, "num_experts": 6, "group_size": 1,
                                    "moe_last_n": 1}),
                        rngs=nnx.Rngs(0))
    mesh = Mesh(np.asarray(FAKE[:4], dtype=object), ("expert",))
    for place in (parallel.shard_model, parallel.use_mesh):
        with pytest.raises(ValueError, match=r"^num_experts=6 is not divisible by the mesh's expert axis "
                                             r"\(4 devices\); use an expert axis that divides 6$"):
            place(model, mesh)
    assert all(layer.mesh is None and layer.expert_apply is None for layer in model.moe_layers())
    soft = build_model(SoftMoEConfig(**{**tiny_vit_config.__dict__, "num_experts": 6, "group_size": 1}),
                       rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"^num_experts=6 is not divisible by the mesh's expert axis"):
        parallel.shard_model(soft, mesh)
