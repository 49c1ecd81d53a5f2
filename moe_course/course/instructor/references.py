"""What the checks' references share (``solutions/checks/NN_slug.py``): a library module built with a drawn
parameter tree and run as one compiled computation.

A reference runs in the grading worker, outside the sandbox, once per case and per submission. Built and run
eagerly, a module compiles every initialiser and every operation of its forward pass for every new shape: 25 s
for the three drawn ViTs of exercise 01's embedding check on 2 cores. Built inside ``jax.jit``, the
initialisers' results are replaced before anything reads them, so XLA drops them, and the case costs one
compilation.
"""

from __future__ import annotations

from typing import Callable


def run_module(make: Callable, params: dict, function: Callable, *arrays):
    """``function(module, *arrays)`` for ``module = make()`` with its parameters the plain dict ``params`` (the
    paths of ``nnx.to_pure_dict(nnx.state(module, nnx.Param))``), traced and run as one jax.jit computation.

    ``make`` takes no argument and builds an ``nnx.Module`` (its own ``nnx.Rngs``); ``arrays`` are the array
    arguments (anything static -- heads, a capacity -- belongs in ``make`` or ``function``'s closure). Returns
    what ``function`` returns, as JAX arrays. Raises what ``nnx.replace_by_pure_dict`` raises for a path the
    module lacks, and a shape mismatch from the compiled computation."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def loaded_then(tree, *inputs):
        module = make()
        state = nnx.state(module, nnx.Param)
        nnx.replace_by_pure_dict(state, tree)
        nnx.update(module, state)
        return function(module, *inputs)

    return jax.jit(loaded_then)(jax.tree.map(jnp.asarray, params), *map(jnp.asarray, arrays))


def run_compiled(function: Callable, *arrays, **static):
    """``function(*arrays, **static)`` as one jax.jit computation (``static``: Python values it is traced with)."""
    import jax

    return jax.jit(lambda *inputs: function(*inputs, **static))(*arrays)
