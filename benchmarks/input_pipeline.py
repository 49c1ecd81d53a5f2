"""The training input pipeline alone, and the training loop against its bare jitted step, side by side.

Table 1: images/s of ``data.pipeline.train_pipeline`` (Grain, batches built in worker processes, uint8) for each
dataset kind at 1, 2, ... workers (up to the cores this process may use; 0: one thread of this process),
after the workers have started, the scaling from the first count, images per CPU-second of the workers and
the training process's CPU per batch (what receiving a batch costs it).
Data made here: the embedded digits (``digits``, ``digit-glyphs``, ``digits-captions``), a CIFAR-10 archive
layout of colourised digit canvases, and JPEGs of ImageNet-like sizes (300-500 px sides: upscaled digit
canvases in colour on smooth textured backgrounds) read as an image folder at --image-size px with the
training augmentation (Inception crop + flip) and as an image-caption folder; ``imagefolder+randaugment`` adds
RandAugment (2, 10) after the crop and flip (kornia, ``data.randaugment``; skipped, saying why, without it).
``transport`` is the ceiling of a dataset whose batch is a memory gather: the same bytes as a CIFAR element
(``steps_per_element`` batches of uint8 images) sent by 1, 2, ... processes through bare ``multiprocessing``
queues (spawned, as Grain's workers are) and received by this one, with no dataset and no Grain.
Table 2: steps/s of ``train`` (the whole loop: pipeline, device feed, metrics, progress bar) against the bare
jitted training step called on one batch already on the device, for digits-tiny and glyphs-tiny with their
recipes' batch size, and (``--folder-presets``; by default V-MoE-S/32 every-2 where JAX runs on an accelerator)
for presets that read the JPEG folder at their image size with the training augmentation, at --folder-batch;
the loop's rate comes from its history record (images_per_second: compilation and worker start-up excluded).
Its last columns are the pipeline alone at the loop's largest worker count and the bare step, in images/s: a
loop can reach its bare step only where the first exceeds the second. Each round times the bare step, then the
loop right after it; the table gives the medians over the rounds and the median of each round's ratio, with its
range (on a shared or throttled CPU the rates move by 10-20% from one minute to the next, which a ratio of
neighbours cancels).
Table 3: the i1k input's part on the device (``train.randaugment``): the ViT-S/16 i1k training step (big_vision's
recipe, mixup 0.2) with RandAugment (2, 10) inside it against the same step without, on a uint8 batch already on
the device (alternating, medians over the rounds), and RandAugment (2, 10) + mixup alone; with table 1 it gives
the whole i1k input per CPU core before (RandAugment in the workers) and after (on the device).
Usage: python benchmarks/input_pipeline.py [--workers 1 2] [--batches 40] [--loop-steps 300]
       [--folder-presets vmoe:vmoe-s/32-every-2] [--tables 1 2 3] [--device-batch 32] [--quick]
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from PIL import Image

from moe_course.configs import get_preset
from moe_course.data import load_dataset
from moe_course.data.pipeline import close_pipeline, default_workers, steps_per_element, train_pipeline
from moe_course.data.randaugment import RandAugmentUnavailable
from moe_course.models import build_model
from moe_course.recipes import recipe_for
from moe_course.train import train
from moe_course.train.optim import make_optimizer
from moe_course.train.steps import make_train_step
from sizes import SizedParser

IN_MEMORY_FACTOR = 24
KINDS = ["digits", "digit-glyphs", "digits-captions", "cifar10", "transport", "imagefolder",
         "imagefolder+randaugment", "captions"]
RANDAUGMENT = (2, 10)  # V-MoE's (N, M)
DEFAULTS = dict(kinds=KINDS, workers=None, batches=40, batch_size=128, image_size=224, jpegs=512, jpeg_sides=(300, 500),
                presets=["digits-tiny", "glyphs-tiny"], loop_steps=300, rounds=5, loop_workers=None,
                pipeline_rounds=3, folder_presets=None, folder_batch=512, device_preset="vit-s/16-i1k",
                device_batch=32, device_steps=3)
ACCELERATOR_FOLDER_PRESETS = ["vmoe:vmoe-s/32-every-2"]  # issue 34's goal: >= 90% of its in-memory images/s
QUICK = dict(kinds=["digits", "transport", "imagefolder"], workers=[0, 1], batches=6, batch_size=16, image_size=32,
             jpegs=32, jpeg_sides=(60, 90), presets=["digits-tiny"], loop_steps=6, rounds=1, loop_workers=[0],
             pipeline_rounds=1, folder_presets=["vmoe:digits-tiny-moe"], folder_batch=8, device_preset="i1k-tiny",
             device_batch=8, device_steps=1)


def _canvases(count: int, seed: int) -> np.ndarray:
    """(count, 32, 32) float32 cluttered-digit canvases in [0, 1]."""
    digits = load_dataset("digits", None, seed=seed)
    index = np.arange(count) % digits.split_size("train")
    return digits.get("train", index, epoch=seed)["image"][..., 0]


def _scene(canvas: np.ndarray, rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A natural-looking photo stand-in: a smooth coloured texture with the digit canvas, upscaled and tinted,
    on top (what JPEG decoding and resizing see is like a photo's: smooth areas, edges, detail)."""
    low = rng.uniform(40, 215, (6, 8, 3)).astype(np.uint8)
    background = np.asarray(Image.fromarray(low).resize((width, height), Image.BICUBIC), np.float32)
    grain = np.asarray(Image.fromarray(rng.integers(0, 255, (height // 8, width // 8), np.uint8))
                       .resize((width, height), Image.BILINEAR), np.float32)[..., None]
    background = background * 0.85 + grain * 0.15
    side = int(min(width, height) * rng.uniform(0.5, 0.9))
    digit = np.asarray(Image.fromarray((canvas * 255).astype(np.uint8)).resize((side, side), Image.BICUBIC),
                       np.float32)[..., None] / 255.0
    top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
    tint = rng.uniform(0, 255, 3)
    window = background[top:top + side, left:left + side]
    background[top:top + side, left:left + side] = window * (1 - digit) + tint * digit
    return Image.fromarray(background.clip(0, 255).astype(np.uint8))


def make_files(root: Path, args) -> dict[str, Path]:
    """The on-disk datasets of table 1 under ``root``: {"cifar10": ..., "imagefolder": ..., "captions": ...}."""
    rng = np.random.default_rng(0)
    canvases = _canvases(args.jpegs, seed=1)
    flat = root / "jpegs"
    flat.mkdir(parents=True)
    for i, canvas in enumerate(canvases):
        width, height = rng.integers(args.jpeg_sides[0], args.jpeg_sides[1] + 1, 2)
        _scene(canvas, rng, int(width), int(height)).save(flat / f"{i:05d}.jpg", quality=90)
    folder, captions = root / "imagefolder", root / "captions"
    for split in ("train", "val"):
        (captions / split).mkdir(parents=True)
        lines = []
        for i in range(args.jpegs):
            klass = f"class{i % 4}"
            (folder / split / klass).mkdir(parents=True, exist_ok=True)
            os.symlink(flat / f"{i:05d}.jpg", folder / split / klass / f"{i:05d}.jpg")
            os.symlink(flat / f"{i:05d}.jpg", captions / split / f"{i:05d}.jpg")
            lines.append(f"{i:05d}.jpg\ta photo of the digit in {klass}, number {i % 10}")
        (captions / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    cifar = root / "cifar-10-batches-py"
    cifar.mkdir()
    per_batch = 2000  # 5 x 2000 training images: 5000 after the 5000 of the val split
    colour = _canvases(per_batch, seed=2)[..., None] * rng.uniform(0.3, 1.0, (per_batch, 1, 1, 3))
    data = (colour * 255).astype(np.uint8).transpose(0, 3, 1, 2).reshape(per_batch, -1)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, per_batch).tolist()
        (cifar / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels}))
    (cifar / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}))
    return {"cifar10": cifar, "imagefolder": folder, "captions": captions}


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (Linux /proc; NaN elsewhere)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _send(queue, element: int, count: int) -> None:
    payload = np.zeros(element, np.uint8)
    for _ in range(count):
        queue.put(payload)


