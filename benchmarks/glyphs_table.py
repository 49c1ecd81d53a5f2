"""Where experts pay: the seed tables of the digit-glyphs runs (docs/results.md and benchmarks/README.md).

Reads the runs ``glyphs_sweep.py --out FILE`` recorded (default: moe_course/results/glyphs.jsonl, the runs behind
the course's tables) and prints one markdown table per configuration ("variant": the options that differ from
the glyphs-tiny presets and recipes; the recipes first): per model, forward MFLOPs per image, parameters, test
accuracy (mean, standard deviation over seeds, range) and train loss (mean), and the seeds; under each table, every
MoE minus the dense model seed by seed (the headline of README: mean ± std, range, seeds won).

Usage: python benchmarks/glyphs_table.py [--summary] [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.sweeps import KIND_NAMES, RESULTS, read_runs, seed_lead, seed_spread, seed_table


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
        print("\n".join(lead_lines(runs, variant)))


def lead_lines(runs: list[dict], variant: str) -> list[str]:
    """One line per MoE kind of ``variant`` that shares seeds with its dense model: test accuracy minus dense's,
    per seed and over the seeds (``seed_lead``)."""
    kinds = {run["kind"] for run in runs if run["variant"] == variant}
    lines = []
    for kind in (k for k in KIND_NAMES if k != "dense" and k in kinds and "dense" in kinds):
        try:
            lead = seed_lead(runs, kind, variant=variant)
        except ValueError:  # no seed in common
            continue
        per_seed = ", ".join(f"{seed}: {gap:+.3f}" for seed, gap in lead.per_seed.items())
        lines.append(f"- {KIND_NAMES[kind]} minus dense: {lead} (per seed {per_seed})")
    return [""] + lines if lines else []


if __name__ == "__main__":
    main()
