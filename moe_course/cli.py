"""The ``moe-course`` command: train and evaluate the course's models from a shell."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import zipfile
from pathlib import Path

from moe_course.configs import PRESETS
from moe_course import exercise, selfcheck
from moe_course.course.instructor import cli as course_cli
from moe_course.configs.vmoe import ALLOCATIONS, PRIORITIES
from moe_course.routing.mod import MOD_ROUTERS
from moe_course.data.base import DataError


FRAMEWORKS = ("jax", "torch", "both")
REFERENCE_FORMATS = ("vmoe", "big_vision")


def _preset_list() -> str:
    lines = []
    for family, presets in PRESETS.items():
        for name, cfg in presets.items():
            line = (f"  {family:8s} {name:18s} {cfg.image_size}px/{cfg.patch_size}, width {cfg.width}, "
                    f"{cfg.depth} blocks, {cfg.heads} heads, MLP {cfg.mlp_dim}, {cfg.num_classes} classes")
            if getattr(cfg, "router", "sparse") == "soft":
                line += (f"; Soft MoE in blocks {list(cfg.moe_blocks())}: {cfg.num_experts} experts x "
                         f"{cfg.slots_per_expert} slot(s)")
            elif hasattr(cfg, "num_experts") and cfg.moe_blocks():
                line += f"; MoE in blocks {list(cfg.moe_blocks())}: {cfg.num_experts} experts, k={cfg.k}"
            if hasattr(cfg, "seq_len"):
                line += f"; one tower with {cfg.seq_len}-token captions"
            lines.append(line)
    return "presets:\n" + "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    from moe_course.data import DATASETS

    parser = argparse.ArgumentParser(prog="moe-course", description="Mixture-of-Experts for vision, built step by step.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train", help="train a model (resumes from --workdir's newest checkpoint if there is one)",
        epilog=_preset_list(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_args(train, DATASETS)
    plan = sub.add_parser(
        "plan", help="compile a run for a TPU slice on this machine (compile-only devices, libtpu; no TPU needed) and "
                     "report memory per device, FLOPs, collectives and a roofline bound",
        description="The arguments of `train` plus the slice: the run's own train and eval steps are compiled for "
                    "--topology as `train` would run them there, and nothing runs (docs/scale-out.md, 'Before you "
                    "rent a pod'). Needs libtpu: pip install 'moe-course[tpu]'. Without --dataset the preset's "
                    "channels and classes are planned.",
        epilog=_preset_list(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_args(plan, DATASETS)
    target = plan.add_argument_group("the slice to plan for")
    target.add_argument("--topology", required=True, metavar="CHIP:AxB[xC]",
                        help="a TPU slice as libtpu names it: v3, v5e or v6e with two sizes (v5e:4x4), v4 or v5p with "
                             "three (v4:2x4x4); the mesh's sizes multiply to its devices (one per chip; two per v3 "
                             "chip)")
    target.add_argument("--num-slices", type=int, default=1, help="slices of --topology joined (multi-slice)")
    target.add_argument("--no-eval", action="store_true", help="compile the train step only")

    evaluate = sub.add_parser("evaluate", help="evaluate the newest checkpoint of a run, or a released checkpoint "
                                               "of vmoe / big_vision")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", help="a run of `moe-course train`")
    source.add_argument("--checkpoint", metavar="PATH",
                        help="a reference checkpoint: a vmoe prefix (PATH.index + PATH.data-*) or a big_vision .npz")
    reference = evaluate.add_argument_group("reference checkpoints (--checkpoint; docs/pytorch.md, 'The reference "
                                            "models' checkpoints'); images are scaled to [-1, 1] as those models expect")
    reference.add_argument("--format", default=None, choices=REFERENCE_FORMATS, help="the checkpoint's format")
    reference.add_argument("--model-config", default=None, metavar="JSON",
                           help="vmoe: the experiment's config.model as JSON (routing settings)")
    reference.add_argument("--image-size", type=int, default=None,
                           help="evaluate at this size (position embeddings resized); default the checkpoint's")
    reference.add_argument("--group-size", type=int, default=None, help="vmoe: images per routing group")
    reference.add_argument("--batch-size", type=int, default=64, help="images per evaluation batch")
    _add_data_args(evaluate, DATASETS)
    evaluate.add_argument("--split", default="test", choices=["train", "val", "test"])
    evaluate.add_argument("--framework", default="jax", choices=FRAMEWORKS,
                          help="jax; torch: the model converted to its PyTorch twin (needs moe-course[torch]); "
                               "both: the two side by side")
    _add_routing_args(evaluate, "evaluate the trained model with other settings")
    course_cli.add_parser(sub)
    selfcheck.add_parser(sub)
    exercise.add_parser(sub)
    return parser


def _add_run_args(train: argparse.ArgumentParser, datasets) -> None:
    """The arguments of a training run, shared by ``train`` and ``plan`` (a planned run is launched by changing the
    verb)."""
    train.add_argument("model", choices=sorted(PRESETS), help="model family")
    train.add_argument("--preset", default=None,
                       help="named architecture (listed below); required unless --init-checkpoint or --upcycle-from "
                            "gives one")
    _add_data_args(train, datasets)
    train.add_argument("--workdir", default=None, help="run directory for checkpoints (default: runs/<preset>)")
    train.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the preset's recipe)")
    train.add_argument("--batch-size", type=int, default=None)
    train.add_argument("--learning-rate", type=float, default=None)
    train.add_argument("--warmup-steps", type=int, default=None)
    train.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints")
    train.add_argument("--image-size", type=int, default=None, help="override the preset's image size (pixels)")
    train.add_argument("--patch-size", type=int, default=None, help="override the preset's patch size (pixels)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                       help="computation dtype (parameters stay float32); auto: bfloat16 for a paper-size model on a "
                            "GPU or TPU, float32 otherwise, and a resumed run keeps its own")
    train.add_argument("--data-workers", type=int, default=None, metavar="N",
                       help="processes that build the training batches (Grain workers; 0: one thread of the "
                            "training process; default: the cores this process may use)")
    train.add_argument("--randaugment", type=_number, nargs=2, default=None, metavar=("N", "M"),
                       help="RandAugment after the crop and flip of an image folder's training images: N operations "
                            "at magnitude M (TensorFlow's scale, 10 = full range; V-MoE: 2 10); default: none, or "
                            "the preset's recipe (docs/data.md)")
    train.add_argument("--randaugment-on", choices=("device", "workers"), default="device",
                       help="where RandAugment runs: device (default; batched inside the compiled step on the "
                            "GPU/TPU/CPU that trains, no extra install) or workers (kornia in the input workers, one "
                            "CPU core each; needs PyTorch and the augment extra)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--set", action="append", dest="settings", default=None, metavar="SECTION.FIELD=VALUE",
                       help="any field of the model config (model.num_experts=32, model.group_size=16) or the train "
                            "config (train.weight_decay=0.1, train.randaugment=2,10, train.mu_dtype=bfloat16); "
                            "repeat for several; checked as the config checks it, before anything is built "
                            "(moe_course.configs.overrides). Not with an option that sets the same field")
    _add_routing_args(train, "train with other settings than the preset's")
    _add_scale_args(train)
    tune = train.add_argument_group(
        "fine-tune a released checkpoint (docs/scale-out.md): its body, a new head for --dataset's classes, "
        "position embeddings resized to --image-size, the fine-tuning recipe (moe_course.recipes.FINETUNE: "
        "big_vision configs/transfer.py, SGD momentum 0.9, batch 512)")
    tune.add_argument("--init-checkpoint", default=None, metavar="PATH",
                      help="a vmoe checkpoint prefix (PATH.index + PATH.data-*) or a big_vision .npz")
    tune.add_argument("--init-format", default=None, choices=REFERENCE_FORMATS + ("moe-course",),
                      help="the checkpoint's format (moe-course: a run directory, with --upcycle-from only)")
    tune.add_argument("--init-model-config", default=None, metavar="JSON",
                      help="vmoe: the experiment's config.model as JSON (routing settings)")
    tune.add_argument("--init-group-size", type=int, default=None, help="vmoe: images per routing group")
    up = train.add_argument_group(
        "sparse upcycling (vmoe runs; docs/scale-out.md): a dense ViT's weights become a V-MoE's, each expert a "
        "copy of its block's MLP, a new router (Komatsuzaki et al. 2023)")
    up.add_argument("--upcycle-from", default=None, metavar="PATH",
                    help="a big_vision ViT .npz or a `moe-course train vit` run directory (--init-format: "
                         "big_vision or moe-course; default from PATH). Without --preset: the checkpoint's "
                         "backbone with the paper's MoE layers (32 experts in every other block, Expert Choice, C=2)")
    up.add_argument("--carry-optimizer-state", default=None, action=argparse.BooleanOptionalAction,
                    help="carry the dense run's optimizer state into the V-MoE, as the paper does for vision: Adam's "
                         "moments tiled to the experts as the weights are, the router's zero, Adam's step count "
                         "kept; the learning-rate schedule is this run's, from its step 0. Default: on for a course "
                         "run (its checkpoint holds the state), off for a big_vision .npz (it holds none). The "
                         "dense run's optimizer must be this run's (same optimizer, clipping, decay, mu dtype)")
    mod = train.add_argument_group("Mixture-of-Depths (mod runs)")
    mod.add_argument("--init-from", default=None, metavar="RUN_DIR",
                     help="adapt the dense ViT of this `moe-course train vit` run (A-MoD Sec. 4) instead of "
                          "training from scratch; its architecture must be the preset's")
    mod.add_argument("--router", default=None, choices=MOD_ROUTERS,
                     help="attention (A-MoD Eq. 3-5, no parameters) or standard (Eq. 1-2, a linear router)")
    mod.add_argument("--capacity", type=float, default=None, help="C in (0, 1]: fraction of tokens an MoD block processes")


def _number(text: str) -> int | float:
    """A command-line number: int where it is written as one ("2"), else float ("10.5"); argparse names the
    option when neither parses."""
    try:
        return int(text)
    except ValueError:
        return float(text)


_number.__name__ = "number"  # argparse's message: "invalid number value: 'x'"


def _add_routing_args(parser: argparse.ArgumentParser, purpose: str) -> None:
    routing = parser.add_argument_group(f"routing (V-MoE runs and sparse-router soft-moe runs): {purpose}")
    routing.add_argument("--allocation", default=None, choices=ALLOCATIONS,
                         help="vanilla (V-MoE App. C Alg. 1), bpr (Alg. 2), skip_patch (Alg. 3), experts_choice")
    routing.add_argument("--k", type=int, default=None, help="experts per token")
    routing.add_argument("--capacity-ratio", type=float, default=None, help="C in B_e = round(k*N*P*C/E)")
    routing.add_argument("--priority", default=None, choices=PRIORITIES, help="BPR score: max or sum of the gates")


def _add_scale_args(parser: argparse.ArgumentParser) -> None:
    scale = parser.add_argument_group(
        "scale-out (docs/scale-out.md): several devices, several hosts",
        "With --mesh the run is sharded over the devices JAX sees: images over every device, experts over the "
        "expert axis. On several hosts, run the same command on each (each process reads only its devices' "
        "share of every batch); the three process settings come from "
        "these flags, else from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, else (with "
        "--distributed) from the cluster (SLURM, Open MPI, Cloud TPU pods).")
    scale.add_argument("--mesh", default=None, metavar="SPEC",
                       help="device mesh, e.g. data=2,expert=4 (sizes multiply to the device count), or 'auto' "
                            "(experts over as many devices as divide them, the rest data-parallel)")
    scale.add_argument("--distributed", action="store_true",
                       help="join a multi-process run through jax.distributed.initialize (implied by the flags below)")
    scale.add_argument("--coordinator-address", default=None, metavar="HOST:PORT", help="process 0's address")
    scale.add_argument("--num-processes", type=int, default=None, help="processes in the run (one per host)")
    scale.add_argument("--process-id", type=int, default=None, help="this process's index, 0..num-processes-1")


def _scale_out(args, model_config, joined: bool | None = None):
    """Join jax.distributed if asked (``_join_processes``; ``joined``: already done) and build the --mesh (said in
    one line); None without one."""
    import jax

    from moe_course import parallel

    distributed = _join_processes(args) if joined is None else joined
    if args.mesh is None and not distributed:
        return None
    spec = None if args.mesh in (None, "auto") else args.mesh
    mesh = parallel.make_mesh(spec, num_experts=getattr(model_config, "num_experts", None))
    print(f"mesh {dict(mesh.shape)} over {jax.device_count()} devices in {jax.process_count()} process(es)")
    return mesh


def _join_processes(args) -> bool:
    """Join jax.distributed when --distributed or a process flag asks for it; True when joined. Must run before JAX
    touches a device -- loading a checkpoint builds arrays, after which jax.distributed.initialize raises."""
    from moe_course import parallel

    process_flags = (args.coordinator_address, args.num_processes, args.process_id)
    distributed = args.distributed or any(flag is not None for flag in process_flags)
    if distributed:
        parallel.initialize(*process_flags)
    return distributed


def _model_kind(config) -> str:
    """"VMoE" for configs whose MoE layers are SparseMoE (the routing options apply), else the model's kind."""
    if getattr(config, "router", "sparse") == "soft":
        return "Soft MoE (router 'soft')"
    return "VMoE" if hasattr(config, "num_experts") else "ViT"


