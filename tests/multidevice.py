"""Checks that need several JAX devices, run in a fresh Python process (``run_cases``).

JAX fixes its device count when it starts, and the rest of the test suite runs on one device in the pytest
process; so the multi-device checks run here, in a subprocess with ``--xla_force_host_platform_device_count``
simulated CPU devices, and report their measurements as JSON for tests/test_parallel*.py to assert on.

    python tests/multidevice.py CASE [CASE ...] [--workdir DIR] [--mesh SPEC]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_cases(devices: int, *args: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``python tests/multidevice.py *args`` with ``devices`` simulated CPU devices (``env``: more
    environment variables)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           **(env or {})}
    return subprocess.Popen([sys.executable, str(Path(__file__)), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def report_of(process: subprocess.Popen, timeout: float = 1800) -> dict:
    """Wait for a process of ``start_cases``; its JSON report (a dict). AssertionError with its stderr if it failed."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"{' '.join(process.args[1:])} timed out after {timeout} s:\n{err[-4000:]}")
    if process.returncode:
        raise AssertionError(f"{' '.join(process.args[1:])} failed:\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_cases(devices: int, *args: str, timeout: float = 1800) -> dict:
    """Run ``python tests/multidevice.py *args`` with ``devices`` CPU devices; its JSON report (a dict)."""
    return report_of(start_cases(devices, *args), timeout)


# ----------------------------------------------------------------------------------------------------------
# Shared tiny setups (also used by the single-device reference runs)
# ----------------------------------------------------------------------------------------------------------


def tiny_digits():
    from moe_course.data import ClutteredDigits, DigitsConfig

    return ClutteredDigits(DigitsConfig(image_size=16, digit_size=(8, 12), glyphs_per_class=(8, 3, 3), eval_copies=1))


def tiny_vmoe(**changes):
    """A V-MoE with 8 experts, k=2, C=0.5 (tokens get dropped), BPR, groups of 2 images."""
    from moe_course.configs import VMoEConfig

    settings = dict(name="t-ep", image_size=16, patch_size=4, channels=1, width=16, depth=2, heads=2, mlp_dim=32,
                    num_classes=10, pool="gap", num_experts=8, k=2, capacity_ratio=0.5, allocation="bpr",
                    group_size=2, moe_last_n=1)
    return VMoEConfig(**{**settings, **changes})


def tiny_train_config(steps: int = 20, **changes):
    from moe_course.train import TrainConfig

    return TrainConfig(**{**dict(steps=steps, batch_size=16, learning_rate=1e-2, warmup_steps=2, log_every=1,
                                 eval_every=0, checkpoint_every=0, eval_batch_size=16), **changes})


def losses(history: list[dict]) -> dict[int, float]:
    return {record["step"]: record["loss"] for record in history}


# ----------------------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------------------


def case_layer() -> dict:
    """Expert-parallel SparseMoE against the one-device layer: outputs, gradients, routing, aux loss."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from moe_course import parallel
    from moe_course.layers import SparseMoE

    def loss(layer, x, key):
        out = layer(x, deterministic=False, rngs=nnx.Rngs(key))
        return jnp.sum(jnp.sin(out.output)) + out.aux_loss, out

    grad = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    report = []
    cases = [("data=2,expert=4", allocation, k) for allocation in ("vanilla", "bpr") for k in (1, 2)]
    for spec, allocation, k in cases + [("expert=8", "bpr", 2)]:
                mesh = parallel.make_mesh(spec)
                layer = SparseMoE(8, 16, 8, k=k, capacity_ratio=0.5, group_size=2, allocation=allocation,
                                  rngs=nnx.Rngs(0))
                x = jax.random.normal(jax.random.key(1), (32, 5, 8))
                (l1, o1), (g_layer1, g_x1) = grad(layer, x, jax.random.key(3))
                parallel.shard_model(layer, mesh)
                xs = parallel.put(x, parallel.batch_sharding(mesh, 3))
                (l2, o2), (g_layer2, g_x2) = nnx.jit(grad)(layer, xs, jax.random.key(3))
                grads1 = jax.tree.leaves(nnx.state(g_layer1, nnx.Param)) + [g_x1]
                grads2 = jax.tree.leaves(nnx.state(g_layer2, nnx.Param)) + [g_x2]
                report.append(dict(
                    mesh=spec, allocation=allocation, k=k,
                    output=float(jnp.max(jnp.abs(o1.output - o2.output))),
                    grad=max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads1, grads2)),
                    grad_scale=max(float(jnp.max(jnp.abs(a))) for a in grads1),
                    aux=float(jnp.abs(o1.aux_loss - o2.aux_loss)),
                    same_routing=bool(jnp.array_equal(o1.routing.expert_index, o2.routing.expert_index)
                                      and jnp.array_equal(o1.routing.served, o2.routing.served)),
                    dropped=float(1 - o1.routing.served.mean()),
                    expert_spec=list(layer.experts.fc1_kernel[...].sharding.spec),
                    shards=len(layer.experts.fc1_kernel[...].addressable_shards),
                    shard_shape=list(layer.experts.fc1_kernel[...].addressable_shards[0].data.shape),
                    all_to_all="all-to-all" in jax.jit(lambda x: layer(x).output).lower(xs).compile().as_text(),
                ))
    return {"layer": report, "exchange": exchange_under_vmap()}


def exchange_under_vmap() -> dict:
    """``parallel.exchange`` inside ``jax.shard_map`` on the 8 devices against the same function under
    ``jax.vmap(axis_name="expert")`` on one device: the reference the chapter-7 assignment's grading (a
    one-device kernel) uses. {mesh: [forward equal, back equal]}, bitwise."""
    import functools

    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from moe_course import parallel

    report = {}
    for spec in ("data=2,expert=4", "expert=8"):
        mesh = parallel.make_mesh(spec)
        rows, n = parallel.axis_size(mesh, parallel.DATA), parallel.axis_size(mesh, parallel.EXPERT)
        g, experts, capacity, dim = 3, 8, 2, 5
        buffers = np.random.default_rng(7).normal(size=(rows * n * g, experts, capacity, dim)).astype(np.float32)
        groups = P(parallel.batch_axes(mesh))
        there = jax.shard_map(parallel.exchange, mesh=mesh, in_specs=groups, out_specs=groups)
        back = jax.shard_map(functools.partial(parallel.exchange, back=True), mesh=mesh, in_specs=groups,
                             out_specs=groups)
        sharded = parallel.put(buffers, parallel.batch_sharding(mesh, 4))
        inbox = np.asarray(there(sharded))
        returned = np.asarray(back(parallel.put(inbox, parallel.batch_sharding(mesh, 4))))
        # one device: the data rows are independent, the expert axis is a named vmap axis
        simulated_there = jax.vmap(jax.vmap(parallel.exchange, axis_name=parallel.EXPERT))
        simulated_back = jax.vmap(jax.vmap(functools.partial(parallel.exchange, back=True), axis_name=parallel.EXPERT))
        local = buffers.reshape(rows, n, g, experts, capacity, dim)
        want_inbox = np.asarray(simulated_there(local)).reshape(inbox.shape)
        want_returned = np.asarray(simulated_back(want_inbox.reshape(rows, n, n * g, experts // n, capacity, dim)))
        report[spec] = [bool(np.array_equal(inbox, want_inbox)),
                        bool(np.array_equal(returned, want_returned.reshape(buffers.shape)))
                        and bool(np.array_equal(returned, buffers))]
    return report


def case_specs() -> dict:
    """Partition specs of every model family on an 8-device mesh (data=2, expert=4)."""
    import dataclasses

    from flax import nnx

    from moe_course import parallel
    from moe_course.configs import MoDConfig, SoftMoEConfig, ViTConfig, get_preset
    from moe_course.models import build_model

    mesh = parallel.make_mesh("data=2,expert=4")
    backbone = dict(name="t", image_size=16, patch_size=4, channels=1, width=16, depth=2, heads=2, mlp_dim=32,
                    num_classes=10, pool="gap")
    configs = {"vit": ViTConfig(**backbone), "vmoe": tiny_vmoe(), "mod": MoDConfig(**backbone)}
    soft_fields = {f.name for f in dataclasses.fields(SoftMoEConfig)}
    configs["soft_moe"] = SoftMoEConfig(**{k: v for k, v in backbone.items() if k in soft_fields}, num_experts=8)
    configs["limoe"] = get_preset("limoe", "digits-limoe")  # every model family on main
    report = {}
    for family, config in configs.items():
        model = parallel.shard_model(build_model(config, rngs=nnx.Rngs(0)), mesh)
        params = nnx.state(model, nnx.Param)
        flat = {"/".join(map(str, path)): v for path, v in nnx.to_flat_state(params)}
        specs = {path: list(spec) for path, spec in parallel.annotated_specs(model).items()}
        report[family] = {path: dict(spec=specs[path], placed=list(v[...].sharding.spec), shape=list(v[...].shape))
                          for path, v in flat.items()}
    return {"specs": report}


def case_train(workdir: str | None = None) -> dict:
    """20 steps of a tiny V-MoE on one device and on 8 (data=2, expert=4); with a workdir, a sharded run that
    stops at step 10 with a checkpoint there (for ``case_resume`` on other device counts)."""
    from moe_course import parallel
    from moe_course.train import train

    dataset, model_config, config = tiny_digits(), tiny_vmoe(), tiny_train_config()
    single = train(model_config, dataset, config, progress=False)
    mesh = parallel.make_mesh("data=2,expert=4")
    sharded = train(model_config, dataset, config, progress=False, mesh=mesh)
    report = {"single": losses(single.history), "sharded": losses(sharded.history)}
    if workdir:
        half = train(model_config, dataset, config.replace(checkpoint_every=10), progress=False, mesh=mesh,
                     workdir=workdir, stop_after=10)
        report["half"] = losses(half.history)
    return report


def case_resume(workdir: str, mesh: str | None = None) -> dict:
    """Resume the run in ``workdir`` on this process's devices (``mesh`` spec, or one device) to step 20."""
    import jax

    from moe_course import parallel
    from moe_course.train import train

    result = train(tiny_vmoe(), tiny_digits(), tiny_train_config(checkpoint_every=10), progress=False,
                   workdir=workdir, mesh=parallel.make_mesh(mesh) if mesh else None)
    return {"devices": jax.device_count(), "resumed_from": result.resumed_from, "losses": losses(result.history)}


