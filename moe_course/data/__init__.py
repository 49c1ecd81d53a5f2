"""Datasets: the embedded cluttered digits and real loaders for full-scale data, all in one batch format."""

from moe_course.data.base import DataError, ImageDataset, eval_batches, steps_per_epoch, train_batches
from moe_course.data.cifar import Cifar
from moe_course.data.digits import ClutteredDigits, DigitsConfig, patches_on_box
from moe_course.data.folders import ImageFolder
from moe_course.data.registry import DATASETS, load_dataset

__all__ = [
    "DATASETS",
    "Cifar",
    "ClutteredDigits",
    "DataError",
    "DigitsConfig",
    "ImageDataset",
    "ImageFolder",
    "eval_batches",
    "load_dataset",
    "patches_on_box",
    "steps_per_epoch",
    "train_batches",
]