def _routing_overrides(args, model_kind: str) -> dict:
    """The routing options given on the command line; ValueError when they are given for a model without
    sparse MoE layers."""
    routing = {k: v for k, v in dict(allocation=args.allocation, k=args.k, capacity_ratio=args.capacity_ratio,
                                     priority=args.priority).items() if v is not None}
    if routing and model_kind != "VMoE":
        raise ValueError(f"--{next(iter(routing)).replace('_', '-')} applies to V-MoE models; this is a {model_kind}")
    return routing


def _mod_overrides(args, model_config) -> dict:
    """--router/--capacity for a mod run; ValueError naming the option when given for another family."""
    mod = {k: v for k, v in dict(router=args.router, capacity=args.capacity).items() if v is not None}
    if (mod or args.init_from) and args.model != "mod":
        given = next(iter(mod), "init_from").replace("_", "-")
        raise ValueError(f"--{given} applies to mod runs (moe-course train mod ...); this is a {args.model} run")
    return mod


def _adapted_model(init_from: str, model_config):
    """The dense ViT of the run in ``init_from``, adapted to ``model_config`` (an MoDConfig) without training.

    Raises ValueError naming --init-from and the first architecture field that differs from the preset's.
    """
    from moe_course.configs.vit import backbone_of
    from moe_course.models import ViT, mod_from_vit
    from moe_course.train.checkpoint import WorkdirError
    from moe_course.train.restore import load_run

    try:
        run = load_run(init_from)
    except WorkdirError as err:
        raise ValueError(f"--init-from: {err}") from err
    if type(run.model) is not ViT:
        raise ValueError(f"--init-from {init_from}: it holds a {type(run.model).__name__}; use a dense ViT run "
                         f"(moe-course train vit ...)")
    for field, value in dataclasses.asdict(backbone_of(model_config)).items():
        if field not in ("name", "dtype") and getattr(run.model_config, field) != value:
            raise ValueError(f"--init-from {init_from}: its {field}={getattr(run.model_config, field)!r} differs from "
                             f"{field}={getattr(model_config, field)!r} of {model_config.name}; adapt a ViT of the "
                             f"same architecture")
    mod_fields = {f: getattr(model_config, f) for f in ("capacity", "router", "mod_placement", "mod_last_n", "dtype")}
    adapted = mod_from_vit(run.model, **mod_fields)
    adapted.config = model_config  # equal but for the name, which the run directory is named after
    return adapted


