"""Command-line sizes shared by the benchmark scripts: a default run and a tiny ``--quick`` smoke test."""

from __future__ import annotations

import argparse


class SizedParser(argparse.ArgumentParser):
    """An ArgumentParser with ``--quick``; ``size(name)`` documents an option's two defaults, and ``parse_args``
    fills every size option left unset from ``defaults`` or, with --quick, from ``quick``."""

    def __init__(self, description: str, defaults: dict, quick: dict):
        super().__init__(description=description)
        self.defaults_by_size, self.quick_sizes = defaults, quick
        self.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")

    def size(self, name: str) -> str:
        return f"(default {self.defaults_by_size[name]}; --quick: {self.quick_sizes[name]})"

    def parse_args(self, *args, **kwargs):
        parsed = super().parse_args(*args, **kwargs)
        for name, value in (self.quick_sizes if parsed.quick else self.defaults_by_size).items():
            if getattr(parsed, name) is None:
                setattr(parsed, name, value)
        return parsed