def case_multihost(coordinator: str, num_processes: int, process_id: int, steps: int) -> dict:
    """One process of a multi-host run: join ``jax.distributed`` (gloo CPU collectives), train the 20-step run
    of ``case_train`` up to ``steps`` on a mesh of every process's devices (experts spread over all processes)."""
    from moe_course import parallel

    parallel.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    import jax

    from moe_course.train import train

    mesh = parallel.make_mesh(f"expert={jax.device_count()}")  # the expert axis spans the processes
    result = train(tiny_vmoe(), tiny_digits(), tiny_train_config(), progress=False, mesh=mesh, stop_after=steps)
    return {"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "losses": losses(result.history)}


# Process-local input (tests/test_multihost_input.py): digits-tiny's backbone at 16 px on the tiny digits, a
# global batch of 16, evaluation batches of 64 on the 30 test images (with 4 processes: one share partly
# padding, two all padding).


def share_setup(**changes):
    """(dataset, model config, train config) of the process-local input runs."""
    from moe_course.configs import get_preset

    model = get_preset("vit", "digits-tiny").replace(image_size=16, patch_size=4)
    config = tiny_train_config(8, learning_rate=3e-3, checkpoint_every=4, keep_checkpoints=10, eval_batch_size=64,
                               **changes)
    return tiny_digits(), model, config


def batch_digests(rows: tuple[int, int] | None, workers: int = 0, steps: int = 8) -> list[str]:
    """sha256 of rows ``rows`` of global batches 0 .. steps-1, as ``train`` builds them (``train_pipeline``)."""
    import hashlib

    import numpy as np

    from moe_course.data.pipeline import close_pipeline, train_pipeline

    dataset, _, config = share_setup()
    pipeline = train_pipeline(dataset, config.batch_size, seed=config.seed, stop_step=steps, workers=workers,
                              rows=rows)
    try:
        return [hashlib.sha256(np.ascontiguousarray(b["image"]).tobytes() + b["label"].tobytes()).hexdigest()
                for b in pipeline]
    finally:
        close_pipeline(pipeline)


def share_run(mesh, workdir: str | None = None, stop_after: int | None = None, workers: int = 0) -> dict:
    """Train the process-local input run on ``mesh`` (None: one device) and evaluate it on the test split."""
    from moe_course.train import evaluate, train

    dataset, model, config = share_setup()
    result = train(model, dataset, config, progress=False, mesh=mesh, workdir=workdir, stop_after=stop_after,
                   data_workers=workers)
    report = {"losses": losses(result.history), "images_read": result.images_read,
              "resumed_from": result.resumed_from}
    if stop_after is None:
        report["test"] = evaluate(result.model, dataset, "test", batch_size=config.eval_batch_size, mesh=mesh)
    return report


def case_share_reference(workdir: str) -> dict:
    """One process, 4 devices: the runs on meshes data=4 and data=2 (the latter checkpointing into ``workdir``
    at steps 4 and 8), and the digests of every P-process share of each global batch."""
    import jax

    from moe_course import parallel

    devices = jax.devices()
    report = {"processes": jax.process_count(), "digests": {}}
    for p in (1, 2, 4):
        report["digests"][p] = [batch_digests((i * 16 // p, (i + 1) * 16 // p)) for i in range(p)]
    report["data=4"] = share_run(parallel.make_mesh("data=4", devices=devices))
    report["data=2"] = share_run(parallel.make_mesh("data=2", devices=devices[:2]), workdir=workdir)
    return report


def case_share(coordinator: str, num_processes: int, process_id: int, workers: int, workdirs: list[str],
               stop_after: int | None, kill: bool) -> dict:
    """One of ``num_processes`` processes with one CPU device each (gloo): the digests of its rows (built in this
    process; ``workers`` build the training runs' batches), the refusal
    of a batch that does not split over the processes, and the run of ``share_run`` on mesh data=P once per
    workdir (resuming what is there; none: no checkpoints). ``kill``: print the report, then SIGKILL itself
    (no clean-up runs, as when a cluster kills the job)."""
    import signal

    from moe_course import parallel

    parallel.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    import jax

    from moe_course.train import train

    mesh = parallel.make_mesh(f"data={num_processes}")
    dataset, model, config = share_setup()
    rows = parallel.process_rows(mesh, config.batch_size)
    report = {"process": jax.process_index(), "processes": jax.process_count(), "rows": list(rows),
              "digests": batch_digests(rows)}
    try:
        train(model, dataset, config.replace(batch_size=num_processes * 2 + 1), progress=False, mesh=mesh)
    except ValueError as err:
        report["refused"] = str(err)
    report["runs"] = [share_run(mesh, workdir or None, stop_after, workers) for workdir in workdirs or [""]]
    if kill:  # every process has run to its stop before any dies (a dead peer aborts the others)
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("share: all stopped")
        print(json.dumps(report), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return report


def case_share_one(workdir: str) -> dict:
    """One process, one device, no mesh: resume the run in ``workdir`` (written by several processes)."""
    return share_run(None, workdir=workdir)


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", choices=["layer", "specs", "train", "resume", "multihost",
                                                     "share_reference", "share", "share_one"])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--mesh", default=None)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--workdirs", nargs="*", default=[])
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--kill", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    report: dict = {}
    for case in args.cases:
        if case == "layer":
            report.update(case_layer())
        elif case == "specs":
            report.update(case_specs())
        elif case == "train":
            report.update(case_train(args.workdir))
        elif case == "resume":
            report.update(case_resume(args.workdir, args.mesh))
        elif case == "share_reference":
            report.update(case_share_reference(args.workdir))
        elif case == "share":
            report.update(case_share(args.coordinator, args.num_processes, args.process_id, args.workers,
                                     args.workdirs, args.stop_after, args.kill))
        elif case == "share_one":
            report.update(case_share_one(args.workdir))
        else:
            report.update(case_multihost(args.coordinator, args.num_processes, args.process_id, args.steps))
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
