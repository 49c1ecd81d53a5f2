"""The TPU chips a run can be planned for (``parallel.plan``): memory, peak compute and memory bandwidth per chip,
and the topology names libtpu's compile-only devices take (``jax.experimental.topologies.get_topology_desc``).

Values from Google Cloud's TPU system architecture pages (the "key specifications" table of each):
- v3: https://cloud.google.com/tpu/docs/v3 -- 123 TFLOP/s bf16 per chip, HBM2 32 GiB, 900 GBps, two TensorCores
  per chip, each its own JAX device (16 GiB and half the compute each);
- v4: https://cloud.google.com/tpu/docs/v4 -- 275 TFLOP/s (bf16), HBM2 32 GiB, 1200 GBps; its two TensorCores
  form one JAX device ("megacore"), as on a v4 TPU VM;
- v5e: https://cloud.google.com/tpu/docs/v5e -- 197 TFLOP/s (bf16), HBM2 16 GB, 819 GBps;
- v5p: https://cloud.google.com/tpu/docs/v5p -- 459 TFLOP/s (bf16), HBM2e 95 GB, 2765 GBps (megacore);
- v6e (Trillium): https://cloud.google.com/tpu/docs/v6e -- 918 TFLOP/s (bf16), HBM 32 GB, 1638 GBps.
The pages write "GB" for the v5e, v5p and v6e memories and "GiB" for v3 and v4; HBM stacks come in binary sizes,
so all are taken as GiB here (2^30 bytes). Bandwidths are decimal (10^9 bytes/s), as written.
"""

from __future__ import annotations

import dataclasses
import math

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class TpuChip:
    """One TPU generation. name: the topology prefix ("v5e" in "v5e:2x2"); device_kind: JAX's
    ``Device.device_kind`` for it; hbm_bytes: HBM per chip (bytes); peak_bf16_flops: dense bf16 peak per chip
    (FLOP/s); hbm_bandwidth: bytes/s per chip; devices_per_chip: JAX devices per chip (2 for v3's separate
    TensorCores); dims: how many numbers the topology has (2 for a 2D torus, 3 for a 3D one); chip_config:
    libtpu's chip configuration ("megacore": one device per chip); source: the page the numbers come from."""

    name: str
    device_kind: str
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bandwidth: float
    devices_per_chip: int
    dims: int
    chip_config: str
    source: str

    @property
    def family(self) -> str:
        """The device family name of ``train.throughput.PEAK_TFLOPS`` ("TPU v5e")."""
        return f"TPU {self.name}"

    @property
    def device_hbm_bytes(self) -> int:
        """HBM of one JAX device (bytes)."""
        return self.hbm_bytes // self.devices_per_chip

    @property
    def device_peak_flops(self) -> float:
        """Dense bf16 peak of one JAX device (FLOP/s)."""
        return self.peak_bf16_flops / self.devices_per_chip

    @property
    def device_bandwidth(self) -> float:
        """HBM bandwidth of one JAX device (bytes/s)."""
        return self.hbm_bandwidth / self.devices_per_chip


