# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 0 -- JAX and Flax NNX for PyTorch users
#
# <details><summary>Terms this chapter uses, each linked to its definition</summary>
#
# [expert](../docs/glossary.md#term-expert), [patch](../docs/glossary.md#term-patch),
# [router](../docs/glossary.md#term-router), [token](../docs/glossary.md#term-token),
# [TOP-k](../docs/glossary.md#term-TOP-k).
#
# </details>
#
# The chapters are written in JAX and Flax NNX. If you know PyTorch, you already know the ideas; what changes
# is where the state lives. PyTorch keeps it inside objects (a global random generator, `.grad` fields filled
# by `.backward()`, an optimizer that changes parameters in place); JAX passes it around explicitly (random
# keys, gradients returned as values, optimizer states returned by a function). This chapter shows the six
# things the chapters use from their first page on, each beside the PyTorch you would write for it:
#
# 1. arrays: `jax.numpy` is NumPy, with arrays that never change in place;
# 2. random numbers: keys instead of `torch.manual_seed`, and `nnx.Rngs` that hands keys to layers;
# 3. modules: `nnx.Module` instead of `torch.nn.Module`, and parameters read with `param[...]`;
# 4. `jax.jit` instead of `torch.compile`: what runs once and what runs every call, static arguments,
#    and `nnx.jit` for functions of modules;
# 5. `jax.grad` and `nnx.value_and_grad` instead of `.backward()`;
# 6. an optax step instead of `torch.optim`, and a small fit whose learning rate you move with a slider.
#
# The PyTorch side is shown as code in the text (it is not run: the course's learner install has no PyTorch);
# the JAX side runs. Every layer of the course also exists in PyTorch, with the same names, in
# `moe_course.torch` (see *Using the layers from PyTorch*, `docs/pytorch.md`): reading a layer in both is a good
# way to learn the JAX one. Running this chapter takes well under a minute of CPU; reading it and doing its
# tasks, about 55 minutes (our estimate). What you need first: Python and NumPy, and PyTorch at the level of
# writing an `nn.Module` and a training loop.

# %%
import ipywidgets as widgets
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx
from IPython.display import display

from moe_course.layers import MLP
from moe_course.settings import chapter_seed

SEED = chapter_seed()  # MOE_COURSE_SEED, 0 when unset: every random draw below starts from this seed
print("JAX devices:", jax.devices(), "| seed", SEED)

# %% [markdown]
# ## 1. Arrays that never change
#
# `jnp` has NumPy's functions and broadcasting rules; a `jax.Array` plays the role of a `torch.Tensor`. The
# one difference you meet at once: a JAX array cannot be changed in place. Where PyTorch writes `x[0] = 10.0`,
# JAX writes `x.at[0].set(10.0)`, which returns a **new** array and leaves `x` as it was:
#
# ```python
# # PyTorch
# x = torch.arange(4.0)
# x[0] = 10.0               # x is now [10., 1., 2., 3.]
# ```

# %%
x = jnp.arange(4.0)
y = x.at[0].set(10.0)
print("x:", x, "  y = x.at[0].set(10.0):", y)
assert float(x[0]) == 0.0 and float(y[0]) == 10.0

# %% [markdown]
# Why JAX insists: its transformations (`jit`, `grad`, below) work on *pure functions* -- functions whose
# result depends only on their arguments and which change nothing outside. Arrays that never change make that
# easy to keep. It costs less than it looks: inside a compiled function (section 4) XLA turns `x.at[...].set`
# into an update in place wherever the old array is not used again.
#
# ## 2. Random numbers: keys, not a global seed
#
# PyTorch draws from a global generator that advances with every draw:
#
# ```python
# # PyTorch
# torch.manual_seed(0)
# a = torch.randn(3)
# b = torch.randn(3)        # different from a: the generator moved on
# ```
#
# JAX has no hidden generator: a draw takes a **key**, an argument you pass in.

# %% [markdown]
# **Predict, then run.** The next cell draws twice from the same key `jax.random.key(SEED)`, then splits the
# key into two new keys and draws once from each. Which of the four draws are equal? Write your guess down
# before you run the next cell.

