"""The reference models' released checkpoints in the course's models: big_vision ViTs (``.npz``) and vmoe
V-MoEs (vmoe's own sharded msgpack format), mapped parameter by parameter, position embeddings resized for
another image size, routing settings carried over. On to PyTorch with ``moe_course.torch.convert.to_torch``."""

from moe_course.reference.big_vision import read_npz, vit_config_from_big_vision, vit_from_big_vision
from moe_course.reference.names import resize_position_embeddings
from moe_course.reference.vmoe import model_params, vmoe_config_from_checkpoint, vmoe_from_checkpoint
from moe_course.reference.vmoe_format import read_vmoe_checkpoint

__all__ = ["model_params", "read_npz", "read_vmoe_checkpoint", "resize_position_embeddings",
           "vit_config_from_big_vision", "vit_from_big_vision", "vmoe_config_from_checkpoint",
           "vmoe_from_checkpoint"]
