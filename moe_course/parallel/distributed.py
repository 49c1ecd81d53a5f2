"""Several hosts: join the processes of a run with ``jax.distributed.initialize`` before JAX touches a device.

Each host (a GPU node, a TPU VM worker) runs the same command; ``jax.distributed.initialize`` connects the
processes through a coordinator (process 0's address), after which ``jax.devices()`` lists every process's
devices and a mesh spans them all. Each process then feeds its own devices' shards of every global array
(``moe_course.parallel.put``), and collectives such as the experts' all-to-all cross hosts.

Where the settings come from, first match wins:
1. arguments (the CLI's ``--coordinator-address``, ``--num-processes``, ``--process-id``);
2. the environment variables ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``;
3. none given: ``jax.distributed.initialize()`` detects the cluster itself -- SLURM (``srun``), Open MPI,
   Cloud TPU pods and GKE set everything it needs.
On CPU devices the processes exchange data through gloo (``jax_cpu_collectives_implementation``).
"""

from __future__ import annotations

import os

import jax

ENVIRONMENT = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
               "process_id": "JAX_PROCESS_ID"}


def distributed_settings(coordinator_address: str | None = None, num_processes: int | None = None,
                         process_id: int | None = None, environ: dict | None = None) -> dict:
    """The keyword arguments for ``jax.distributed.initialize``: given values, else the environment variables
    of ``ENVIRONMENT``; absent ones are left out (JAX then detects them on SLURM, MPI and TPU pods).

    Raises ValueError naming the field for a process count < 1, a process id outside 0..count-1, a
    non-integer environment value, or a coordinator address without ``host:port``.
    """
    environ = os.environ if environ is None else environ
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    settings = {}
    for field, value in given.items():
        if value is None and environ.get(ENVIRONMENT[field]):
            value = environ[ENVIRONMENT[field]]
            if field != "coordinator_address":
                if not str(value).strip().isdigit():
                    raise ValueError(f"{ENVIRONMENT[field]}={value!r}: {field} must be a non-negative integer")
                value = int(value)
        if value is not None:
            settings[field] = value
    address = settings.get("coordinator_address")
    if address is not None and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
        raise ValueError(f"coordinator_address={address!r} must be host:port, e.g. 10.0.0.1:1234 (process 0's host)")
    count = settings.get("num_processes")
    if count is not None and count < 1:
        raise ValueError(f"num_processes={count} must be at least 1")
    pid = settings.get("process_id")
    if pid is not None and (pid < 0 or (count is not None and pid >= count)):
        raise ValueError(f"process_id={pid} must be in 0..{(count or 1) - 1} (num_processes={count})")
    return settings


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> dict:
    """Join a multi-process run (``jax.distributed.initialize``), before anything asks JAX for devices.

    Arguments and environment as in ``distributed_settings``. CPU collectives go through gloo, so CPU devices
    of several processes can run all-to-all and all-reduce (the two-process test, a laptop demo); GPUs and TPUs
    use their own interconnect. Returns the settings used. Raises ValueError as ``distributed_settings``.
    """
    settings = distributed_settings(coordinator_address, num_processes, process_id)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**settings)
    return settings
