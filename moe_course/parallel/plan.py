"""Plan a run on a TPU slice you have not rented: compile the run's own train and eval steps ahead of time for
libtpu's compile-only devices and read what the pod would see (MaxText's train_compile.py does the same).

Nothing is allocated: the training state is ``abstract_training_state`` (``jax.ShapeDtypeStruct`` leaves with
their shardings), the batch and key are ShapeDtypeStructs laid out as the loop lays them out, and the steps are
``make_train_step(..., donate=True)`` and ``make_eval_step`` exactly as ``train`` builds them. XLA's TPU compiler
then gives, per device:
- memory (``Compiled.memory_analysis``): arguments, outputs, temporaries (activations kept for the backward pass,
  gradients, workspace), the outputs aliased to donated arguments, and the program code. What one device needs at
  once is arguments + outputs - aliased + temporaries + code, set against the chip's HBM
  (``parallel.chips.TPU_CHIPS``); a program that cannot fit fails to compile with the compiler's own
  RESOURCE_EXHAUSTED message, which the plan shows instead;
- FLOPs and bytes accessed (``Compiled.cost_analysis``), beside the analytic count (``analysis.flops``, times 3
  for a training step: ``train.throughput.training_flops_per_image``);
- the collectives of the compiled HLO program (all-to-all of the expert-parallel dispatch, all-reduce of the
  gradients, ...), counted as instructions in the program text, with the bytes of their results per device;
- a roofline lower bound on the step time, max(FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth), and the
  model FLOPs utilisation (MFU) the step would reach at that bound -- an ESTIMATE from the chip's published
  peak and bandwidth: it ignores communication time, and a real step is slower.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import jax
import jax.numpy as jnp

from moe_course.parallel.chips import GIB, Topology, compile_only_devices, parse_topology
from moe_course.parallel.mesh import format_mesh, mesh_sizes_for
from moe_course.parallel.sharding import batch_sharding, replicated

COLLECTIVES = ("all-to-all", "ragged-all-to-all", "all-reduce", "all-gather", "reduce-scatter",
               "collective-permute", "collective-broadcast")
_ELEMENT_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                  "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(pred|[sufc]\d+|bf16|f8e\w+?)\[([0-9,]*)\]")
# "%name = <result shape> <op>(" with op a collective, its async "-start" or "-done" half, or the sync form
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s(" + "|".join(map(re.escape, COLLECTIVES))
                          + r")(-start|-done)?\(")


def shape_bytes(shape_text: str) -> int:
    """Bytes of the arrays an HLO shape names, e.g. ``(f32[4,128]{1,0}, bf16[8]{0})`` -> 2,064 (layouts and
    tiling ignored; 8-bit float types count 1 byte)."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape_text):
        size = _ELEMENT_BYTES.get(dtype, 1 if dtype.startswith("f8") else 4)
        total += size * element_count(dims)
    return int(total)


def element_count(dims: str) -> int:
    """The number of elements of an HLO array with dimensions ``"4,128"`` (1 for a scalar ``""``)."""
    count = 1
    for dim in filter(None, dims.split(",")):
        count *= int(dim)
    return count


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """The collectives of a compiled HLO module's text: {kind: {"count": instructions, "bytes": bytes of their
    results per device}}, kinds in ``COLLECTIVES`` order, absent when not in the program. An asynchronous pair
    (``all-gather-start`` / ``-done``) counts once, its bytes those of the ``-done`` result. Instructions are
    counted as written in the program (a collective inside a loop body counts once)."""
    found: dict[str, dict[str, int]] = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        shape, kind, half = match.groups()
        entry = found.setdefault(kind, {"count": 0, "bytes": 0})
        if half != "-done":
            entry["count"] += 1
        if half != "-start":
            entry["bytes"] += shape_bytes(shape)
    return {kind: found[kind] for kind in COLLECTIVES if kind in found}


@dataclasses.dataclass
class StepPlan:
    """What the TPU compiler reports for one step, per device. Bytes are bytes; ``flops`` and
    ``bytes_accessed`` are XLA's cost analysis of one device's program; ``analytic_flops`` the analytic count
    of the step over all devices; ``out_of_memory`` the compiler's message when the program does not fit (the
    other numbers are then None); ``batch_size`` the step's global batch (images); ``compile_seconds`` wall-clock
    seconds of lowering + compiling here."""

    name: str
    batch_size: int
    compile_seconds: float
    analytic_flops: float
    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    alias_bytes: int | None = None
    code_bytes: int | None = None
    flops: float | None = None
    bytes_accessed: float | None = None
    collectives: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    out_of_memory: str | None = None

    @property
    def total_bytes(self) -> int | None:
        """Bytes one device holds while the step runs: arguments + outputs - aliased + temporaries + code."""
        if self.argument_bytes is None:
            return None
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


