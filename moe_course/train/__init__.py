"""One training and evaluation loop for every model of the course."""

from moe_course.train.config import TrainConfig
from moe_course.train.evaluate import evaluate
from moe_course.train.loop import TrainingDiverged, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "TrainingDiverged", "evaluate", "train"]
