"""Scale-out: device meshes, sharding rules, expert parallelism by all-to-all, and multi-host start-up."""

from moe_course.parallel.distributed import distributed_settings, initialize
from moe_course.parallel.expert_parallel import (
    all_to_all_bytes, all_to_all_elements, apply_experts_parallel, check_groups, exchange,
)
from moe_course.parallel.mesh import (
    AXES, DATA, EXPERT, axis_size, batch_axes, batch_shards, check_experts, default_mesh_sizes, format_mesh,
    make_mesh, mesh_sizes, mesh_sizes_for, parse_mesh_spec,
)
from moe_course.parallel.process_share import assemble_batch, check_process_split, process_rows
from moe_course.parallel.sharding import (
    annotate, annotated_specs, batch_sharding, expert_and_shared_params, expert_module_paths, named_shardings,
    param_partition_specs, put, put_tree, replicated, shard_batch, shard_model, state_shardings, use_mesh,
)
from moe_course.parallel.training import (
    abstract_training_state, check_mesh_fits, init_training_state, shard_training_state,
)

__all__ = [
    "AXES", "DATA", "EXPERT", "abstract_training_state", "all_to_all_bytes", "all_to_all_elements", "annotate", "annotated_specs",
    "apply_experts_parallel", "assemble_batch", "axis_size", "batch_axes", "batch_sharding", "batch_shards",
    "check_experts", "check_groups", "check_mesh_fits", "check_process_split", "default_mesh_sizes",
    "distributed_settings", "exchange", "expert_and_shared_params", "expert_module_paths", "format_mesh",
    "init_training_state", "initialize", "make_mesh", "mesh_sizes", "mesh_sizes_for", "named_shardings", "param_partition_specs", "parse_mesh_spec",
    "process_rows", "put", "put_tree", "replicated", "shard_batch", "shard_model", "shard_training_state",
    "state_shardings", "use_mesh",
]