@dataclasses.dataclass
class Plan:
    """A planned run: model, topology, mesh, batch, dtype, and the train (and eval) step's ``StepPlan``.
    ``hbm_bytes`` / ``peak_flops`` / ``bandwidth`` are one device's HBM (bytes), dense bf16 peak (FLOP/s) and
    HBM bandwidth (bytes/s), from ``parallel.chips``."""

    model: str
    topology: Topology
    mesh: dict[str, int]
    num_processes: int
    batch_size: int
    eval_batch_size: int
    dtype: str
    train: StepPlan
    eval: StepPlan | None

    @property
    def hbm_bytes(self) -> int:
        """HBM of one device (bytes)."""
        return self.topology.chip.device_hbm_bytes

    @property
    def peak_flops(self) -> float:
        """Dense bf16 peak of one device (FLOP/s)."""
        return self.topology.chip.device_peak_flops

    @property
    def bandwidth(self) -> float:
        """HBM bandwidth of one device (bytes/s)."""
        return self.topology.chip.device_bandwidth

    def fits(self, step: StepPlan | None = None) -> bool:
        """True when ``step`` (default: the train step) compiled and its ``total_bytes`` are within one device's
        HBM."""
        step = step or self.train
        return step.out_of_memory is None and step.total_bytes <= self.hbm_bytes

    def roofline_seconds(self, step: StepPlan | None = None) -> float | None:
        """A lower bound on ``step``'s time (seconds; default the train step), an estimate: max(XLA FLOPs / peak,
        XLA bytes accessed / HBM bandwidth) of one device; None when it did not compile."""
        step = step or self.train
        if step.flops is None:
            return None
        return max(step.flops / self.peak_flops, (step.bytes_accessed or 0.0) / self.bandwidth)

    def mfu_at_bound(self) -> float | None:
        """The model FLOPs utilisation (analytic training FLOPs / (devices x peak x time), PaLM's definition as in
        ``train.throughput``) of a train step as fast as ``roofline_seconds``: an upper bound, an estimate."""
        seconds = self.roofline_seconds()
        if not seconds:
            return None
        return self.train.analytic_flops / (self.topology.num_devices * self.peak_flops * seconds)


def check_plan_inputs(model_config, train_config, topology: str, mesh: str | None, *,
                      num_slices: int = 1) -> tuple[Topology, dict[str, int]]:
    """Every check that needs no compiler: the configs (``validate``), ``topology`` and ``num_slices``
    (``chips.parse_topology``), ``mesh`` against the topology's device count and the model's experts
    (``mesh.mesh_sizes_for``; None: the default mesh ``train`` uses), all raising ValueError naming the field,
    the value and what is allowed. Returns (Topology, mesh axis sizes)."""
    model_config.validate()
    train_config.validate()
    parsed = parse_topology(topology, num_slices)
    where = f"in topology {parsed.name}" + (f" x {num_slices} slices" if num_slices > 1 else "")
    sizes = mesh_sizes_for(mesh, parsed.num_devices, num_experts=getattr(model_config, "num_experts", None),
                           devices_are=where)
    return parsed, sizes


def _abstract_batch(model_config, objective, batch_size: int, mesh, *, evaluation: bool = False) -> dict:
    """ShapeDtypeStructs of one global batch as the loop places it (``batch_sharding`` over all devices):
    "image" uint8 (B, H, W, C) as the input pipeline delivers full-scale data, "label" int32, LIMoE's "text"
    int32 and "text_mask" bool (B, seq_len), and the evaluation "mask" float32."""
    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))

    size = model_config.image_size
    shapes = {"image": ((batch_size, size, size, model_config.channels), jnp.uint8),
              "label": ((batch_size,), jnp.int32)}
    if hasattr(model_config, "seq_len"):
        shapes |= {"text": ((batch_size, model_config.seq_len), jnp.int32),
                   "text_mask": ((batch_size, model_config.seq_len), jnp.bool_)}
    keys = ("image", "label", "mask") if evaluation else objective.batch_keys
    shapes["mask"] = ((batch_size,), jnp.float32)
    return {key: spec(*shapes[key]) for key in keys}