# %%
key = jax.random.key(SEED)
a = jax.random.normal(key, (3,))
b = jax.random.normal(key, (3,))
key_1, key_2 = jax.random.split(key)
c = jax.random.normal(key_1, (3,))
d = jax.random.normal(key_2, (3,))
print("a == b:", bool(jnp.all(a == b)), "| c == d:", bool(jnp.all(c == d)), "| a == c:", bool(jnp.all(a == c)))

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# The cell prints `a == b: True` and the other two `False`. A key is not a generator: it has no state to
# advance, so drawing from the same key twice gives the same numbers, on any machine and for any seed. To get
# new numbers you `split` a key into fresh ones, and each split key gives its own numbers (which also differ
# from the parent's). Reusing a key where you meant a fresh draw is the classic JAX bug: two "random" things
# come out equal. This is also what makes the chapters reproducible: every draw they make comes from
# `SEED` through a chain of splits, so the same seed gives the same numbers.
#
# </details>

# %%
assert jnp.all(a == b) and not jnp.any(c == d) and not jnp.any(a == c)

# %% [markdown]
# Passing keys by hand through a model with dozens of layers would be tedious, so Flax NNX wraps them in
# `nnx.Rngs`: an object holding one key per named stream (`params` for initialisation, `dropout`, ...) that
# splits off a fresh key each time a layer asks. It is the counterpart of `torch.manual_seed` before building
# a model -- except that it is passed to the model explicitly, so two models built from `nnx.Rngs(SEED)` start
# equal whatever else ran before them:

# %%
rngs = nnx.Rngs(SEED)
first, second = rngs.params(), rngs.params()  # two different keys, split off the `params` stream
keys_differ = not bool(jnp.all(jax.random.key_data(first) == jax.random.key_data(second)))
twin_a, twin_b = MLP(4, 8, rngs=nnx.Rngs(SEED)), MLP(4, 8, rngs=nnx.Rngs(SEED))  # the course's MLP, section 3
same_start = jnp.array_equal(twin_a.fc1.kernel[...], twin_b.fc1.kernel[...])
print("two keys from one Rngs differ:", keys_differ, "| two MLPs built from nnx.Rngs(SEED) are equal:", bool(same_start))
assert keys_differ and same_start

# %% [markdown]
# ## 3. Modules and their parameters
#
# An `nnx.Module` is a Python class like `torch.nn.Module`: parameters are attributes created in `__init__`,
# the forward pass is `__call__` (PyTorch: `forward`). Two differences: the constructor takes `rngs` to
# initialise its parameters, and there is no `super().__init__()` to call. Here is the course's own MLP
# (`moe_course.layers.MLP`, the transformer MLP every expert of the course is made of) next to its PyTorch twin
# `moe_course.torch.layers.MLP` (both shortened a little):
#
# ```python
# # Flax NNX (moe_course/layers/mlp.py)             # PyTorch (moe_course/torch/layers/mlp.py)
# class MLP(nnx.Module):                            class MLP(torch.nn.Module):
#     def __init__(self, width, hidden, *, rngs):       def __init__(self, width, hidden):
#                                                           super().__init__()
#         self.fc1 = nnx.Linear(width, hidden, rngs=rngs)   self.fc1 = nn.Linear(width, hidden)
#         self.fc2 = nnx.Linear(hidden, width, rngs=rngs)   self.fc2 = nn.Linear(hidden, width)
#
#     def __call__(self, x):                            def forward(self, x):
#         return self.fc2(jax.nn.gelu(self.fc1(x)))         return self.fc2(F.gelu(self.fc1(x)))
# ```
#
# Calling it is the same in both: `mlp(x)`.

# %% [markdown]
# **Predict, then run.** `nn.Linear(4, 8).weight` has shape `(8, 4)` in PyTorch: (out, in). The next cell
# builds `MLP(width=4, hidden=8)` and prints the shape of its first layer's weight, `mlp.fc1.kernel`. Which
# shape do you expect, and how does the layer then compute `y` from `x`? Write your guess down before you run
# the next cell.