def _add_data_args(parser: argparse.ArgumentParser, datasets) -> None:
    parser.add_argument("--dataset", default=None, choices=datasets,
                        help="default: the embedded digits (digits-captions, with captions, for limoe; digit-glyphs "
                             "for the glyphs-* presets)")
    parser.add_argument("--data-dir", default=None, help="archive or folder of a full-scale dataset")


def _dataset_name(args, model_config) -> str:
    """--dataset, or the embedded data for the model: with captions for an image-text (LIMoE) model, glyph
    identities for the "glyphs-" presets."""
    from moe_course.train.objectives import CONTRASTIVE, objective_for

    if args.dataset is not None:
        return args.dataset
    if objective_for(model_config) is CONTRASTIVE:
        return "digits-captions"
    return "digit-glyphs" if model_config.name.startswith("glyphs-") else "digits"


def _test_metrics(model, dataset, split: str, batch_size: int, mesh=None) -> dict:
    """The evaluation summary: accuracy and loss of a classifier (on ``mesh``, each process reading its share of
    every batch); for an image-text model zero-shot accuracy (prompt ensembling), retrieval recall@1/@5 both
    ways and, with MoE layers, per-modality success rates."""
    from moe_course.train import evaluate
    from moe_course.train.objectives import CONTRASTIVE, objective_for

    if objective_for(model.config) is not CONTRASTIVE:
        metrics = evaluate(model, dataset, split, batch_size=batch_size, mesh=mesh)
        return {f"{split}_accuracy": round(metrics["accuracy"], 4), f"{split}_loss": round(metrics["loss"], 4)}
    from moe_course.analysis.modality import measure_success_rates
    from moe_course.analysis.zero_shot import evaluate_contrastive

    metrics = evaluate_contrastive(model, dataset, split, batch_size=batch_size)
    if model.moe_layers():
        metrics.update(measure_success_rates(model, dataset, split, batch_size=batch_size))
    return {f"{split}_{k.replace('/', '_')}": round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}