def _compile(name: str, step, args: tuple, batch_size: int, analytic_flops: float) -> StepPlan:
    """Lower and compile ``step`` on ``args`` (ShapeDtypeStructs) and read its memory, cost and collectives; a
    program that does not fit becomes a StepPlan with ``out_of_memory`` set to the compiler's message."""
    started = time.perf_counter()
    try:
        compiled = step.lower(*args).compile()
    except Exception as err:  # XLA's RESOURCE_EXHAUSTED is a JaxRuntimeError; anything else is a real failure
        text = str(err)
        if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
            raise
        message = " ".join(line.strip() for line in text.strip().splitlines()[:3])
        return StepPlan(name, batch_size, time.perf_counter() - started, analytic_flops, out_of_memory=message)
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
    return StepPlan(
        name, batch_size, seconds, analytic_flops,
        argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
        temp_bytes=memory.temp_size_in_bytes, alias_bytes=memory.alias_size_in_bytes,
        code_bytes=memory.generated_code_size_in_bytes,
        flops=cost.get("flops"), bytes_accessed=cost.get("bytes accessed"),
        collectives=collectives(compiled.as_text()))


def plan_run(model_config, train_config, topology: str, mesh: str | None = None, *, num_slices: int = 1,
             evaluation: bool = True) -> Plan:
    """Compile the run of ``model_config`` with ``train_config`` (batch_size, optimizer, mixup, RandAugment on
    the device, seed) for ``topology`` ("v5e:2x2"; ``num_slices`` of it) on mesh ``mesh`` ("data=2,expert=2";
    None: ``train``'s default mesh), with libtpu's compile-only devices, and return the ``Plan``.

    The train step is ``make_train_step(graphdef, make_optimizer(train_config), ..., donate=True)`` on the state
    ``abstract_training_state`` lays out, as ``train`` runs it; with ``evaluation`` (a classifier) also
    ``make_eval_step`` at ``eval_batch_size``. Bad input raises ValueError naming the field, value and allowed
    values before anything is compiled (``check_plan_inputs``; then the batch sizes against the mesh and its
    processes, ``check_mesh_fits``); a missing libtpu raises ``chips.CompileOnlyUnavailable``. A program that
    does not fit in HBM is not an error: its StepPlan carries the compiler's message."""
    from moe_course.parallel.mesh import make_mesh
    from moe_course.parallel.training import abstract_training_state, check_mesh_fits
    from moe_course.train.objectives import CONTRASTIVE, objective_for
    from moe_course.train.optim import make_optimizer
    from moe_course.train.steps import checks_enabled, make_eval_step, make_train_step
    from moe_course.train.throughput import training_flops_per_image
    from moe_course.analysis.flops import flops_per_image

    parsed, sizes = check_plan_inputs(model_config, train_config, topology, mesh, num_slices=num_slices)
    devices = compile_only_devices(parsed)
    device_mesh = make_mesh(format_mesh(sizes), devices=devices, num_experts=getattr(model_config, "num_experts", None))
    check_mesh_fits(device_mesh, model_config, train_config)
    tx = make_optimizer(train_config)
    graphdef, params, rest, opt_state, shardings = abstract_training_state(model_config, device_mesh, tx,
                                                                           seed=train_config.seed)
    objective = objective_for(model_config)
    checked = checks_enabled(model_config)
    train_step = make_train_step(graphdef, tx, checked=checked, objective=objective, shardings=shardings,
                                 mixup_p=train_config.mixup_p, num_classes=model_config.num_classes,
                                 randaugment=train_config.randaugment, donate=True)
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=replicated(device_mesh))
    batch = _abstract_batch(model_config, objective, train_config.batch_size, device_mesh)
    train = _compile("train step", train_step, (params, rest, opt_state, batch, key), train_config.batch_size,
                     training_flops_per_image(model_config) * train_config.batch_size)
    eval_plan = None
    if evaluation and objective is not CONTRASTIVE:
        eval_batch = _abstract_batch(model_config, objective, train_config.eval_batch_size, device_mesh,
                                     evaluation=True)
        eval_plan = _compile("eval step", make_eval_step(graphdef, checked=checked), (params, rest, eval_batch),
                             train_config.eval_batch_size, flops_per_image(model_config) * train_config.eval_batch_size)
    return Plan(model=model_config.name, topology=parsed, mesh=sizes,
                num_processes=len({device.process_index for device in devices}),
                batch_size=train_config.batch_size, eval_batch_size=train_config.eval_batch_size,
                dtype=str(model_config.dtype), train=train, eval=eval_plan)


