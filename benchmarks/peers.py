"""Our MoE layers against the public implementations a user would pick instead, forward+backward, side by side.

Soft MoE (Puigcerver et al.) at ViT-S/16 sizes, 128 experts x 1 slot:
- PyTorch ``moe_course.torch.layers.SoftMoE`` against lucidrains' ``soft-moe-pytorch`` (PyPI) with our weights
  copied in. It computes something slightly different: RMSNorm on the tokens and the slot parameters (its
  gammas are set here so the router logits equal ours), and its experts see the *normalised* tokens; it loops
  over the experts in Python (one ``nn.Linear`` pair each).
- JAX ``moe_course.layers.SoftMoE`` against google-research/vmoe's ``SoftRouter`` and its einsum dispatcher
  (float32 and its default bfloat16 dispatch) around our own einsum experts, same parameters. vmoe is not on
  PyPI: pass ``--vmoe PATH`` to a checkout (the folder holding ``vmoe/``); without it this peer is skipped.
Sparse MoE (top-2 Tokens Choice, and Experts Choice) at the same sizes with ``--experts`` experts, one image per
routing group (as both peers route), buffers of round(k * tokens * C / E) slots:
- PyTorch ``moe_course.torch.layers.SparseMoE`` against lucidrains' ``mixture-of-experts`` (einsum experts,
  no biases, one-hot dispatch) and ``st-moe-pytorch`` (experts given as our MLP modules, one-hot dispatch),
  router and expert weights copied in, both told to keep every token's second choice. Neither peer offers
  Experts Choice; that row is compared with the same peers (same buffer sizes, different assignment).

Every row's implementations run in turn in one process (``rounds_ms``), so load from other processes falls on
all of them alike; the table gives the median of ``--rounds`` rounds, the spread (min-max) and ours/peer
(> 1: ours is slower). A peer that cannot be imported is skipped with the reason printed. Run it with huge pages
for large allocations (``THP_MEM_ALLOC_ENABLE=1`` or ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``) as well as
without: our PyTorch Soft MoE's weight gradients are two fresh 302 MB tensors per step, and with 4 KiB pages
their page faults dominate its time (benchmarks/README.md).
Usage: python benchmarks/peers.py [--quick] [--batch 8 32] [--vmoe PATH]
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from moe_course import layers as jl
from moe_course.analysis.timing import grad_step, rounds_ms
from moe_course.routing import CapacityRoundingWarning
from moe_course.torch import layers as tl

FULL = dict(tokens=197, width=384, hidden=1536, soft_experts=128, experts=8, batch=[8, 32], rounds=7)
QUICK = dict(tokens=8, width=16, hidden=32, soft_experts=4, experts=4, batch=[2], rounds=1)
PEERS = {"soft-moe-pytorch": "soft_moe_pytorch", "mixture-of-experts": "mixture_of_experts",
         "st-moe-pytorch": "st_moe_pytorch"}


def _import_peers(vmoe_path: str | None) -> dict:
    """{package name: module} of the peers that import; prints one line per skipped peer and why."""
    found = {}
    for name, module in PEERS.items():
        try:
            found[name] = importlib.import_module(module)
        except Exception as err:  # any import failure (missing package, incompatible torch) skips the peer
            print(f"skipped {name}: {type(err).__name__}: {err}")
    if vmoe_path is None:
        print("skipped vmoe: no --vmoe PATH given (a checkout of github.com/google-research/vmoe)")
    else:
        sys.path.insert(0, vmoe_path)
        try:
            found["vmoe"] = importlib.import_module("vmoe.projects.soft_moe.router")
        except Exception as err:
            print(f"skipped vmoe: {type(err).__name__}: {err}")
    return found


def _torch_step(layer, output):
    """fn(x): gradients of sum(output(layer(x))) w.r.t. the parameters and x, as a training step takes them."""
    def step(x):
        x = x.detach().requires_grad_()
        layer.zero_grad(set_to_none=True)
        output(layer(x)).backward()
    return step


def _moe_loss(out):
    return out.output.sum() + out.aux_loss


def _copy_(target: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        target.copy_(value)


def _soft_torch(a, found) -> dict:
    """{name: (torch layer, output fn)}: ours and lucidrains' Soft MoE with our weights."""
    ours = tl.SoftMoE(a.width, a.hidden, a.soft_experts)
    out = {"ours (PyTorch)": (ours, _moe_loss)}
    if "soft-moe-pytorch" in found:
        peer = found["soft-moe-pytorch"].SoftMoE(a.width, num_slots=1, num_experts=a.soft_experts,
                                                 expert_mult=a.hidden / a.width)
        # RMSNorm(x) = unit(x) sqrt(d) gamma: these gammas make its logits unit(x) . scale unit(phi), as ours.
        _copy_(peer.norm.gamma, torch.full((a.width,), a.width ** -0.5))
        _copy_(peer.slot_norm.gamma, torch.full((a.width,), float(ours.scale.detach()) * a.width ** -0.5))
        _copy_(peer.slot_embeds, ours.phi.T.reshape(a.soft_experts, 1, a.width))
        _copy_experts(ours.experts, [(e[0], e[3]) for e in peer.experts.experts])
        out["soft-moe-pytorch"] = (peer, lambda y: y.sum())
    return out