def _train(args) -> dict:
    from moe_course.data import load_dataset

    from moe_course.data.pipeline import check_workers, default_workers
    from moe_course.data.randaugment import check_randaugment
    from moe_course.train import report_devices, train
    from moe_course.train.precision import describe_precision, resolve_dtype

    data_workers = default_workers() if args.data_workers is None else check_workers(args.data_workers)
    randaugment = None if args.randaugment is None else check_randaugment(tuple(args.randaugment))
    if args.init_checkpoint is not None:
        return _finetune(args, data_workers, randaugment)
    if args.carry_optimizer_state is not None and args.upcycle_from is None:
        raise ValueError("--carry-optimizer-state / --no-carry-optimizer-state apply with --upcycle-from only")
    if args.upcycle_from is not None:
        return _upcycle(args, data_workers, randaugment)
    _check_no_init_flags(args)
    model_config, recipe, data_recipe = _preset_config(args)
    mesh = _scale_out(args, model_config)  # first: jax.distributed must start before JAX uses a device
    overrides = _train_overrides(args)
    name = _dataset_name(args, model_config)
    on_workers, on_device = _randaugment_placement(args, name, data_recipe, randaugment)
    dataset = _recipe_dataset(args, name, model_config.image_size, data_recipe, on_workers)
    train_config = _recipe_train_config(recipe, {**overrides, "randaugment": on_device}, data_recipe, dataset)
    classes = {"num_classes": dataset.num_classes} if dataset.num_classes else {}  # caption-only data: none
    model_config = model_config.replace(channels=dataset.image_shape[2], **classes)
    workdir = _workdir(args, model_config)
    dtype, why = resolve_dtype(args.dtype, model_config, workdir=workdir)
    model_config = model_config.replace(dtype=dtype)
    print(describe_precision(model_config, why))
    init_model = _adapted_model(args.init_from, model_config) if args.init_from else None
    report_devices(model_config)
    return _run_training(args, model_config, dataset, train_config, workdir, init_model, mesh, data_workers)


def _preset_config(args):
    """(model config, recipe, data recipe) of a run from --preset: the preset with --image-size / --patch-size,
    the routing options and the MoD options applied. ValueError (named) for a missing or unknown preset and for
    options of another family."""
    from moe_course.configs import get_preset
    from moe_course.recipes import data_recipe_for, recipe_for

    if args.preset is None:
        raise ValueError("--preset is required (or --init-checkpoint to fine-tune a released checkpoint, or "
                         "--upcycle-from to upcycle a dense ViT)")
    model_config = get_preset(args.model, args.preset)
    shape = {k: v for k, v in dict(image_size=args.image_size, patch_size=args.patch_size).items() if v is not None}
    recipe = recipe_for(model_config)
    data_recipe = data_recipe_for(model_config)
    flags = {**shape, **_routing_overrides(args, _model_kind(model_config)), **_mod_overrides(args, model_config)}
    settings = _settings(args, "model", type(model_config), flags)
    model_config = model_config.replace(**flags, **settings)
    return model_config, recipe, data_recipe


def _settings(args, section: str, config_type: type, flags: dict) -> dict:
    """The typed ``--set section.*`` changes for ``config_type``; ValueError naming the field when an option
    (``flags``: the changes the other options make) sets it as well."""
    from moe_course.configs.overrides import parse_settings, typed_changes

    changes = typed_changes(config_type, parse_settings(args.settings)[section], section)
    both = sorted(set(changes) & set(flags))
    if both:
        raise ValueError(f"--set {section}.{both[0]} and --{both[0].replace('_', '-')} both set {both[0]}; give one")
    return changes


def _refuse_model_settings(args, flag: str) -> None:
    """ValueError when ``--set model.*`` is given to a run whose architecture comes from a checkpoint."""
    from moe_course.configs.overrides import parse_settings

    given = parse_settings(args.settings)["model"]
    if given:
        raise ValueError(f"--set model.{next(iter(given))} does not apply with {flag}: the model is the checkpoint's "
                         f"(its routing: --allocation, --k, --capacity-ratio, --priority; train.* settings apply)")


