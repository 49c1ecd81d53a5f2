"""The pictures the course draws (matplotlib). Every function returns its Figure."""

from moe_course.viz.curves import plot_history
from moe_course.viz.images import show_images, show_patch_values

__all__ = ["plot_history", "show_images", "show_patch_values"]