# %%
mlp = MLP(width=4, hidden=8, rngs=nnx.Rngs(SEED))
print("mlp.fc1.kernel:", mlp.fc1.kernel.shape, "| mlp.fc1.bias:", mlp.fc1.bias.shape)

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# The kernel is `(4, 8)`: **(in, out)**, the transpose of PyTorch's `(out, in)`. Flax computes
# `y = x @ kernel + bias`, PyTorch `y = x @ weight.T + bias`; the next cell checks the first against the layer's
# own output. Same maths, stored the other way round. That is why `moe_course.torch.convert` transposes every
# linear kernel when it copies a model between the two frameworks, and why chapter 1 reshapes the patch
# embedding's kernel `(p, p, C, D)` (PyTorch's `Conv2d` would hold `(D, C, p, p)`).
#
# </details>

# %%
inputs = jax.random.normal(jax.random.key(SEED + 1), (2, 4))  # (batch, width)
by_hand = inputs @ mlp.fc1.kernel[...] + mlp.fc1.bias[...]
print("largest difference, inputs @ kernel + bias vs mlp.fc1(inputs):",
      float(jnp.abs(by_hand - mlp.fc1(inputs)).max()))
assert mlp.fc1.kernel.shape == (4, 8) and jnp.allclose(by_hand, mlp.fc1(inputs), atol=1e-6)

# %% [markdown]
# `mlp.fc1.kernel` is not the array itself but an `nnx.Param`, a box that marks it as a trainable parameter
# (PyTorch's `nn.Parameter`). `kernel[...]` reads the array out of the box -- as `weight.data` or
# `weight.detach()` would in PyTorch -- and `kernel[...] = new_array` puts a new one in, as
# `with torch.no_grad(): weight.copy_(new)` would. All of a model's parameters, as one nested dictionary-like
# tree, are `nnx.state(model, nnx.Param)`, the counterpart of `model.state_dict()`:
#
# ```python
# # PyTorch
# sum(p.numel() for p in mlp.parameters())
# ```

# %%
def shapes(state):
    """{"fc1.kernel": (4, 8), ...}: the shape of each array of an nnx.State, by its path in the model."""
    return {".".join(map(str, path)): tuple(leaf.shape) for path, leaf in nnx.to_flat_state(state)}


params = nnx.state(mlp, nnx.Param)
print(shapes(params))
n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
print("parameters:", n_params)
assert n_params == (4 * 8 + 8) + (8 * 4 + 4)

# %% [markdown]
# ## 4. `jax.jit`: trace, then run compiled
#
# `jax.jit(f)` is the counterpart of `torch.compile(f)`: the first call traces `f` -- runs its Python once with
# placeholder arrays that have a shape and a dtype but no values -- and hands the recorded operations to the
# XLA compiler. (Where `torch.compile` cannot trace, it breaks the graph and runs that part as Python; `jax.jit`
# raises an error instead.)

# %% [markdown]
# **Predict, then run.** The function below prints a line each time its Python body runs. The cell calls the
# jitted version three times: twice on arrays of shape `(3,)`, then once on shape `(5,)`. How many lines does
# it print, and which? Write your guess down before you run the next cell.

# %%
traced_shapes = []


def scaled_sum(v):
    print("tracing scaled_sum for shape", v.shape)
    traced_shapes.append(v.shape)
    return 2.0 * jnp.sum(v)


fast_sum = jax.jit(scaled_sum)
results = [fast_sum(jnp.ones(3)), fast_sum(jnp.arange(3.0)), fast_sum(jnp.ones(5))]
print("results:", [float(r) for r in results])

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# Two "tracing" lines, not three: one for shape `(3,)` and one for `(5,)`. The second call had new *values* but
# the same shape and dtype, so it reused the compiled code and the `print` never ran -- yet its result is right,
# because the values flow through the compiled code. Later calls with the same shapes and dtypes run the compiled
# code without touching the Python, so Python side effects, like a `print`, happen only while tracing
# (`torch.compile` guards on shapes much the same way). Changing a shape means tracing and compiling again, which
# is why the course's training loops keep every batch the same shape. And since the Python body runs only while
# tracing, a Python `if` on an array's *value* cannot work inside `jit` (at trace time there is no value); the
# course's routing code uses `jnp.where` and sorting instead.
#
# </details>