def _workdir(args, model_config) -> Path:
    """--workdir, or runs/<model name> ("/" of a paper name such as B/16 replaced by "-")."""
    return Path(args.workdir or Path("runs") / model_config.name.replace("/", "-"))


def _plan(args) -> dict:
    """``plan``: the run ``train`` would make from the same arguments, compiled for --topology on compile-only
    TPU devices (``parallel.plan``); prints the report and returns a short summary. ValueError (one line, before
    any compilation) for bad arguments, a topology or mesh that does not match, or libtpu missing."""
    from moe_course.data.randaugment import check_randaugment
    from moe_course.parallel.chips import CompileOnlyUnavailable
    from moe_course.parallel.plan import format_plan, plan_run, plan_summary
    from moe_course.train.precision import describe_precision, resolve_dtype

    for flag, value in (("--init-checkpoint", args.init_checkpoint), ("--upcycle-from", args.upcycle_from)):
        if value is not None:
            raise ValueError(f"{flag} does not apply to plan: plan the architecture of the checkpoint with its "
                             f"--preset (weights do not change the compiled program)")
    _check_no_init_flags(args)
    model_config, recipe, data_recipe = _preset_config(args)
    given = [flag for flag, value in (("--distributed", args.distributed or None),
                                      ("--coordinator-address", args.coordinator_address),
                                      ("--num-processes", args.num_processes), ("--process-id", args.process_id))
             if value is not None]
    if given:
        print(f"plan: {', '.join(given)} ignored: --topology gives the processes of the planned run")
    randaugment = None if args.randaugment is None else check_randaugment(tuple(args.randaugment))
    name = _dataset_name(args, model_config)
    on_workers, on_device = _randaugment_placement(args, name, data_recipe, randaugment)
    overrides = {**_train_overrides(args), "randaugment": on_device}
    if args.dataset is not None:  # the run's own classes and channels, as train takes them
        dataset = _recipe_dataset(args, name, model_config.image_size, data_recipe, on_workers)
        train_config = _recipe_train_config(recipe, overrides, data_recipe, dataset)
        classes = {"num_classes": dataset.num_classes} if dataset.num_classes else {}
        model_config = model_config.replace(channels=dataset.image_shape[2], **classes)
    else:
        train_config = recipe.replace(**overrides)
        print(f"plan: no --dataset: the preset's {model_config.channels} channel(s) and {model_config.num_classes} "
              f"classes are planned")
    dtype, why = resolve_dtype(args.dtype, model_config, workdir=_workdir(args, model_config), backend="tpu")
    model_config = model_config.replace(dtype=dtype)
    print(describe_precision(model_config, why))
    try:
        plan = plan_run(model_config, train_config, args.topology, None if args.mesh in (None, "auto") else args.mesh,
                        num_slices=args.num_slices, evaluation=not args.no_eval)
    except CompileOnlyUnavailable as err:
        raise ValueError(f"--topology {args.topology}: {err}") from err
    print(format_plan(plan))
    return plan_summary(plan)


def _run_training(args, model_config, dataset, train_config, workdir, init_model, mesh, data_workers,
                  init_opt_state=None) -> dict:
    """``train`` with the progress bar as asked, then the summary: workdir, steps, seconds, speed, test metrics."""
    from moe_course.train import train

    final_split = _final_split(dataset)
    result = train(model_config, dataset, train_config, workdir=workdir, progress=not args.no_progress,
                   init_model=init_model, mesh=mesh, data_workers=data_workers, init_opt_state=init_opt_state)
    metrics = (_test_metrics(result.model, dataset, final_split, train_config.eval_batch_size, mesh)
               if final_split else {})
    speed = next((r for r in reversed(result.history) if "images_per_second" in r), {})
    speed = {"images_per_second": round(speed["images_per_second"], 1),
             "data_wait_fraction": round(speed["data_wait_fraction"], 4),
             "tflops_per_second": round(speed["tflops_per_second"], 4),
             "mfu": "unknown for this device" if speed["mfu"] is None else round(speed["mfu"], 4)} if speed else {}
    return {"workdir": str(workdir), "steps": train_config.steps, "train_seconds": round(result.seconds, 1),
            **speed, **metrics}


_TRAIN_OVERRIDES = ("steps", "batch_size", "learning_rate", "warmup_steps", "checkpoint_every", "seed")


def _train_overrides(args) -> dict:
    """The TrainConfig fields given on the command line (--steps, --batch-size, ..., --set train.*)."""
    from moe_course.train.config import TrainConfig

    flags = {k: getattr(args, k) for k in _TRAIN_OVERRIDES if getattr(args, k) is not None}
    return {**flags, **_settings(args, "train", TrainConfig, flags)}


def _randaugment_placement(args, name: str, data_recipe: dict, randaugment) -> tuple:
    """(RandAugment for the input workers, for the compiled step): --randaugment, else the recipe's for an image
    folder, placed by --randaugment-on; ValueError for a dataset other than an image folder."""
    from moe_course.data.registry import check_randaugment_dataset

    if randaugment is None and name == "imagefolder" and args.data_dir is not None:
        randaugment = data_recipe.get("randaugment")
    check_randaugment_dataset(name, randaugment)
    return (randaugment, None) if args.randaugment_on == "workers" else (None, randaugment)


