"""The pictures the course draws (matplotlib). Every function returns its Figure."""

from moe_course.viz.all_to_all import show_all_to_all
from moe_course.viz.buffers import show_buffers, show_dispatch_combine
from moe_course.viz.curves import plot_history
from moe_course.viz.images import show_images, show_patch_values
from moe_course.viz.routing import show_dropped_patches, show_expert_class_heatmaps
from moe_course.viz.slots import show_slot_weights

__all__ = ["plot_history", "show_all_to_all", "show_buffers", "show_dispatch_combine", "show_dropped_patches",
           "show_expert_class_heatmaps", "show_images", "show_patch_values", "show_slot_weights"]
