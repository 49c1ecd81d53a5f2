"""Seed tables and curves of recorded LIMoE runs: the Fig. 3 / Fig. 5 / Figs. 9-10 sweeps of chapter 4,
docs/results.md and benchmarks/README.md.

A run is one JSON line as ``benchmarks/limoe_sweep.py --out FILE`` writes it (the course's runs:
``RESULTS / "limoe.jsonl"``): ``kind`` (classic, local, paper, dense), ``variant`` (the options that differ from
the presets and the recipe), ``seed``, ``test_zero_shot``, retrieval recalls, ``routing`` (per modality and MoE
layer on the test pairs: ``success/<m>/layer<i>``, ``busiest/...``, ``experts90/...``, ``shares/...``) and
``curves`` (``[step, value]`` lists over training).
"""

from __future__ import annotations

import math

from moe_course.analysis.sweeps import seed_spread

KIND_NAMES = {"classic": "classic (joint importance + load)", "local": "+ local entropy on text",
              "paper": "+ global entropy (the paper's 5 terms)", "dense": "dense one tower"}


def flattened(run: dict) -> dict:
    """``run`` with its test routing numbers and its worst loss spike as top-level metrics (for ``seed_spread``).
    The loss spike is the largest single-step loss of a logging window over the previous window's mean loss, the
    worst over training (about 1 when training is smooth)."""
    curves = run["curves"]
    previous_means = [mean for _, mean in curves["loss"][:-1]]
    spike = max(top / mean for (_, top), mean in zip(curves["loss_max"][1:], previous_means))
    return {**run, **run["routing"], "loss_spike": spike}


def limoe_seed_table(runs: list[dict], variant: str = "", *, include_dense: bool = True) -> str:
    """A markdown table of ``variant``'s runs ("" = the recipes), one row per model (the Fig. 3 ladder, then the
    dense model unless ``include_dense`` is False -- chapter 4 shows the ladder before it asks for the forecast
    against the dense model, and the dense rows after): forward MFLOPs per pair, zero-shot accuracy (mean ± std over seeds, range), retrieval recall@1
    both ways (means), per MoE layer the text success rate (mean, lowest seed), the busiest expert's share of text
    (mean, highest seed), the experts that take 90% of text (per seed), the worst loss spike (mean) and the
    seeds. Raises ValueError as ``seed_spread`` does (a seed recorded twice, a non-finite number)."""
    runs = [flattened(run) for run in runs if run["variant"] == variant and (include_dense or run["kind"] != "dense")]
    zero_shot = seed_spread(runs, "test_zero_shot", variant)
    mean = lambda metric, kind: seed_spread([run for run in runs if run["kind"] == kind], metric, variant)[kind]
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


def soft_minimum(run: dict) -> float:
    """The text threshold of a run as the paper's soft minimum S = e^tau_text (LIMoE App. B.2), rounded to 0.1;
    S = 1 is tau = 0, where the text global entropy loss is always 0."""
    return round(math.exp(run["config"]["text_tau"]), 1)


def in_threshold_sweep(run: dict) -> bool:
    """Whether ``run`` belongs to the Figs. 9-10 sweep: the five terms (``paper``) with ``--text-soft-min`` set."""
    return run["kind"] == "paper" and run.get("options", {}).get("text_soft_min") is not None


def effective_experts(shares: list[float]) -> float:
    """e^H of a modality's first-choice shares over the experts (normalised to sum 1): the number of experts an
    even split with the same entropy would use -- the hard counterpart of the soft minimum S = e^tau. ValueError
    when every share is zero."""
    total = sum(shares)
    if total <= 0:
        raise ValueError(f"shares sum to {total}: no token was routed")
    return math.exp(-sum(x / total * math.log(x / total) for x in shares if x > 0))


def soft_minimum_table(runs: list[dict], experts: int = 32, patch_size: int = 4) -> str:
    """A markdown table of the Figs. 9-10 sweep: the ``paper`` runs with ``experts`` experts and ``patch_size``
    patches that set ``--text-soft-min``, one row per soft minimum S = e^tau_text (ascending): per MoE layer the
    experts taking 90% of text (mean, then each seed's count), the effective number of text experts
    (``effective_experts``, mean), the experts taking 90% of images (mean), the text success rate (mean),
    zero-shot accuracy (mean ± std) and the seeds. Raises ValueError when no run matches, or as ``seed_spread``
    does (a seed recorded twice for one S, a non-finite number)."""
    swept = [run for run in runs if in_threshold_sweep(run) and run["config"]["num_experts"] == experts
             and run["config"]["patch_size"] == patch_size]
    if not swept:
        raise ValueError(f"no paper run with --text-soft-min, experts={experts} and patch_size={patch_size} "
                         f"among {len(runs)} runs")
    by_s: dict[float, list[dict]] = {}
    for run in swept:
        effective = {f"effective/text/layer{i}": effective_experts(run["routing"][f"shares/text/layer{i}"])
                     for i in (0, 1)}
        by_s.setdefault(soft_minimum(run), []).append({**flattened(run), **effective, "variant": ""})
    lines = ["| S = e^tau_text | experts for 90% of text, layer 0 / 1: mean (per seed) | e^H of text's first "
             "choices, layer 0 / 1: mean | experts for 90% of images, layer 0 / 1: mean | text success, layer 0 / 1: "
             "mean | zero-shot: mean ± std | seeds |", "| --- " * 7 + "|"]
    for s, group in sorted(by_s.items()):
        spread = lambda metric: seed_spread(group, metric)["paper"]
        per_seed = lambda metric: ",".join(str(run[metric]) for run in sorted(group, key=lambda r: r["seed"]))
        zero_shot = spread("test_zero_shot")
        cells = [f"{s:g}",
                 " / ".join(f"{spread(f'experts90/text/layer{i}').mean:.1f} ({per_seed(f'experts90/text/layer{i}')})"
                            for i in (0, 1)),
                 " / ".join(f"{spread(f'effective/text/layer{i}').mean:.1f}" for i in (0, 1)),
                 " / ".join(f"{spread(f'experts90/image/layer{i}').mean:.1f}" for i in (0, 1)),
                 " / ".join(f"{spread(f'success/text/layer{i}').mean:.3f}" for i in (0, 1)),
                 f"{zero_shot.mean:.3f} ± {zero_shot.std:.3f}", ", ".join(map(str, zero_shot.seeds))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curves_of(runs: list[dict], kind: str, metric: str, variant: str = "") -> dict[int, tuple[list, list]]:
    """{seed: (steps, values)} of one logged curve (e.g. ``busiest/text/layer1``, ``val_zero_shot``) for the runs
    of ``kind`` and ``variant``; KeyError naming the metric when a run did not log it."""
    out = {}
    for run in runs:
        if run["kind"] == kind and run["variant"] == variant:
            if metric not in run["curves"]:
                raise KeyError(f"the {kind} run of seed {run['seed']} has no curve {metric!r}; it has "
                               f"{sorted(run['curves'])}")
            steps, values = zip(*run["curves"][metric]) if run["curves"][metric] else ((), ())
            out[run["seed"]] = (list(steps), list(values))
    return dict(sorted(out.items()))