def _recipe_dataset(args, name: str, image_size: int, data_recipe: dict, randaugment):
    """The dataset of a run: an image folder with the recipe's evaluation crop and minival
    (``recipes.data_recipe_for``) and ``randaugment`` in its input workers, any other dataset as ``load_dataset``
    gives it (the recipe's data side applies to image folders only, said in one line)."""
    from moe_course.data import load_dataset

    options = {k: data_recipe.get(k) for k in ("eval_crop_fraction", "minival_fraction")}
    if name != "imagefolder" and (data_recipe.get("randaugment") or any(options.values())):
        print(f"the recipe's data side (RandAugment, evaluation crop, minival) applies to image folders; "
              f"dataset {name!r} is used as it is")
    options = options if name == "imagefolder" else {}
    return load_dataset(name, args.data_dir, image_size=image_size, seed=args.seed, randaugment=randaugment,
                        **{k: v for k, v in options.items() if v is not None})


def _recipe_train_config(recipe, overrides: dict, data_recipe: dict, dataset):
    """The recipe with the command line's overrides; a recipe given in epochs (``data_recipe["epochs"]``) gets
    its steps from the training split's size and the batch size, unless --steps is given."""
    from moe_course.recipes import epochs_to_steps

    epochs = data_recipe.get("epochs")
    if epochs and "steps" not in overrides:
        batch = overrides.get("batch_size", recipe.batch_size)
        overrides = {**overrides, "steps": epochs_to_steps(epochs, dataset.split_size("train"), batch)}
    return recipe.replace(**overrides)


