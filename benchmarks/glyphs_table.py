"""Where experts pay: the seed tables of the digit-glyphs runs (docs/results.md and benchmarks/README.md).

Reads the runs ``glyphs_sweep.py --out FILE`` recorded (default: moe_course/results/glyphs.jsonl, the runs behind
the course's tables) and prints one markdown table per configuration ("variant": the options that differ from
the glyphs-tiny presets and recipes; the recipes first): per model, forward MFLOPs per image, parameters, test
accuracy (mean, standard deviation over seeds, range) and train loss (mean), and the seeds.

Usage: python benchmarks/glyphs_table.py [--summary] [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.sweeps import KIND_NAMES, RESULTS, read_runs, seed_spread, seed_table


def summary(runs: list[dict], variants: list[str]) -> str:
    """One markdown row per variant: each model's mean test accuracy and its number of seeds."""
    lines = ["| configuration | " + " | ".join(KIND_NAMES.values()) + " |", "| --- |" + " --- |" * len(KIND_NAMES)]
    for variant in variants:
        spread = seed_spread(runs, "test_accuracy", variant)
        cells = [f"{spread[kind].mean:.3f} ({len(spread[kind].seeds)})" if kind in spread else ""
                 for kind in KIND_NAMES]
        lines.append(f"| {variant or 'the recipes'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[str(RESULTS / "glyphs.jsonl")])
    p.add_argument("--summary", action="store_true", help="one row per configuration: mean test accuracy (seeds)")
    args = p.parse_args(argv)
    runs = [run for path in args.files for run in read_runs(path)]
    variants = sorted({run["variant"] for run in runs}, key=lambda v: (v != "", v))
    if args.summary:
        print(summary(runs, variants))
        return
    for variant in variants:
        print(f"\n{variant or 'the recipes (glyphs-tiny presets)'}:\n")
        print(seed_table(runs, variant))


if __name__ == "__main__":
    main()