# %%
assert traced_shapes == [(3,), (5,)]

# %% [markdown]
# **Static arguments.** Some arguments are not data but choices: how many experts each token picks (`k` in
# chapter 2), which of two orders of softmax and top-k, a flag. Tracing cannot give them a placeholder:
# `jax.lax.top_k(v, k)` returns `k` values, so the shape of its output -- which XLA must know to compile --
# depends on `k`'s value.
# Such an argument is marked *static*: `jax.jit(f, static_argnames="k")` (or `static_argnums=...`) hands the
# Python body the plain value. Chapter 2 compiles a router's gradient this way, with `k` and the order static.
#
# **`nnx.jit`.** `jax.jit` is made for functions of arrays; a model is an object that holds arrays. `nnx.jit` is
# `jax.jit` for functions of NNX modules: it splits each module argument into its structure (the `graphdef`) and
# its arrays, runs the function on a model put back together from them, and writes what the function changed in a
# module -- parameters, a counter, a random stream -- back into the module you passed. Chapters 4-7 compile a
# model's forward pass this way: `nnx.jit(lambda model, images: model(images))`.

# %% [markdown]
# **Predict, then run.** The function below returns, for each input, the `k` largest outputs of an MLP, and
# prints a line each time its Python body runs. The cell compiles it with `nnx.jit`, `k` static, and calls it
# four times: on `jit_mlp` with `k = 1`; on `jit_mlp` with `k = 1` again, after adding 1 to its output bias; on
# `jit_mlp` with `k = 2`; on a wider `MLP(width=4, hidden=16)` with `k = 1`. Which calls print a line? And does
# the second call use the new bias or the one it was compiled with? Write your guess down before you run the
# next cell.

# %%
jit_mlp = MLP(width=4, hidden=8, rngs=nnx.Rngs(SEED))
traced_calls = []  # (hidden width, k) each time the Python body runs


def largest_outputs(model, v, k):
    print(f"tracing largest_outputs: hidden width {model.fc1.kernel.shape[1]}, k = {k}")
    traced_calls.append((model.fc1.kernel.shape[1], k))
    return jax.lax.top_k(model(v), k)[0]  # (batch, k): the k largest of each input's outputs


fast_largest = nnx.jit(largest_outputs, static_argnames="k")
first_call = fast_largest(jit_mlp, inputs, k=1)
jit_mlp.fc2.bias[...] = jit_mlp.fc2.bias[...] + 1.0
after_bias = fast_largest(jit_mlp, inputs, k=1)
two_largest = fast_largest(jit_mlp, inputs, k=2)
wider = fast_largest(MLP(width=4, hidden=16, rngs=nnx.Rngs(SEED)), inputs, k=1)
print("k = 1, before and after the bias change:", np.round(first_call[:, 0], 3), np.round(after_bias[:, 0], 3))
print("output shapes:", first_call.shape, after_bias.shape, two_largest.shape, wider.shape)

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# Three lines: the first, third and fourth calls trace. The second call changed only a parameter's *values* --
# the bias is a traced array, its shape and the model's structure are the same -- so the compiled code ran
# again, and it read the new bias: every output is exactly 1 larger. The third call changed the static `k`, part
# of the key, so `jit` traced and compiled again (its output has a new shape, `(2, 2)`); the fourth changed the
# model's structure and shapes (hidden width 16). So parameters and inputs are data, while `k` and the model's
# structure are part of the program. Had `k` not been static, the first call would already fail: `top_k` would
# get a placeholder where it needs a number.
#
# The rule behind it: `jit` keeps the compiled code under a key made of the static values and the shapes and
# dtypes of the traced arguments, so a new static value means a new trace and a new compilation, as a new shape
# does; `nnx.jit` makes a module's `graphdef` static (part of the key) and its arrays traced. A static argument
# must be hashable (an int, a string, a tuple) and should take few values: a learning rate made static would
# compile anew for every rate, which is why `fit` in section 6 takes its learning rate as an ordinary, traced
# argument.
#
# </details>

