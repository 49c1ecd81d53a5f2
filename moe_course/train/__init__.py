"""One training and evaluation loop for every model of the course."""

from moe_course.train.concurrent import evaluate_routings, side_by_side, train_side_by_side
from moe_course.train.config import TrainConfig
from moe_course.train.devices import PaperScaleOnCPUWarning, report_devices
from moe_course.train.evaluate import evaluate
from moe_course.train.loop import TrainingDiverged, TrainResult, train

__all__ = ["PaperScaleOnCPUWarning", "TrainConfig", "TrainResult", "TrainingDiverged", "evaluate", "evaluate_routings",
           "report_devices", "side_by_side", "train", "train_side_by_side"]
