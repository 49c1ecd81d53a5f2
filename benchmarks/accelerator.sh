#!/usr/bin/env bash
# The accelerator measurements of the input pipeline (issue 34) and of training throughput (issue 35) on one GPU
# host, each beside its baseline in the same run; results go to benchmarks/README.md with the card they ran on.
#
#   bash benchmarks/accelerator.sh [PART ...]        (default: main loop pipeline throughput)
#
#   main        README command 1, `moe-course train vit --preset digits-tiny`: its summary line with train_seconds
#               (goal: 2,500 steps in <= 15 s of training on one H100/H200)
#   loop        benchmarks/input_pipeline.py table 2: the loop against its bare jitted step for digits-tiny and
#               glyphs-tiny (0 workers and all cores), then V-MoE-S/32 every-2 at 224 px from a JPEG folder at
#               batch 512 (goal: >= 90% of its in-memory images/s where the pipeline alone is faster than the step)
#   pipeline    table 1: every dataset kind at 1, 2, 4 and all cores' workers (scaling where cores are free)
#   throughput  benchmarks/train_throughput.py's paper-size rows, JAX and PyTorch, float32 and bfloat16, and JAX
#               bfloat16 with a bfloat16 residual stream (the cost of the models' float32 stream) (goals:
#               deit-s/16 >= 8,000 images/s in bfloat16; routed steps <= FLOP ratio x dense; the PyTorch V-MoE
#               twin <= 1.25x the JAX step per image)
#   i1k         the ImageNet-1k recipe (`--preset vit-s/16-i1k`: big_vision's vit_s16_i1k.py, batch 1024,
#               RandAugment(2, 10), mixup) for 200 steps on a synthetic folder of 1,100 ImageNet-size JPEGs
#               (300-500 px), all cores building batches: its summary's images_per_second, data_wait_fraction
#               and mfu (issue 48; QUICK=1: the i1k-tiny preset, 20 steps of 32 on 60-90 px JPEGs); then
#               input_pipeline.py table 3: the ViT-S/16 step with and without RandAugment (2, 10) on the device,
#               batch 256 (the device's share of the i1k input)
#   upcycle     benchmarks/upcycle.py: the training step of ViT-S/16 upcycled into vmoe-s/16-i1k-every-2-k1 and into
#               the paper's MoE layers (32 experts every other block, Expert Choice, C = 2) against the dense step,
#               batch 256, bfloat16, interleaved rounds (goal: step ratios <= the forward-FLOP ratios, 1.001 and 1.31)
#
# Each part runs under its own time limit (the LIMIT_<PART> variables, seconds) and writes <part>.log to $OUT
# (else accelerator-results/ in the checkout); a part that fails or runs out of time is named at the end, the
# others still run.
# A host without a package index: wheels in .whl/ (benchmarks/accelerator_wheels.sh makes them where pip works)
# are installed first, then this checkout with `pip install --no-deps --no-build-isolation -e .`.
# QUICK=1: the benchmarks' --quick sizes and 20 training steps, a dry run on a CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
parts=("${@:-main loop pipeline throughput i1k}")
parts=(${parts[*]})
for part in "${parts[@]}"; do
    case $part in
        main|loop|pipeline|throughput|i1k|upcycle) ;;
        *) echo "unknown part '$part': use main, loop, pipeline, throughput, i1k or upcycle" >&2; exit 2 ;;
    esac
done
results=${OUT:-accelerator-results}
mkdir -p "$results"
cores=$("$python" -c "from moe_course.data.pipeline import default_workers; print(default_workers())" 2>/dev/null || nproc)

if compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
moe_course=(moe-course)  # README command 1; after an install that put the script off PATH, its entry point
if ! command -v moe-course >/dev/null; then
    "$python" -m pip install -q --no-deps --no-build-isolation -e . || exit 1
    command -v moe-course >/dev/null || moe_course=("$python" -m moe_course.launch)
fi
export PYTHONUNBUFFERED=1

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no NVIDIA GPU"
    echo "$cores usable cores; $("$python" --version)"
    "$python" -c "import jax, flax, grain; print('jax', jax.__version__, jax.devices(), '| flax', flax.__version__, '| grain', grain.__version__ if hasattr(grain, '__version__') else '?')"
    "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -1
} | tee "$results/device.txt"

quick=() steps=()
if [ "${QUICK:-0}" = 1 ]; then quick=(--quick); steps=(--steps 20 --warmup-steps 2); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()

run_part() {  # name, limit in seconds, command ...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s): $*" | tee "$results/$name.log"
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$results/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - started)) s" | tee -a "$results/$name.log"
    [ "$rc" = 0 ] || failed+=("$name (exit $rc)")
}

for part in "${parts[@]}"; do
    case $part in
        main)
            run_part main "${LIMIT_MAIN:-240}" "${moe_course[@]}" train vit --preset digits-tiny --no-progress \
                --workdir "$tmp/digits-tiny" "${steps[@]}" ;;
        loop)
            run_part loop "${LIMIT_LOOP:-360}" "$python" benchmarks/input_pipeline.py --tables 2 --rounds 2 \
                --folder-presets "${quick[@]}"
            [ "${QUICK:-0}" = 1 ] && folder=(--quick) \
                || folder=(--folder-presets vmoe:vmoe-s/32-every-2 --loop-steps 100 --loop-workers "$cores")
            run_part loop-jpegs "${LIMIT_LOOP:-360}" "$python" benchmarks/input_pipeline.py --tables 2 --rounds 2 \
                --presets "${folder[@]}" ;;
        pipeline)
            [ "${QUICK:-0}" = 1 ] && workers=(--quick) || workers=(--workers $(printf '%s\n' 1 2 4 "$cores" | sort -nu))
            run_part pipeline "${LIMIT_PIPELINE:-300}" "$python" benchmarks/input_pipeline.py --tables 1 \
                --pipeline-rounds 1 "${workers[@]}" ;;
        i1k)
            [ "${QUICK:-0}" = 1 ] && i1k=(200 60 90 i1k-tiny --steps 20 --warmup-steps 2) \
                || i1k=(1100 300 500 vit-s/16-i1k --steps 200 --warmup-steps 20)
            "$python" -c "import sys, types; sys.path.insert(0, 'benchmarks'); from input_pipeline import make_files
make_files(__import__('pathlib').Path(sys.argv[1]), types.SimpleNamespace(jpegs=int(sys.argv[2]),
           jpeg_sides=(int(sys.argv[3]), int(sys.argv[4]))))" "$tmp/i1k-data" "${i1k[@]:0:3}" || exit 1
            run_part i1k "${LIMIT_I1K:-600}" "${moe_course[@]}" train vit --preset "${i1k[3]}" --no-progress \
                --dataset imagefolder --data-dir "$tmp/i1k-data/imagefolder" --workdir "$tmp/i1k-run" \
                --data-workers "$cores" "${i1k[@]:4}"
            [ "${QUICK:-0}" = 1 ] && device=(--quick) || device=(--device-batch 256 --device-steps 5)
            run_part i1k-device "${LIMIT_I1K:-600}" "$python" benchmarks/input_pipeline.py --tables 3 --rounds 3 \
                "${device[@]}" ;;
        throughput)
            run_part throughput "${LIMIT_THROUGHPUT:-540}" "$python" benchmarks/train_throughput.py \
                --frameworks jax torch "${quick[@]}" ;;
        upcycle)
            run_part upcycle "${LIMIT_UPCYCLE:-300}" "$python" benchmarks/upcycle.py "${quick[@]}" ;;
    esac
done
[ ${#failed[@]} = 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