# %%
assert traced_calls == [(8, 1), (8, 2), (16, 1)]
assert jnp.allclose(after_bias, first_call + 1.0, atol=1e-6) and two_largest.shape == (2, 2)

# %% [markdown]
# The write-back is what plain `jax.jit` lacks. With the Flax of this course a module is also a tree of arrays,
# so `jax.jit` accepts it, but it hands the function a copy: a change made inside is lost, without an error.
# `nnx.jit` carries it back out:

# %%
def add_one_to_bias(model):
    model.fc2.bias[...] = model.fc2.bias[...] + 1.0


probe = MLP(width=4, hidden=8, rngs=nnx.Rngs(SEED))  # a fresh MLP: its biases start at zero
jax.jit(add_one_to_bias)(probe)
after_jax_jit = float(probe.fc2.bias[0])
nnx.jit(add_one_to_bias)(probe)
print(f"fc2.bias[0] after jax.jit: {after_jax_jit}, after nnx.jit: {float(probe.fc2.bias[0])}")
assert after_jax_jit == 0.0 and float(probe.fc2.bias[0]) == 1.0

# %% [markdown]
# ## 5. Gradients are return values: `jax.grad`, `nnx.value_and_grad`
#
# PyTorch records operations as they run and `.backward()` writes gradients into each tensor's `.grad`
# (adding to what is there, hence `zero_grad()`). JAX transforms a function instead: `jax.grad(f)` is a new
# function that returns the gradient of `f` with respect to its first argument. Nothing is stored anywhere, so
# there is nothing to zero:
#
# ```python
# # PyTorch
# v = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
# (v ** 2).sum().backward()
# v.grad                    # tensor([2., 4., 6.])
# ```

# %%
v = jnp.array([1.0, 2.0, 3.0])
grad_of_square_sum = jax.grad(lambda w: jnp.sum(w**2))
print("gradient of sum(v^2) at v = [1, 2, 3]:", grad_of_square_sum(v))
assert jnp.allclose(grad_of_square_sum(v), 2 * v)

# %% [markdown]
# For a model, `nnx.value_and_grad(loss_fn)` takes the gradient with respect to the model's parameters: it
# returns the loss and a tree of gradients with exactly the structure of `nnx.state(model, nnx.Param)`, one
# gradient array per parameter. PyTorch's `loss.backward()` then `p.grad for p in model.parameters()`:

# %%
targets = jnp.zeros((2, 4))


def mse_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


loss, grads = nnx.value_and_grad(mse_loss)(mlp, inputs, targets)
print(f"loss {float(loss):.4f}; gradients:", shapes(grads))
assert jax.tree.structure(grads) == jax.tree.structure(params) and shapes(grads) == shapes(params)

# %% [markdown]
# ## 6. An optimizer step with optax
#
# `optax` holds the optimizers. An optax optimizer is a pair of pure functions: `init(params)` makes its state
# (Adam's moments, ...) and `update(grads, state, params)` returns the parameter updates and the new state; you
# add the updates to the parameters yourself (`optax.apply_updates`). `nnx.Optimizer` wraps this around a model
# so that a step reads like PyTorch's:
#
# ```python
# # PyTorch                                          # Flax NNX + optax
# opt = torch.optim.SGD(mlp.parameters(), lr=0.1)    optimizer = nnx.Optimizer(mlp, optax.sgd(0.1), wrt=nnx.Param)
# opt.zero_grad()                                    loss, grads = nnx.value_and_grad(mse_loss)(mlp, x, y)
# loss = mse_loss(mlp, x, y); loss.backward()
# opt.step()                                         optimizer.update(mlp, grads)
# ```

# %%
optimizer = nnx.Optimizer(mlp, optax.sgd(0.1), wrt=nnx.Param)
losses = []
for _ in range(5):
    loss, grads = nnx.value_and_grad(mse_loss)(mlp, inputs, targets)
    optimizer.update(mlp, grads)  # changes mlp's parameters, as opt.step() does
    losses.append(float(loss))
