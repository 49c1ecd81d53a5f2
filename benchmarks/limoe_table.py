"""LIMoE at toy scale: the seed tables of the Fig. 3 / Fig. 5 / Figs. 9-10 runs (docs/results.md, benchmarks/README.md).

Reads the runs ``limoe_sweep.py --out FILE`` recorded (default: moe_course/results/limoe.jsonl, the runs behind
the course's tables) and prints one markdown table per configuration ("variant": the options that differ from
the presets and the recipe): per model, forward MFLOPs per pair, zero-shot accuracy (mean ± std over seeds,
range), retrieval recall@1 both ways (means), and per MoE layer the text success rate (mean, lowest seed), the
busiest expert's share of text (mean, highest seed), the experts that take 90% of text (per seed), the worst
loss spike (the largest single-step loss of a logging window over the previous window's mean loss, the worst
over training; mean over seeds; about 1 when training is smooth) and the seeds.

Usage: python benchmarks/limoe_table.py [FILE ...]
"""

from __future__ import annotations

import argparse

from moe_course.analysis.sweeps import RESULTS, read_runs, seed_spread

KIND_NAMES = {"classic": "classic (joint importance + load)", "local": "+ local entropy on text",
              "paper": "+ global entropy (the paper's 5 terms)", "dense": "dense one tower"}


def flattened(run: dict) -> dict:
    """A run with its test routing numbers and its worst loss spike as top-level metrics (for ``seed_spread``)."""
    curves = run["curves"]
    previous_means = [mean for _, mean in curves["loss"][:-1]]
    spike = max(top / mean for (_, top), mean in zip(curves["loss_max"][1:], previous_means))
    return {**run, **run["routing"], "loss_spike": spike}


def seed_table(runs: list[dict], variant: str = "") -> str:
    """A markdown table of ``variant``'s runs, one row per model (the Fig. 3 ladder, then the dense model)."""
    runs = [flattened(run) for run in runs if run["variant"] == variant]
    zero_shot = seed_spread(runs, "test_zero_shot", variant)
    mean = lambda metric, kind: seed_spread(runs, metric, variant)[kind]
    first = {run["kind"]: run for run in runs}
    lines = ["| model | MFLOPs | zero-shot: mean ± std (range) | R@1 image->text / text->image | text success, "
             "layer 0 / 1: mean (lowest) | busiest expert's share of text, layer 0 / 1: mean (highest) | experts "
             "for 90% of text, layer 0 / 1 | worst loss spike | seeds |", "| --- " * 9 + "|"]
    for kind in sorted(zero_shot, key=lambda k: list(KIND_NAMES).index(k) if k in KIND_NAMES else 9):
        spread, routed = zero_shot[kind], first[kind]["routing"]
        cells = [KIND_NAMES.get(kind, kind), f"{first[kind]['flops'] / 1e6:.2f}",
                 f"{spread.mean:.3f} ± {spread.std:.3f} ({spread.low:.3f}-{spread.high:.3f})",
                 f"{mean('test_i2t_recall@1', kind).mean:.3f} / {mean('test_t2i_recall@1', kind).mean:.3f}"]
        if routed:
            layers = (0, 1)
            success = [mean(f"success/text/layer{i}", kind) for i in layers]
            busiest = [mean(f"busiest/text/layer{i}", kind) for i in layers]
            experts = [[run["routing"][f"experts90/text/layer{i}"] for run in runs if run["kind"] == kind]
                       for i in layers]
            cells += [" / ".join(f"{s.mean:.3f} ({s.low:.3f})" for s in success),
                      " / ".join(f"{b.mean:.3f} ({b.high:.3f})" for b in busiest),
                      " / ".join(",".join(map(str, e)) for e in experts)]
        else:
            cells += ["--", "--", "--"]
        cells += [f"{mean('loss_spike', kind).mean:.2f}", ", ".join(map(str, spread.seeds))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[str(RESULTS / "limoe.jsonl")])
    args = p.parse_args(argv)
    runs = [run for path in args.files for run in read_runs(path)]
    for variant in sorted({run["variant"] for run in runs}, key=lambda v: (v != "", v)):
        print(f"\n{variant or 'the recipes (digits-limoe presets)'}:\n")
        print(seed_table(runs, variant))


if __name__ == "__main__":
    main()