def _size(value: float) -> str:
    """Bytes as "1.23 GiB" / "4.5 MiB" / "512 B"."""
    for unit, scale in (("GiB", GIB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def _step_lines(plan: Plan, step: StepPlan) -> list[str]:
    lines = [f"{step.name}, batch {step.batch_size} (compiled in {step.compile_seconds:.1f} s), per device:"]
    if step.out_of_memory is not None:
        return lines + [f"  does not fit: the compiler ran out of memory: {step.out_of_memory}"]
    total, hbm = step.total_bytes, plan.hbm_bytes
    lines += [f"  arguments {_size(step.argument_bytes)}, outputs {_size(step.output_bytes)}, "
              f"aliased to donated arguments {_size(step.alias_bytes)}, temporaries {_size(step.temp_bytes)}, "
              f"code {_size(step.code_bytes)}",
              f"  total (arguments + outputs - aliased + temporaries + code) {_size(total)} of {_size(hbm)} HBM: "
              + (f"fits ({_size(hbm - total)} free)" if total <= hbm else f"does not fit by {_size(total - hbm)}")]
    devices = plan.topology.num_devices
    ratio = step.flops * devices / step.analytic_flops if step.analytic_flops else float("nan")
    lines.append(f"  FLOPs: XLA {step.flops:.4g} per device ({step.flops * devices:.4g} over {devices} devices), "
                 f"analytic {step.analytic_flops:.4g}: XLA / analytic = {ratio:.3f}")
    if step.collectives:
        lines.append("  collectives: " + ", ".join(f"{kind} x{entry['count']} ({_size(entry['bytes'])})"
                                                    for kind, entry in step.collectives.items()))
    else:
        lines.append("  collectives: none")
    seconds = plan.roofline_seconds(step)
    bound = "compute" if step.flops / plan.peak_flops >= (step.bytes_accessed or 0) / plan.bandwidth else "memory"
    chip = plan.topology.chip
    lines.append(f"  roofline lower bound (an estimate, {chip.name}: {chip.device_peak_flops / 1e12:.4g} TFLOP/s "
                 f"bf16, {chip.device_bandwidth / 1e9:.4g} GB/s per device; XLA bytes accessed "
                 f"{_size(step.bytes_accessed or 0)}): {seconds * 1e3:.3g} ms, {bound}-bound")
    return lines


def format_plan(plan: Plan) -> str:
    """The plan as the ``moe-course plan`` command prints it (several lines)."""
    top = plan.topology
    slices = f" x {top.num_slices} slices" if top.num_slices > 1 else ""
    lines = [f"plan: {plan.model} on {top.name}{slices} ({top.num_chips} {top.chip.device_kind} chips, "
             f"{top.num_devices} devices, {plan.num_processes} host process(es)), mesh {format_mesh(plan.mesh)}, "
             f"batch {plan.batch_size}, {plan.dtype} computation (compile-only devices: nothing ran)"]
    lines += _step_lines(plan, plan.train)
    mfu = plan.mfu_at_bound()
    if mfu is not None:
        seconds = plan.roofline_seconds()
        lines.append(f"  at that bound: {plan.batch_size / seconds:,.0f} images/s, MFU {100 * mfu:.1f}% "
                     f"(an upper bound, an estimate)")
    if plan.eval is not None:
        lines += _step_lines(plan, plan.eval)
    return "\n".join(lines)


def plan_summary(plan: Plan) -> dict[str, Any]:
    """A few numbers of ``plan`` for a machine to read: {"fits", "train_step_bytes_per_device",
    "hbm_bytes_per_device", "roofline_seconds", "mfu_at_bound"} (None where the step did not compile)."""
    return {"fits": plan.fits(), "train_step_bytes_per_device": plan.train.total_bytes,
            "hbm_bytes_per_device": plan.hbm_bytes, "roofline_seconds": plan.roofline_seconds(),
            "mfu_at_bound": plan.mfu_at_bound()}


__all__ = ["COLLECTIVES", "Plan", "StepPlan", "check_plan_inputs", "collectives", "format_plan",
           "plan_run", "plan_summary", "shape_bytes"]
