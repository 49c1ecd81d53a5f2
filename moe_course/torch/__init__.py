"""PyTorch twins of the course's routing functions, layers and models, and weight converters.

- ``moe_course.torch.routing``: the routing pure functions, one to one with ``moe_course.routing``.
- ``moe_course.torch.layers``: ``torch.nn.Module`` twins of the layers (sparse MoE, Soft MoE, MoD block, ...).
- ``moe_course.torch.models``: ViT, V-MoE, Soft MoE ViT and MoD ViT, built from the same configs.
- ``moe_course.torch.convert``: weights between the Flax NNX models and these, both ways (``to_torch``,
  ``from_torch``); ``moe_course.torch.convert_vit``: Hugging Face transformers' ViT <-> our ViT.
- ``moe_course.torch.evaluate``: test accuracy of a PyTorch twin, batch for batch as the JAX ``evaluate``.

Equal to the JAX originals: routing decisions exactly, outputs and aux losses to 1e-5, gradients to 1e-4
(``tests/test_torch_*.py``). Nothing here imports torch (or transformers) when the package itself is
imported, so ``import moe_course.torch`` works without them; the submodules above need
``pip install 'moe-course[torch]'`` (``convert`` and ``convert_vit`` only for the functions that touch torch).
"""
