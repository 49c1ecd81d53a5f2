#!/usr/bin/env bash
# Wheels of the course's dependencies that a GPU host's own Python environment may lack, for a host without a
# package index: run this where pip reaches one, copy DIR beside the checkout there, and benchmarks/accelerator.sh
# installs them before it measures.
#
#   bash benchmarks/accelerator_wheels.sh [PYTHON_VERSION] [DIR]      (defaults: 3.12 and .whl)
#
# The list is what `moe-course train` and the benchmarks import beyond an image with JAX, Flax, Optax, Orbax,
# PyTorch, absl-py, etils, cloudpickle, protobuf and psutil (Grain's other needs): Grain, its array_record and
# portpicker, and traitlets (moe_course.course). Versions as pyproject.toml allows them.
set -euo pipefail
version=${1:-3.12}
dir=${2:-.whl}
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    "${platforms[@]}" -d "$dir" "grain>=0.2.18,<0.3" "array-record>=0.8.1" portpicker traitlets
ls "$dir"