print("loss over 5 SGD steps:", np.round(losses, 4))
assert losses[-1] < losses[0]

# %% [markdown]
# The course's training loop (`moe_course.train.steps.make_train_step`) does the same thing in the functional
# form `jit` likes best: `nnx.split(model)` separates the model into its structure (a `graphdef`) and its
# arrays (a state), a pure function takes the arrays, computes `jax.value_and_grad`, calls optax's `update`, and
# returns new arrays; `nnx.merge` puts a model back together. Here is that pattern on the smallest model there
# is, a line `y = w x + b` (`nnx.Linear(1, 1)`) fitted to 32 noisy points by gradient descent. The whole fit --
# `STEPS` SGD steps -- is one jitted function (`jax.lax.scan` is a loop that `jit` compiles once, not once per
# step), and the learning rate is an *argument* of it, so a new learning rate reuses the compiled fit.

# %%
STEPS = 60
noise_key, init_key = jax.random.split(jax.random.key(SEED))  # one key per purpose, never one key twice
data_x = jnp.linspace(0.0, 2.0, 32)[:, None]  # (points, 1)
data_y = 1.5 * data_x - 0.5 + 0.1 * jax.random.normal(noise_key, data_x.shape)
line = nnx.Linear(1, 1, rngs=nnx.Rngs(init_key))
graphdef, line_params = nnx.split(line)
fit_traces = []  # one entry each time jit traces (and so compiles) `fit`


@jax.jit
def fit(params, learning_rate):
    """SGD on the mean squared error for STEPS steps: (fitted params, losses (STEPS,) before each step)."""
    fit_traces.append(STEPS)
    tx = optax.sgd(learning_rate)

    def loss_of(p):
        return jnp.mean((nnx.merge(graphdef, p)(data_x) - data_y) ** 2)

    def step(carry, _):
        p, opt_state = carry
        loss, grads = jax.value_and_grad(loss_of)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), loss

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), length=STEPS)
    return params, losses


rates = (0.01, 0.1, 0.6)
curves = {rate: fit(line_params, rate)[1] for rate in rates}
print("compiled versions of fit:", len(fit_traces), "for", len(rates), "learning rates")
fig, ax = plt.subplots(figsize=(6, 3.2))
for rate, curve in curves.items():
    ax.semilogy(np.arange(STEPS), curve, label=f"learning rate {rate}")
ax.set_xlabel("SGD step")
ax.set_ylabel("mean squared error (log scale)")
ax.set_title(f"Fitting a line: {STEPS} SGD steps, seed {SEED}")
ax.legend()
plt.show()
assert len(fit_traces) == 1
assert curves[0.1][-1] < curves[0.01][-1] < curves[0.01][0]  # both learn; the larger rate faster
assert curves[0.6][-1] > curves[0.6][0]  # too large: the loss grows

# %% [markdown]
# **Explain the plot.** Two curves go down, at different speeds, and one goes up. Why does a *larger*
# learning rate first help and then make the fit blow up?
#
# <details><summary>Answer</summary>
#
# Each SGD step moves the parameters by `learning_rate x gradient`. On this quadratic loss the gradient grows with
# the distance from the best line, so a small rate crawls towards it and a larger one gets there in fewer steps.
# But past a threshold a step overshoots the minimum by more than it started from, the next step overshoots
# further the other way, and the loss grows geometrically: the straight rising line on the log scale. Real
# training has the same cliff, which is why the course's recipes warm the learning rate up instead of starting at
# its peak.
#
# </details>

# %% [markdown]
# **Explore.** Move the slider: it sets the learning rate of the same jitted fit (logarithmic, 0.001 to 1) and
# redraws the loss curve and the fitted line. Find the largest learning rate at which the loss still goes down,
# and look at what the fitted line does just above it.
#
# <details><summary>What to look for</summary>
#
# At the smallest rates the loss curve is almost flat: the line has barely moved from where it started. From
# about 0.1 the line runs through the points within its steps. Between 0.4 and 0.5 (the slider's 0.398 and
# 0.501) the loss stops going down, and above that the line ends up far off the plot: each step overshoots the
# best line by more than the last, from one side to the other. The title counts the compiled versions of
# `fit`: it stays at 1, because the learning rate is an argument (a traced value) and no shape changes.
#
# </details>