def _copy_experts(experts, linears) -> None:
    """Our Experts' kernels and biases into one (fc1, fc2) ``nn.Linear`` pair per expert."""
    for e, (fc1, fc2) in enumerate(linears):
        _copy_(fc1.weight, experts.fc1_kernel[e].T)
        _copy_(fc1.bias, experts.fc1_bias[e])
        _copy_(fc2.weight, experts.fc2_kernel[e].T)
        _copy_(fc2.bias, experts.fc2_bias[e])


def _soft_jax(a, found) -> dict:
    """{name: (fn, params)}: our JAX Soft MoE, and vmoe's SoftRouter + dispatcher around the same experts."""
    ours = jl.SoftMoE(a.width, a.hidden, a.soft_experts, rngs=nnx.Rngs(0))
    out = {"ours (JAX)": grad_step(ours)}
    if "vmoe" in found:
        router = found["vmoe"].SoftRouter(num_experts=a.soft_experts, num_slots=1, deterministic=True,
                                          compute_similarity_metrics=False)
        for dtype in ("float32", "bfloat16"):
            out[f"vmoe, {dtype} dispatch"] = _vmoe_soft_step(ours, router, bfloat16=dtype == "bfloat16")
    return out


def _vmoe_soft_step(layer, router, *, bfloat16: bool):
    graphdef, params = nnx.split(layer)

    def loss(params, x):
        module = nnx.merge(graphdef, params)
        mu = module.phi[...].reshape(x.shape[-1], layer.num_experts, layer.slots_per_expert)
        dispatcher, _ = router.apply({"params": {"mu": mu, "scale": module.scale[...]}}, x)
        if not bfloat16:
            dispatcher = dispatcher.dispatcher  # the float32 EinsumDispatcher inside vmoe's bfloat16 wrapper
        slots = dispatcher.dispatch(x)  # (experts, groups * slots, width): one routing group for our experts
        return dispatcher.combine(module.experts(slots[None])[0]).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1))), params


def _sparse_torch(a, found) -> dict:
    """{name: (torch layer, output fn)}: our SparseMoE (Tokens Choice, Experts Choice; k 2, C 1.05, one image
    per group) and the two lucidrains peers with our router and expert weights."""
    settings = dict(k=2, capacity_ratio=1.05, group_size=1)
    tc = tl.SparseMoE(a.width, a.hidden, a.experts, **settings)
    ec = tl.SparseMoE(a.width, a.hidden, a.experts, allocation="experts_choice", **settings)
    ec.load_state_dict(tc.state_dict())
    out = {"ours, Tokens Choice": (tc, _moe_loss), "ours, Experts Choice": (ec, _moe_loss)}
    # Both peers size a buffer int(tokens * factor / E); factor k * C gives ours round(k * tokens * C / E) or 1 less.
    factor = settings["k"] * settings["capacity_ratio"]
    if "mixture-of-experts" in found:
        peer = found["mixture-of-experts"].MoE(a.width, num_experts=a.experts, hidden_dim=a.hidden,
                                               activation=torch.nn.GELU, second_policy_train="all",
                                               capacity_factor_train=factor)
        _copy_(peer.gate.w_gating, tc.router.weight.T)
        _copy_(peer.experts.w1, tc.experts.fc1_kernel)  # no biases in this peer; ours are zero at init
        _copy_(peer.experts.w2, tc.experts.fc2_kernel)
        out["mixture-of-experts"] = (peer, lambda y: y[0].sum() + y[1])
    if "st-moe-pytorch" in found:
        experts = [tl.MLP(a.width, a.hidden) for _ in range(a.experts)]
        _copy_experts(tc.experts, [(e.fc1, e.fc2) for e in experts])
        peer = found["st-moe-pytorch"].MoE(a.width, num_experts=a.experts, gating_top_n=2, experts=torch.nn.ModuleList(experts),
                                           threshold_train=1e-9, capacity_factor_train=factor)
        _copy_(peer.gate.to_gates.weight, tc.router.weight)
        out["st-moe-pytorch"] = (peer, lambda y: y.outputs.sum() + y.total_aux_loss)
    return out


