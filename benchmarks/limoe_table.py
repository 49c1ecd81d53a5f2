"""LIMoE at toy scale: the seed tables of the Fig. 3 / Fig. 5 / Figs. 9-10 runs (docs/results.md, benchmarks/README.md).

Reads the runs ``limoe_sweep.py --out FILE`` recorded (default: moe_course/results/limoe.jsonl, the runs behind
the course's tables) and prints one markdown table per configuration ("variant": the options that differ from
the presets and the recipe), the columns ``moe_course.analysis.limoe_runs.limoe_seed_table`` describes; the runs that
set ``--text-soft-min`` (the Figs. 9-10 sweep: 32 experts, 4x4 patches) in one ``soft_minimum_table`` instead.

Usage: python benchmarks/limoe_table.py [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.limoe_runs import in_threshold_sweep, limoe_seed_table, soft_minimum_table
from moe_course.analysis.sweeps import RESULTS, read_runs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[str(RESULTS / "limoe.jsonl")])
    args = p.parse_args(argv)
    runs = [run for path in args.files for run in read_runs(path)]
    for variant in sorted({run["variant"] for run in runs if not in_threshold_sweep(run)},
                          key=lambda v: (v != "", v)):
        print(f"\n{variant or 'the recipes (digits-limoe presets)'}:\n")
        print(limoe_seed_table(runs, variant))
    if any(map(in_threshold_sweep, runs)):
        print("\nthe text threshold's soft minimum S = e^tau_text (32 experts, 4x4 patches):\n")
        print(soft_minimum_table(runs))


if __name__ == "__main__":
    main()