# %%
def fit_figure(learning_rate):
    fitted, curve = fit(line_params, learning_rate)
    curve, fitted_y = np.asarray(curve), np.asarray(nnx.merge(graphdef, fitted)(data_x)[:, 0])
    finite = np.isfinite(curve)  # a fit that blows up overflows float32 after enough steps: draw what is finite
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.semilogy(np.arange(STEPS)[finite], curve[finite])
    left.set_xlabel("SGD step")
    left.set_ylabel("mean squared error (log scale)")
    right.scatter(data_x[:, 0], data_y[:, 0], s=10, label="data")
    if np.all(np.isfinite(fitted_y)):
        right.plot(data_x[:, 0], fitted_y, color="C3", label=f"line after {STEPS} steps")
    else:
        right.set_title("the line overflowed float32: no line to draw")
    right.set_ylim(-1.5, 3.5)
    right.set_xlabel("x")
    right.legend(loc="upper left")
    fig.suptitle(f"learning rate {learning_rate:.3g}; compiled versions of fit: {len(fit_traces)}")
    plt.close(fig)  # shown through the display handle below, not by the inline backend
    return fig


slider = widgets.FloatLogSlider(value=0.1, base=10, min=-3, max=0, step=0.1, description="lr",
                                continuous_update=False)
display(slider)
figure_handle = display(fit_figure(slider.value), display_id=True)
slider.observe(lambda change: figure_handle.update(fit_figure(change["new"])), names="value")

# %% [markdown]
# **Change one thing.** In the cell that defines `fit`, set `STEPS = 60` to `STEPS = 240`, re-run that cell and
# the slider cell, and move the slider again. Which learning rates now reach a good fit, and does the largest
# learning rate that still converges move? Set it back to `STEPS = 60` afterwards.
#
# <details><summary>Answer</summary>
#
# With four times the steps the small learning rates (around 0.01-0.03) end much closer to the line: they were
# slow, not wrong. The threshold above which the loss grows does not move: it is 2 divided by the loss's steepest
# curvature, whatever the number of steps -- more steps only make the blow-up larger (large enough to overflow
# float32, and the figure then says so). Re-running the cell makes a new `fit`, compiled once for the new length.
#
# </details>

# %% [markdown]
# ## Summary
#
# - You can read JAX arrays as NumPy arrays that never change in place (`x.at[i].set(v)` returns a new one).
# - You can make random draws reproducible with keys (`jax.random.key`, `split`) and build a model from
#   `nnx.Rngs(seed)`, where PyTorch would call `torch.manual_seed`.
# - You can write an `nnx.Module`, read and write its parameters with `param[...]` (kernels are (in, out), the
#   transpose of PyTorch's weights) and list them with `nnx.state(model, nnx.Param)`.
# - You can say what `jax.jit` runs once per shape (the Python body) and what it runs every call (the compiled
#   code), mark an argument static (a new value compiles anew), compile functions of modules with `nnx.jit`, and
#   take gradients as return values with `jax.grad` and `nnx.value_and_grad`.
# - You can write an optax training step, both with `nnx.Optimizer` and in the split/merge form the course's
#   training loop uses, and you have seen a learning rate too large to converge.

