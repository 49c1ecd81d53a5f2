"""Where experts pay: the seed tables of the digit-glyphs runs (README and benchmarks/README.md).

Reads the runs ``glyphs_sweep.py --out FILE`` recorded (default: benchmarks/results/glyphs.jsonl, the runs behind
the course's tables) and prints one markdown table per configuration ("variant": the options that differ from
the glyphs-tiny presets and recipes; the recipes first): per model, forward MFLOPs per image, parameters, test
accuracy (mean, standard deviation over seeds, range) and train loss (mean), and the seeds.

Usage: python benchmarks/glyphs_table.py [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.sweeps import RESULTS, read_runs, seed_table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[str(RESULTS / "glyphs.jsonl")])
    runs = [run for path in p.parse_args(argv).files for run in read_runs(path)]
    variants = sorted({run["variant"] for run in runs}, key=lambda v: (v != "", v))
    for variant in variants:
        print(f"\n{variant or 'the recipes (glyphs-tiny presets)'}:\n")
        print(seed_table(runs, variant))


if __name__ == "__main__":
    main()
