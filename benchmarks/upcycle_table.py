"""Sparse upcycling at equal extra compute: the seed tables of the runs benchmarks/upcycle_sweep.py recorded.

Reads FILE (default: moe_course/results/upcycling.jsonl, the runs behind chapter 8 and docs/results.md) and prints,
per configuration ("variant": the options that differ from the sweep's defaults; the defaults first), one markdown
row per arm -- dense start, dense continued, upcycled V-MoE, V-MoE from scratch: forward MFLOPs per image,
parameters, test accuracy (mean ± std, range), train loss, seeds -- and each V-MoE arm minus the dense continued
one, seed by seed.

Usage: python benchmarks/upcycle_table.py [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.sweeps import RESULTS, read_runs
from moe_course.analysis.upcycling import upcycling_table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[str(RESULTS / "upcycling.jsonl")])
    runs = [run for path in p.parse_args(argv).files for run in read_runs(path)]
    for variant in sorted({run["variant"] for run in runs}, key=lambda v: (v != "", v)):
        print(f"\n{variant or 'the defaults'}:\n")
        print(upcycling_table(runs, variant))


if __name__ == "__main__":
    main()
