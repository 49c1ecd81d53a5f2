"""PyTorch twins of the course models and weight converters to and from them.

Nothing here imports torch (or transformers) when the package is imported, so ``import moe_course.torch``
works without them; import a submodule, e.g. ``moe_course.torch.convert_vit``, for the converters. Those
need ``pip install 'moe-course[torch]'`` only for the functions that touch torch tensors or transformers.
"""