def _table(title: str, times: dict, reference: list[str]) -> None:
    """Print median, spread and ours/peer for every peer (names not in ``reference``)."""
    print(f"\n{title}")
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    peers = [name for name in times if name not in reference]
    header = "".join(f" {'ours/' + p[:18]:>24}" for p in peers)
    print(f"{'implementation':<24} {'median ms':>10} {'min-max ms':>17}{header}")
    for name, ms in times.items():
        ratios = "".join(f" {medians[name] / medians[p]:>24.2f}" if name in reference else f" {'':>24}"
                         for p in peers)
        print(f"{name:<24} {medians[name]:>10.1f} {min(ms):>8.1f}-{max(ms):<8.1f}{ratios}")


def _device() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    return (f"device: {cpu}, {os.cpu_count()} cores{load}; PyTorch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; JAX {jax.__version__} {jax.devices()[0].platform}; "
            f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}, "
            f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '')!r}"
            + ("" if _huge_pages() else "\nnote: no huge-page switch set, so large gradients are faulted in 4 KiB at a "
               "time; our PyTorch Soft MoE pays most for it (benchmarks/README.md, 'Against peer implementations')"))


def _huge_pages() -> bool:
    return (os.environ.get("THP_MEM_ALLOC_ENABLE", "0") not in ("", "0")
            or "glibc.malloc.hugetlb=1" in os.environ.get("GLIBC_TUNABLES", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument("--batch", type=int, nargs="+", help=f"images per batch (default {FULL['batch']})")
    parser.add_argument("--rounds", type=int, help=f"timed rounds per implementation (default {FULL['rounds']})")
    parser.add_argument("--experts", type=int, help=f"sparse layer's experts (default {FULL['experts']})")
    parser.add_argument("--vmoe", metavar="PATH", help="folder holding a google-research/vmoe checkout's vmoe/")
    parser.add_argument("--only", choices=("soft-torch", "soft-jax", "sparse-torch"), nargs="+",
                        help="run only these tables")
    a = parser.parse_args()
    for name, value in (QUICK if a.quick else FULL).items():
        if getattr(a, name, None) is None:
            setattr(a, name, value)
    warnings.simplefilter("ignore", CapacityRoundingWarning)
    torch.manual_seed(0)
    print(_device())
    found = _import_peers(a.vmoe)
    tables = a.only or ("soft-torch", "soft-jax", "sparse-torch")
    sizes = f"{a.tokens} tokens, width {a.width}, expert hidden {a.hidden}"
    for batch in a.batch:
        x = np.random.default_rng(0).normal(size=(batch, a.tokens, a.width)).astype(np.float32)
        if "soft-torch" in tables:
            calls = {n: (_torch_step(m, f), (torch.from_numpy(x),)) for n, (m, f) in _soft_torch(a, found).items()}
            _table(f"Soft MoE, PyTorch, batch {batch} x {sizes}, {a.soft_experts} experts x 1 slot",
                   rounds_ms(calls, repeats=1, rounds=a.rounds), ["ours (PyTorch)"])
        if "soft-jax" in tables:
            calls = {n: (fn, (p, jnp.asarray(x))) for n, (fn, p) in _soft_jax(a, found).items()}
            _table(f"Soft MoE, JAX (jit), batch {batch} x {sizes}, {a.soft_experts} experts x 1 slot",
                   rounds_ms(calls, repeats=1, rounds=a.rounds), ["ours (JAX)"])
        if "sparse-torch" in tables:
            layers = _sparse_torch(a, found)
            calls = {n: (_torch_step(m, f), (torch.from_numpy(x),)) for n, (m, f) in layers.items()}
            _table(f"Sparse MoE, PyTorch, batch {batch} x {sizes}, {a.experts} experts, k 2, C 1.05, 1 image "
                   f"per group", rounds_ms(calls, repeats=1, rounds=a.rounds),
                   ["ours, Tokens Choice", "ours, Experts Choice"])


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