def transport_rate(dataset, batch_size: int, senders: int, batches: int) -> tuple[float, float, float]:
    """(images/s, NaN, ms of this process's CPU a batch): the bytes of ``batches`` training batches of ``dataset``
    (uint8 images, grouped per element as ``train_pipeline`` groups them) sent by ``senders`` spawned processes
    through one ``multiprocessing.Queue`` each and received here in turn, over the second half of the elements."""
    if not senders:
        return float("nan"), float("nan"), float("nan")
    chunk = steps_per_element(dataset, batch_size, senders)
    element = chunk * batch_size * int(np.prod(dataset.image_shape))
    count = max(4, batches // chunk // senders)
    context = multiprocessing.get_context("spawn")
    queues = [context.Queue(2) for _ in range(senders)]
    processes = [context.Process(target=_send, args=(q, element, count), daemon=True) for q in queues]
    for process in processes:
        process.start()
    for i in range(count):
        if i == count // 2:
            started, cpu = time.perf_counter(), time.process_time()
        for queue in queues:
            queue.get(timeout=60)  # a sender that died raises queue.Empty rather than hanging the benchmark
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    for process in processes:
        process.join()
    received = (count - count // 2) * senders * chunk
    return received * batch_size / elapsed, float("nan"), 1e3 * cpu / received


def pipeline_rate(dataset, batch_size: int, workers: int, batches: int) -> tuple[float, float, float]:
    """(images/s of the pipeline alone, images per CPU-second of its workers, ms of this process's CPU a batch)
    over the second half of ``batches`` (by then every worker has started and the batches they had ready at the
    start are used up). The second number is what one worker delivers with a core of its own, whatever else runs
    on the machine (NaN for 0 workers, whose thread shares this process); the third is what receiving a batch
    costs the training process (with 0 workers: building it too)."""
    pipeline = train_pipeline(dataset, batch_size, seed=0, stop_step=batches, workers=workers)
    half = batches // 2
    arrived, pids, cpu = [], [], float("nan")
    for step, batch in enumerate(pipeline):
        arrived.append(time.perf_counter())
        if step == half:
            pids = [p.pid for p in multiprocessing.active_children()] if workers else []
            cpu, main = _cpu_seconds(pids) if workers else float("nan"), time.process_time()
        elif step == batches - 1:  # before the workers, done, exit
            cpu, main = _cpu_seconds(pids) - cpu if workers else float("nan"), time.process_time() - main
    del batch
    close_pipeline(pipeline)
    images = (batches - 1 - half) * batch_size
    return (images / (arrived[-1] - arrived[half]), images / cpu if cpu > 0 else float("nan"),
            1e3 * main / (batches - 1 - half))


def pipeline_table(args, files: dict[str, Path]) -> None:
    print(f"\nTable 1: the input pipeline alone, images/s (medians of {args.pipeline_rounds} alternating round(s); "
          f"batches of {args.batch_size}, over the second half of "
          f"{args.batches} batches, {IN_MEMORY_FACTOR} times more for the in-memory kinds; image folders at {args.image_size} px with "
          f"Inception crop + flip (+randaugment: then RandAugment {RANDAUGMENT}), from "
          f"{args.jpeg_sides[0]}-{args.jpeg_sides[1]} px JPEGs)")
    print(f"{'dataset':<24}" + "".join(f"{f'{w} worker(s)':>13}" for w in args.workers)
          + "".join(f"{f'{w}w/{args.workers[0]}w':>9}" for w in args.workers[1:]) + f"{'per CPU-s':>11}"
          + f"{'main ms':>9}")
    for kind in args.kinds:
        name, _, extra = kind.partition("+")  # "imagefolder+randaugment": the image folder with RandAugment
        size = args.image_size if name in ("imagefolder", "captions") else None
        rate = transport_rate if name == "transport" else pipeline_rate
        name = "cifar10" if name == "transport" else name
        try:
            dataset = load_dataset(name, files.get(name), image_size=size,
                                   randaugment=RANDAUGMENT if extra == "randaugment" else None)
        except RandAugmentUnavailable as err:
            print(f"{kind:<24}skipped: RandAugment needs PyTorch and kornia ({err.__cause__}); "
                  f"pip install -e '.[augment]' after a PyTorch wheel")
            continue
        batches = args.batches * (1 if size else IN_MEMORY_FACTOR)  # fast kinds: more batches for a steady rate
        runs = {w: [] for w in args.workers}
        for _ in range(args.pipeline_rounds):  # alternate the counts: a slow minute hits all of them
            for w in args.workers:
                runs[w].append(rate(dataset, args.batch_size, w, batches))
        rates = [np.median([r for r, _, _ in runs[w]]) for w in args.workers]
        _, per_cpu, main_ms = np.median(runs[args.workers[-1]], axis=0)
        print(f"{kind:<24}" + "".join(f"{r:>13.0f}" for r in rates)
              + "".join(f"{r / rates[0]:>9.2f}" for r in rates[1:]) + f"{per_cpu:>11.0f}{main_ms:>9.3f}")
    print("per CPU-s: images per CPU-second of the workers at the largest count (one worker's rate with a core of "
          "its own); main ms: CPU of this process a batch at the largest count (receiving it; with 0 workers, "
          "building it too) -- on C cores no worker count passes C / (main + a worker's CPU a batch) batches a "
          "second; transport: bare multiprocessing queues carrying CIFAR's elements, no dataset, no Grain (the "
          "ceiling of a batch that is a memory gather)")


def bare_steps_per_second(config, dataset, batch_size: int, steps: int) -> float:
    """Steps/s of the jitted training step alone, on one uint8 batch already on the device."""
    graphdef, params, rest = nnx.split(build_model(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx = make_optimizer(recipe_for(config))
    opt_state = tx.init(params)
    step = make_train_step(graphdef, tx)
    pipeline = train_pipeline(dataset, batch_size, seed=0, stop_step=1)
    batch = jax.device_put({k: v for k, v in next(pipeline).items() if k in ("image", "label")})
    close_pipeline(pipeline)
    key = jax.random.key(0)
    for _ in range(2):  # compiles (the second call sees the first's outputs)
        params, opt_state, metrics = step(params, rest, opt_state, batch, key)
    jax.block_until_ready(metrics)
    started = time.perf_counter()
    for _ in range(steps):
        params, opt_state, metrics = step(params, rest, opt_state, batch, key)
    jax.block_until_ready((params, metrics))
    return steps / (time.perf_counter() - started)


def loop_steps_per_second(config, dataset, batch_size: int, steps: int, workers: int) -> float:
    recipe = recipe_for(config).replace(steps=steps + 1, batch_size=batch_size, warmup_steps=1, log_every=0,
                                        eval_every=0)
    result = train(config, dataset, recipe, progress=False, data_workers=workers)
    return result.history[-1]["images_per_second"] / batch_size


def _loop_rows(args, files: dict[str, Path]):
    """(label, model config, dataset, batch size) of each row of table 2."""
    for spec, from_folder in [(p, False) for p in args.presets] + [(p, True) for p in args.folder_presets]:
        family, _, name = spec.rpartition(":")
        config = get_preset(family or "vit", name)
        if from_folder:
            dataset = load_dataset("imagefolder", files["imagefolder"], image_size=config.image_size)
            batch_size, label = args.folder_batch, f"{name} (JPEGs)"
        else:
            dataset = load_dataset("digit-glyphs" if name.startswith("glyphs-") else "digits", None,
                                   image_size=config.image_size)
            batch_size = recipe_for(config).batch_size if not args.quick else args.batch_size
            label = name
        config = config.replace(num_classes=dataset.num_classes, channels=dataset.image_shape[2])
        yield label, config, dataset, batch_size


def loop_table(args, files: dict[str, Path]) -> None:
    workers = args.loop_workers or sorted({0, default_workers()})
    print(f"\nTable 2: the training loop against its bare jitted step, steps/s ({args.loop_steps} steps after the "
          f"first; medians over {args.rounds} round(s), each timing the bare step and then the loop; the loop reads "
          f"the pipeline with {' and '.join(map(str, workers))} worker(s); ratio: median of the rounds' ratios, "
          f"[range]; pipeline: images/s of the pipeline alone with {workers[-1]} worker(s) over "
          f"{args.batches} batches, against the bare step's images/s)")
    print(f"{'preset':<30}{'batch':>6}{'bare':>9}" + "".join(f"{f'loop w={w}':>11}{'ratio':>19}" for w in workers)
          + f"{'pipeline':>10}{'bare img/s':>11}")
    for label, config, dataset, batch_size in _loop_rows(args, files):
        bare, loops, ratios = [], {w: [] for w in workers}, {w: [] for w in workers}
        for _ in range(args.rounds):
            bare.append(bare_steps_per_second(config, dataset, batch_size, args.loop_steps))
            for w in workers:
                loops[w].append(loop_steps_per_second(config, dataset, batch_size, args.loop_steps, w))
                ratios[w].append(loops[w][-1] / bare[-1])
        alone, _, _ = pipeline_rate(dataset, batch_size, workers[-1], max(args.batches, 2 * workers[-1] + 2))
        cells = [f"{np.median(loops[w]):>11.1f}{np.median(ratios[w]):>7.2f} [{min(ratios[w]):.2f}-{max(ratios[w]):.2f}]"
                 for w in workers]
        print(f"{label:<30}{batch_size:>6}{np.median(bare):>9.1f}" + "".join(cells)
              + f"{alone:>10.0f}{np.median(bare) * batch_size:>11.0f}")


def _timed(function, *args, steps: int) -> float:
    """Seconds per call of ``function(*args)`` (compiled before), ``steps`` calls, waiting for the results."""
    jax.block_until_ready(function(*args))
    started = time.perf_counter()
    for _ in range(steps):
        out = function(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - started) / steps


def device_table(args) -> None:
    """Table 3: the training step of ``args.device_preset`` (its recipe: the i1k one) with and without RandAugment
    (2, 10) on the device, and RandAugment + mixup alone, at ``args.device_batch``."""
    from moe_course.train.mixup import mixup
    from moe_course.train.randaugment import randaugment

    config = get_preset("vit", args.device_preset)
    recipe = recipe_for(config)
    graphdef, params, rest = nnx.split(build_model(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx = make_optimizer(recipe)
    opt_state = tx.init(params)
    side, batch_size = config.image_size, args.device_batch
    rng = np.random.default_rng(0)
    batch = jax.device_put({"image": rng.integers(0, 256, (batch_size, side, side, 3), dtype=np.uint8),
                            "label": rng.integers(0, config.num_classes, batch_size).astype(np.int32)})
    steps = {name: make_train_step(graphdef, tx, mixup_p=recipe.mixup_p, num_classes=config.num_classes,
                                   randaugment=setting)
             for name, setting in (("plain", None), ("augmented", RANDAUGMENT))}

    @jax.jit
    def augment_alone(key, images, labels):
        images = randaugment(key, images.astype(jnp.float32) / 255.0, n=RANDAUGMENT[0], magnitude=RANDAUGMENT[1])
        return mixup(key, images, jax.nn.one_hot(labels, config.num_classes), p=recipe.mixup_p)

    key = jax.random.key(0)
    times = {"plain": [], "augmented": [], "alone": []}
    for _ in range(args.rounds):
        for name in ("plain", "augmented"):
            times[name].append(_timed(steps[name], params, rest, opt_state, batch, key, steps=args.device_steps))
        times["alone"].append(_timed(augment_alone, key, batch["image"], batch["label"], steps=args.device_steps))
    plain, augmented, alone = (np.median(times[k]) * 1e3 for k in ("plain", "augmented", "alone"))
    print(f"\nTable 3: the i1k input's device part on {jax.devices()[0].device_kind} ({jax.default_backend()}): "
          f"{args.device_preset} at {side} px, batch {batch_size}, {args.device_steps} step(s) a round, medians of "
          f"{args.rounds} round(s)")
    print(f"{'step without RandAugment':<36}{plain:>10.1f} ms  {batch_size / plain * 1e3:>9.1f} images/s")
    print(f"{'step with RandAugment (2, 10)':<36}{augmented:>10.1f} ms  {batch_size / augmented * 1e3:>9.1f} images/s")
    print(f"{'RandAugment (2, 10) + mixup alone':<36}{alone:>10.1f} ms  {batch_size / alone * 1e3:>9.1f} images/s")
    print(f"RandAugment's cost: {(augmented - plain) / plain:+.1%} of the step (with - without) / without; alone "
          f"{alone / plain:.1%} of the step")


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, help=f"dataset kinds of table 1 {parser.size('kinds')}")
    parser.add_argument("--workers", type=int, nargs="+",
                        help="worker counts of table 1 (default: 1, 2, 4, ... up to the cores; --quick: 0 1)")
    parser.add_argument("--tables", type=int, nargs="+", choices=[1, 2, 3], default=[1, 2, 3], help="which tables")
    parser.add_argument("--loop-workers", type=int, nargs="+",
                        help="worker counts of the loop in table 2 (default: 0 and the cores; --quick: 0)")
    for name, kind, text in [("batches", int, "timed batches per pipeline"), ("batch_size", int, "images per batch"),
                             ("image_size", int, "image-folder side in px"), ("jpegs", int, "JPEG files made"),
                             ("loop_steps", int, "timed steps of table 2"), ("rounds", int, "rounds of table 2"),
                             ("pipeline_rounds", int, "rounds of table 1"),
                             ("device_batch", int, "batch of table 3"),
                             ("device_steps", int, "steps a round, table 3")]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"{text} {parser.size(name)}")
    parser.add_argument("--presets", nargs="*", help=f"[family:]preset of table 2 (default family vit), trained on "
                        f"the embedded digits {parser.size('presets')}")
    parser.add_argument("--folder-presets", nargs="*", help="[family:]preset of table 2 trained from the JPEG folder "
                        f"at its image size (default: {' '.join(ACCELERATOR_FOLDER_PRESETS)} on an accelerator, "
                        f"none on a CPU; --quick: {' '.join(QUICK['folder_presets'])})")
    parser.add_argument("--folder-batch", type=int, help=f"batch of the folder rows {parser.size('folder_batch')}")
    parser.add_argument("--device-preset", help=f"ViT preset of table 3 {parser.size('device_preset')}")
    parser.add_argument("--jpeg-sides", type=int, nargs=2, help=f"JPEG side range in px {parser.size('jpeg_sides')}")
    args = parser.parse_args()
    if args.workers is None:
        cores = default_workers()
        args.workers = sorted({1, 2, *[2**k for k in range(cores.bit_length()) if 2**k <= cores], cores})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device: {jax.devices()[0].device_kind}; {default_workers()} usable cores, load average {load:.1f} "
          f"at the start; JAX {jax.__version__}")
    if args.folder_presets is None:
        args.folder_presets = [] if jax.default_backend() == "cpu" else ACCELERATOR_FOLDER_PRESETS
    with tempfile.TemporaryDirectory() as tmp:
        needed = 1 in args.tables or (2 in args.tables and args.folder_presets)
        files = make_files(Path(tmp), args) if needed else {}
        if 1 in args.tables:
            pipeline_table(args, files)
        if 2 in args.tables:
            loop_table(args, files)
    if 3 in args.tables:
        device_table(args)


if __name__ == "__main__":
    main()