TPU_CHIPS: dict[str, TpuChip] = {chip.name: chip for chip in (
    TpuChip("v3", "TPU v3", 32 * GIB, 123e12, 900e9, 2, 2, "default", "https://cloud.google.com/tpu/docs/v3"),
    TpuChip("v4", "TPU v4", 32 * GIB, 275e12, 1200e9, 1, 3, "megacore", "https://cloud.google.com/tpu/docs/v4"),
    TpuChip("v5e", "TPU v5 lite", 16 * GIB, 197e12, 819e9, 1, 2, "default", "https://cloud.google.com/tpu/docs/v5e"),
    TpuChip("v5p", "TPU v5", 95 * GIB, 459e12, 2765e9, 1, 3, "default", "https://cloud.google.com/tpu/docs/v5p"),
    TpuChip("v6e", "TPU v6 lite", 32 * GIB, 918e12, 1638e9, 1, 2, "default", "https://cloud.google.com/tpu/docs/v6e"),
)}


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice (or several): chip, chips per side of the torus, and the number of slices."""

    chip: TpuChip
    shape: tuple[int, ...]
    num_slices: int = 1

    @property
    def name(self) -> str:
        """The topology name libtpu takes, e.g. "v5e:2x2"."""
        return f"{self.chip.name}:{'x'.join(map(str, self.shape))}"

    @property
    def num_chips(self) -> int:
        """Chips over all slices."""
        return math.prod(self.shape) * self.num_slices

    @property
    def num_devices(self) -> int:
        """JAX devices over all slices (chips x devices per chip)."""
        return self.num_chips * self.chip.devices_per_chip


def parse_topology(name: str, num_slices: int = 1) -> Topology:
    """``"v5e:2x2"`` -> Topology(v5e, (2, 2)). ``num_slices``: slices of that topology joined over the data-center
    network (multi-slice); 1 by default.

    Raises ValueError naming ``topology`` (an unknown chip, sizes that are not positive integers, the wrong number
    of sizes for the chip's torus) or ``num_slices`` (not a positive integer), with the allowed values; nothing is
    compiled or loaded. Whether libtpu knows the shape (e.g. "v5e:3x3" does not split into hosts) is checked when
    the devices are made (``compile_only_devices``)."""
    allowed = ", ".join(_example(chip) for chip in TPU_CHIPS.values())
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(f"num_slices={num_slices!r} is not allowed; use a positive integer")
    chip_name, sep, sizes = (name if isinstance(name, str) else "").partition(":")
    chip = TPU_CHIPS.get(chip_name.strip().lower())
    if not sep or chip is None:
        raise ValueError(f"topology={name!r} is not a TPU topology; write chip:AxB[xC] with chip one of "
                         f"{', '.join(TPU_CHIPS)} (e.g. {allowed})")
    parts = sizes.strip().lower().split("x")
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"topology={name!r}: the sizes {sizes!r} are not positive integers joined by 'x' "
                         f"(e.g. {_example(chip)})")
    if len(parts) != chip.dims:
        raise ValueError(f"topology={name!r}: {chip.name} is a {chip.dims}D torus, so it takes {chip.dims} sizes "
                         f"(e.g. {_example(chip)}), not {len(parts)}")
    return Topology(chip, tuple(int(part) for part in parts), num_slices)


def _example(chip: TpuChip) -> str:
    """The smallest usual slice of ``chip``: "v5e:2x2", "v4:2x2x1" (one host)."""
    return f"{chip.name}:{'2x2' if chip.dims == 2 else '2x2x1'}"


def compile_only_devices(topology: Topology) -> list:
    """The JAX devices of ``topology`` as libtpu describes them without any TPU attached (compile-only: programs
    can be lowered and compiled for them, never run). Needs libtpu (``pip install 'moe-course[tpu]'``).

    Raises ``CompileOnlyUnavailable`` naming libtpu when it is not installed, and ValueError naming ``topology``
    when libtpu refuses the shape (its message quoted)."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        raise CompileOnlyUnavailable("compile-only TPU devices need libtpu, which is not installed; "
                                     "pip install 'moe-course[tpu]' (any x86-64 Linux machine, no TPU needed)")
    import os

    # libtpu takes /tmp/libtpu_lockfile so that two processes never drive one TPU; compile-only devices drive
    # none, and without this a second planning process (another test worker, a second terminal) is refused.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(platform="tpu", topology_name=topology.name,
                                                   chip_config_name=topology.chip.chip_config,
                                                   num_slices=topology.num_slices)
    except Exception as err:  # jax.errors.JaxRuntimeError: INVALID_ARGUMENT / NOT_FOUND from libtpu
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"topology={topology.name!r} (num_slices={topology.num_slices}) is refused by libtpu: "
                         f"{message}") from err
    return list(description.devices)


class CompileOnlyUnavailable(RuntimeError):
    """libtpu, which provides the compile-only TPU devices, is not installed."""
