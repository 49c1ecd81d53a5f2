"""Where experts pay: the seed tables of the digit-glyphs runs (README and benchmarks/README.md).

Reads the runs ``glyphs_sweep.py --out FILE`` recorded (default: benchmarks/results/glyphs.jsonl, the runs behind
the course's tables) and prints one markdown table per configuration ("variant": the options that differ from
the glyphs-tiny presets and recipes; the recipes first): per model, forward MFLOPs per image, parameters, test
accuracy (mean, standard deviation over seeds, range) and train loss (mean), and the seeds.

Usage: python benchmarks/glyphs_table.py [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.sweeps import RESULTS, read_runs, seed_spread

NAMES = {"dense": "dense ViT", "tc": "Tokens Choice (BPR)", "ec": "Experts Choice", "soft": "Soft MoE"}


def table(runs: list[dict], variant: str = "") -> str:
    """The markdown table of ``variant``'s runs (one row per model kind)."""
    accuracy, loss = seed_spread(runs, "test_accuracy", variant), seed_spread(runs, "train_loss", variant)
    first = {run["kind"]: run for run in runs if run["variant"] == variant}
    lines = ["| model | forward MFLOPs | parameters | test accuracy: mean ± std (range) | train loss | seeds |",
             "| --- | --- | --- | --- | --- | --- |"]
    for kind, spread in sorted(accuracy.items(), key=lambda item: list(NAMES).index(item[0])):
        lines.append(f"| {NAMES.get(kind, kind)} | {first[kind]['flops'] / 1e6:.2f} | {first[kind]['params'] / 1e3:.0f}k "
                     f"| {spread.mean:.3f} ± {spread.std:.3f} ({spread.low:.3f}-{spread.high:.3f}) "
                     f"| {loss[kind].mean:.3f} | {', '.join(map(str, spread.seeds))} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[str(RESULTS / "glyphs.jsonl")])
    runs = [run for path in p.parse_args(argv).files for run in read_runs(path)]
    variants = sorted({run["variant"] for run in runs}, key=lambda v: (v != "", v))
    for variant in variants:
        print(f"\n{variant or 'the recipes (glyphs-tiny presets)'}:\n")
        print(table(runs, variant))


if __name__ == "__main__":
    main()
