"""Datasets: the embedded cluttered digits (with captions for image-text models) and real loaders for full-scale
data, all in one batch format."""

from moe_course.data.base import DataError, ImageDataset, eval_batches, steps_per_epoch, train_batches
from moe_course.data.captioned import CaptionedDigits
from moe_course.data.cifar import Cifar
from moe_course.data.digits import ClutteredDigits, DigitsConfig, patches_on_box
from moe_course.data.folders import ImageFolder
from moe_course.data.registry import DATASETS, load_dataset
from moe_course.data.tokenizer import PAD_ID, SubwordTokenizer

__all__ = [
    "CaptionedDigits",
    "DATASETS",
    "PAD_ID",
    "Cifar",
    "ClutteredDigits",
    "DataError",
    "DigitsConfig",
    "ImageDataset",
    "ImageFolder",
    "eval_batches",
    "load_dataset",
    "SubwordTokenizer",
    "patches_on_box",
    "steps_per_epoch",
    "train_batches",
]