# %% [markdown]
# ## Exercises
#
# This primer has no exercise notebook in `exercises/` (there is nothing to grade about the tools); check
# yourself with these, in a new cell at the end of this notebook.
#
# 1. A PyTorch `nn.Linear(3, 2)` holds `weight = jnp.arange(6.0).reshape(2, 3)` (out, in) and `bias = 0`. Put
#    these weights into `layer = nnx.Linear(3, 2, rngs=nnx.Rngs(SEED))` with `[...]` and check that
#    `layer(x)` equals `x @ weight.T` for a few inputs `x` of shape `(batch, 3)`.
#    <details><summary>Answer</summary>
#
#    `layer.kernel[...] = weight.T` (the kernel is (in, out): transpose) and `layer.bias[...] = jnp.zeros(2)`;
#    then `jnp.allclose(layer(x), x @ weight.T)` holds. Assigning `weight` itself fails: its shape (2, 3) is not
#    the kernel's (3, 2) -- the mistake `moe_course.torch.convert` exists to avoid.
#
#    </details>
# 2. Set a fresh MLP's `fc2.bias` to ones with `[...]` and check that the output moved by exactly one.
#    <details><summary>Answer</summary>
#
#    `before = mlp(inputs); mlp.fc2.bias[...] = jnp.ones(4); mlp(inputs) - before` is all ones, up to rounding,
#    if the bias was zero before -- which it is for a fresh `nnx.Linear` (PyTorch initialises biases randomly).
#
#    </details>
# 3. Write `jax.grad` of `f(w) = jnp.sum(jnp.sin(w))` and compare it with `jnp.cos(w)`; then put `jax.jit`
#    around the gradient function and check it gives the same numbers.
#    <details><summary>Answer</summary>
#
#    `jnp.allclose(jax.grad(f)(w), jnp.cos(w))` and `jnp.allclose(jax.jit(jax.grad(f))(w), jnp.cos(w))` both
#    hold: transformations compose, so a jitted gradient is the gradient, compiled.
#
#    </details>
# 4. Replace `optax.sgd` in `fit` by `optax.adam` and move the slider again: where does the loss now blow up?
#    <details><summary>Answer</summary>
#
#    Nowhere on the slider: Adam divides each step by a running estimate of the gradient's size, so its steps
#    are about `learning_rate` long whatever the curvature, and it gets past the SGD threshold without blowing
#    up; at the largest rates it ends a little above the best fit, still jittering around it. The course trains
#    with AdamW (Adam with decoupled weight decay).
#
#    </details>

# %% [markdown]
# ## References
#
# - JAX documentation: [quickstart](https://docs.jax.dev/en/latest/quickstart.html),
#   [pseudorandom numbers](https://docs.jax.dev/en/latest/random-numbers.html) (keys and splitting),
#   [just-in-time compilation](https://docs.jax.dev/en/latest/jit-compilation.html) (tracing, shapes) and
#   [automatic differentiation](https://docs.jax.dev/en/latest/automatic-differentiation.html).
# - Flax NNX: [NNX basics](https://flax.readthedocs.io/en/latest/nnx_basics.html) (modules, variables,
#   `nnx.split`/`merge`, `nnx.Optimizer`), [randomness](https://flax.readthedocs.io/en/latest/guides/randomness.html)
#   (`nnx.Rngs` and its streams) and
#   [converting PyTorch models to Flax](https://flax.readthedocs.io/en/stable/migrating/convert_pytorch_to_flax.html)
#   (the transposed kernels of section 3).
# - optax: [documentation](https://optax.readthedocs.io/) (gradient transformations, `init`/`update`).
# - Adam: Kingma and Ba (2015), [arXiv:1412.6980](https://arxiv.org/abs/1412.6980), Algorithm 1 (exercise 4).
# - Transformers, the level this course assumes: d2l's
#   [attention and transformers chapter](https://d2l.ai/chapter_attention-mechanisms-and-transformers/index.html)
#   and the UvA deep-learning course's
#   [tutorial 6](https://uvadlc-notebooks.readthedocs.io/en/latest/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.html);
#   the UvA course also has a [JAX introduction](https://uvadlc-notebooks.readthedocs.io/en/latest/tutorial_notebooks/JAX/tutorial2/Introduction_to_JAX.html).
# - The PyTorch twins of every layer: `moe_course.torch` (*Using the layers from PyTorch*, `docs/pytorch.md`).
#   Next: chapter 1, the Vision Transformer (Dosovitskiy et al. 2021,
#   [arXiv:2010.11929](https://arxiv.org/abs/2010.11929)).