def _check_no_init_flags(args) -> None:
    given = [flag for flag, value in (("--init-format", args.init_format), ("--init-model-config",
             args.init_model_config), ("--init-group-size", args.init_group_size)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} only apply with --init-checkpoint (--init-format also with "
                         f"--upcycle-from)")


def _finetune(args, data_workers: int, randaugment) -> dict:
    """``train --init-checkpoint``: a released vmoe / big_vision checkpoint fine-tuned on --dataset with a new
    head (``reference.finetune.finetune_start``) and the fine-tuning recipe (``recipes.FINETUNE``)."""
    from moe_course.models import with_dtype
    from moe_course.recipes import FINETUNE, data_recipe_for
    from moe_course.reference.evaluate import load_reference
    from moe_course.reference.finetune import with_new_head
    from moe_course.train import report_devices
    from moe_course.train.precision import describe_precision, resolve_dtype

    _refuse_model_settings(args, "--init-checkpoint")
    if args.init_format is None:
        raise ValueError(f"--init-checkpoint needs --init-format ({' or '.join(REFERENCE_FORMATS)})")
    if args.init_format not in REFERENCE_FORMATS:
        raise ValueError(f"--init-format {args.init_format} is for --upcycle-from; --init-checkpoint reads "
                         f"{' or '.join(REFERENCE_FORMATS)}")
    if args.upcycle_from is not None:
        raise ValueError("--upcycle-from and --init-checkpoint exclude each other: upcycle a dense ViT, or fine-tune "
                         "a released checkpoint")
    family = "vit" if args.init_format == "big_vision" else "vmoe"
    if args.model != family and not (args.model == "soft-moe" and family == "vmoe"):
        raise ValueError(f"--init-format {args.init_format} holds a {family} model; run `moe-course train {family} "
                         f"--init-checkpoint ...` (this is a {args.model} run)")
    for flag, value in (("--preset", args.preset), ("--patch-size", args.patch_size), ("--init-from", args.init_from)):
        if value is not None:
            raise ValueError(f"{flag} does not apply with --init-checkpoint: the checkpoint gives the architecture")
    if args.dataset is None:
        raise ValueError("--init-checkpoint needs --dataset (e.g. imagefolder with --data-dir, your own folder)")
    data_recipe = data_recipe_for(None, finetune=True)
    joined = _join_processes(args)
    try:
        loaded = load_reference(args.init_checkpoint, args.init_format, model_config=args.init_model_config,
                                image_size=args.image_size, group_size=args.init_group_size)
    except (OSError, zipfile.BadZipFile) as err:
        flag = "--init-model-config" if getattr(err, "filename", None) == args.init_model_config else "--init-checkpoint"
        raise ValueError(f"{flag}: {_file_error(err)}") from err
    on_workers, on_device = _randaugment_placement(args, args.dataset, data_recipe, randaugment)
    dataset = _recipe_dataset(args, args.dataset, loaded.config.image_size, data_recipe, on_workers)
    model = with_new_head(loaded, num_classes=dataset.num_classes, seed=args.seed,
                          name=f"{args.init_format}-finetune")
    model_config = model.config.replace(**_routing_overrides(args, _model_kind(model.config)))
    if model_config != model.config:
        from moe_course.models import with_routing

        with_routing(model, **_routing_overrides(args, _model_kind(model.config)))
        model.config = model_config
    train_config = _recipe_train_config(FINETUNE, {**_train_overrides(args), "randaugment": on_device}, data_recipe,
                                        dataset)
    workdir = Path(args.workdir or Path("runs") / model_config.name)
    dtype, why = resolve_dtype(args.dtype, model_config, workdir=workdir)
    if dtype != model_config.dtype:
        model = with_dtype(model, dtype)
        model_config = model.config
    print(describe_precision(model_config, why))
    report_devices(model_config)
    mesh = _scale_out(args, model_config, joined)
    return _run_training(args, model_config, dataset, train_config, workdir, model, mesh, data_workers)


def _upcycle(args, data_workers: int, randaugment) -> dict:
    """``train vmoe --upcycle-from PATH``: a dense ViT (big_vision ``.npz`` or course run) upcycled into a V-MoE
    (``reference.upcycle.upcycle_start``), then trained: with --preset, that V-MoE and its recipe (the preset's
    backbone must be the checkpoint's); without, the checkpoint's backbone with the paper's MoE layers
    (``reference.upcycle.UPCYCLING_MOE``) and the TrainConfig defaults. The dense run's optimizer state is carried
    (``--carry-optimizer-state``, the default where the checkpoint holds one: a course run) with its schedule
    step reset to 0 (``train.optim.restart_schedule``), else the optimizer starts fresh."""
    from moe_course.configs import get_preset
    from moe_course.models import with_dtype
    from moe_course.recipes import data_recipe_for, recipe_for
    from moe_course.models import OptimizerStateMismatch
    from moe_course.reference.upcycle import dense_format, load_dense_run, upcycle_start
    from moe_course.train import report_devices
    from moe_course.train.checkpoint import WorkdirError
    from moe_course.train.optim import restart_schedule
    from moe_course.train.precision import describe_precision, resolve_dtype

    if args.model != "vmoe":
        raise ValueError(f"--upcycle-from builds a V-MoE; run `moe-course train vmoe --upcycle-from ...` (this is a "
                         f"{args.model} run)")
    for flag, value in (("--patch-size", args.patch_size), ("--init-from", args.init_from),
                        ("--init-model-config", args.init_model_config), ("--init-group-size", args.init_group_size)):
        if value is not None:
            raise ValueError(f"{flag} does not apply with --upcycle-from")
    _refuse_model_settings(args, "--upcycle-from")
    fmt = dense_format(args.upcycle_from, args.init_format)
    preset = None if args.preset is None else get_preset("vmoe", args.preset)
    joined = _join_processes(args)
    try:
        dense, dense_opt_state = load_dense_run(args.upcycle_from, fmt,
                                                image_size=args.image_size or (preset and preset.image_size))
    except (OSError, WorkdirError) as err:
        raise ValueError(f"--upcycle-from: {_file_error(err) if isinstance(err, OSError) else err}") from err
    carry = dense_opt_state is not None if args.carry_optimizer_state is None else args.carry_optimizer_state
    if carry and dense_opt_state is None:
        raise ValueError(f"--carry-optimizer-state: {args.upcycle_from} ({fmt}) holds no optimizer state; upcycle a "
                         f"course run to carry one, or pass --no-carry-optimizer-state")
    data_recipe = data_recipe_for(preset or dense.config)
    name = args.dataset or _dataset_name(args, preset or dense.config)
    on_workers, on_device = _randaugment_placement(args, name, data_recipe, randaugment)
    dataset = _recipe_dataset(args, name, dense.config.image_size, data_recipe, on_workers)
    if dataset.image_shape[2] != dense.config.channels:
        raise ValueError(f"--dataset {name} has {dataset.image_shape[2]} channel(s); the dense checkpoint takes "
                         f"{dense.config.channels}")
    config = None
    if preset is not None:
        config = preset.replace(image_size=dense.config.image_size, channels=dataset.image_shape[2],
                                num_classes=dataset.num_classes)
    model = upcycle_start(dense, fmt, config=config, num_classes=dataset.num_classes, seed=args.seed,
                          optimizer_state=dense_opt_state if carry else None)
    opt_state = None
    if carry:
        model, opt_state = model
        opt_state = restart_schedule(opt_state)
    routing = _routing_overrides(args, "VMoE")
    if routing:
        from moe_course.models import with_routing

        with_routing(model, **routing)
    model_config = model.config
    train_config = _recipe_train_config(recipe_for(model_config), {**_train_overrides(args), "randaugment": on_device},
                                        data_recipe, dataset)
    workdir = _workdir(args, model_config)
    dtype, why = resolve_dtype(args.dtype, model_config, workdir=workdir)
    if dtype != model_config.dtype:
        model = with_dtype(model, dtype)
        model_config = model.config
    print(f"upcycled {args.upcycle_from} ({fmt}) into {model_config.name}: MoE in blocks "
          f"{list(model_config.moe_blocks())}, {model_config.num_experts} experts each a copy of the block's MLP, "
          f"{model_config.allocation} k={model_config.k} C={model_config.capacity_ratio}; fresh router; "
          + ("optimizer state carried from the dense run (Adam moments tiled to the experts, the router's zero), "
             "learning-rate schedule from step 0" if carry else "fresh optimizer"))
    print(describe_precision(model_config, why))
    report_devices(model_config)
    mesh = _scale_out(args, model_config, joined)
    try:
        return _run_training(args, model_config, dataset, train_config, workdir, model, mesh, data_workers,
                             init_opt_state=opt_state)
    except OptimizerStateMismatch as err:  # raised before anything compiles
        raise ValueError(f"--carry-optimizer-state: the dense run's optimizer state does not fit this run's "
                         f"optimizer ({err}); pass --no-carry-optimizer-state to start it afresh") from err


def _final_split(dataset) -> str | None:
    """The split the finished run is scored on: test, or val where the dataset has no test split (an ImageNet
    folder ships train/ and val/ only), or None when both are empty; said before training starts."""
    split = next((s for s in ("test", "val") if dataset.split_size(s)), None)
    if split != "test":
        print(f"{dataset.name!r} has no test split: the finished run is scored on "
              f"{'its val split' if split else 'nothing (val is empty too)'}")
    return split


def _evaluate_reference(args) -> dict:
    """``evaluate --checkpoint``: a vmoe / big_vision checkpoint on --dataset (the model maps the pixels to the
    [-1, 1] it was trained on: ``load_reference``)."""
    from moe_course.data import load_dataset
    from moe_course.models import with_routing
    from moe_course.reference.evaluate import load_reference

    if args.format is None:
        raise ValueError(f"--checkpoint needs --format ({' or '.join(REFERENCE_FORMATS)})")
    if args.framework != "jax":
        raise ValueError("--checkpoint evaluates in JAX only; convert the model with moe_course.torch.convert.to_torch "
                         "for PyTorch")
    if args.dataset is None:
        raise ValueError("--checkpoint needs --dataset (e.g. imagefolder with --data-dir, an ImageNet-style "
                         "validation folder)")
    try:
        model = load_reference(args.checkpoint, args.format, model_config=args.model_config,
                               image_size=args.image_size, group_size=args.group_size)
    except (OSError, zipfile.BadZipFile) as err:  # a missing shard, a wrong prefix, a missing or broken file
        flag = "--model-config" if getattr(err, "filename", None) == args.model_config else "--checkpoint"
        raise ValueError(f"{flag}: {_file_error(err)}") from err
    routing = _routing_overrides(args, _model_kind(model.config))
    if routing:
        with_routing(model, **routing)
    dataset = load_dataset(args.dataset, args.data_dir, image_size=model.config.image_size)
    if dataset.num_classes != model.config.num_classes:
        raise ValueError(f"--dataset {args.dataset} has {dataset.num_classes} classes, the checkpoint's head "
                         f"{model.config.num_classes}")
    summary = {"checkpoint": args.checkpoint, "format": args.format, "split": args.split,
               "image_size": model.config.image_size, **routing}
    return summary | _test_metrics(model, dataset, args.split, args.batch_size)


def _file_error(err: Exception) -> str:
    """One line for a file that could not be read: "PATH: reason" (OSError's own wording when it has no path)."""
    filename, reason = getattr(err, "filename", None), getattr(err, "strerror", None)
    return f"{filename}: {reason}" if filename and reason else str(err)


def _evaluate(args) -> dict:
    from moe_course.data import load_dataset
    from moe_course.models import LIMoE, with_routing
    from moe_course.train.restore import load_run

    if args.checkpoint is not None:
        return _evaluate_reference(args)
    given = [flag for flag, value in (("--format", args.format), ("--model-config", args.model_config),
                                      ("--image-size", args.image_size), ("--group-size", args.group_size))
             if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} only apply with --checkpoint")
    run = load_run(args.workdir)
    routing = _routing_overrides(args, _model_kind(run.model_config))
    if routing:
        with_routing(run.model, **routing)
    dataset = load_dataset(_dataset_name(args, run.model_config), args.data_dir,
                           image_size=run.model_config.image_size)
    summary = {"workdir": args.workdir, "step": run.step, "split": args.split, **routing}
    batch_size = run.train_config.eval_batch_size
    if args.framework != "torch":
        summary.update(_test_metrics(run.model, dataset, args.split, batch_size))
    if args.framework != "jax":
        if isinstance(run.model, LIMoE):
            raise ValueError(f"--framework {args.framework} is not available for LIMoE (no PyTorch twin yet); "
                             f"use --framework jax")
        try:
            from moe_course.torch.convert import to_torch
            from moe_course.torch.evaluate import evaluate as evaluate_torch
        except ImportError as err:
            raise ValueError(f"--framework {args.framework} needs PyTorch ({err}); install it as the README says "
                             f"(pip install 'moe-course[torch]' after a CPU or CUDA torch wheel)") from err

        metrics = evaluate_torch(to_torch(run.model), dataset, args.split, batch_size=batch_size)
        summary.update({f"torch_{args.split}_accuracy": round(metrics["accuracy"], 4),
                        f"torch_{args.split}_loss": round(metrics["loss"], 4)})
    return summary


def main(argv: list[str] | None = None) -> int:
    """The ``moe-course`` command: parse ``argv`` (default ``sys.argv[1:]``), run ``train``, ``plan`` or ``evaluate``
    and return the exit status (0 ok; 1 when training diverged; 2 for bad input, printed as one line)."""
    args = _parser().parse_args(argv)
    from moe_course.train import TrainingDiverged  # here, not at the top: keeps --help fast
    from moe_course.train.checkpoint import WorkdirError

    try:
        commands = {"train": _train, "plan": _plan, "evaluate": _evaluate, "course": course_cli.run, "check": selfcheck.run,
                    "exercise": exercise.run}
        summary = commands[args.command](args)
    except TrainingDiverged as err:  # NaN/inf loss or parameters; the checkpoints on disk stay good
        print(f"moe-course {args.command}: error: {err}", file=sys.stderr)
        return 1
    except WorkdirError as err:  # no run, or no checkpoint that restores, in --workdir
        print(f"moe-course {args.command}: error: --workdir: {err}", file=sys.stderr)
        return 2
    except DataError as err:  # a missing, mis-laid or corrupt dataset, before any compilation
        print(f"moe-course {args.command}: error: --data-dir: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a bad config, preset or option value, before any compilation
        print(f"moe-course {args.command}: error: {err}", file=sys.stderr)
        return 2
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
