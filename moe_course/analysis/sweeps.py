"""Seed statistics of recorded training runs: the tables of docs/results.md and of chapters 3 and 5.

A run is one JSON object per line, as ``benchmarks/glyphs_sweep.py --out FILE`` appends them: ``kind`` (dense,
tc, ec, soft), ``variant`` (the command-line options that differ from the presets and recipes, "" for the
recipe itself), ``seed`` and the measured numbers (``test_accuracy``, ``train_loss``, ``flops``, ...). The
runs behind the course's tables ship with the package in ``moe_course/results/`` (``RESULTS``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
KIND_NAMES = {"dense": "dense ViT", "tc": "Tokens Choice (BPR)", "ec": "Experts Choice", "soft": "Soft MoE"}


@dataclass(frozen=True)
class SeedSpread:
    """One metric over the seeds of one configuration: mean, sample standard deviation (0 for one seed),
    smallest and largest value, and the seeds it covers."""

    mean: float
    std: float
    low: float
    high: float
    seeds: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.std:.3f} ({self.low:.3f}-{self.high:.3f}, {len(self.seeds)} seeds)"


def read_runs(path: str | Path) -> list[dict]:
    """The runs recorded in ``path`` (JSON lines). Raises FileNotFoundError, or ValueError naming the line that
    is not a JSON object with ``kind``, ``variant`` and ``seed``."""
    runs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(run, dict) or not {"kind", "variant", "seed"} <= run.keys():
            raise ValueError(f"{path}:{number}: a run needs the fields kind, variant and seed")
        runs.append(run)
    return runs


def seed_spread(runs: list[dict], metric: str = "test_accuracy", variant: str = "") -> dict[str, SeedSpread]:
    """{kind: SeedSpread of ``metric``} over the runs of ``variant`` ("" = the recipes), one entry per kind
    present, in the order kinds first appear. A seed recorded twice for one kind raises ValueError (two runs of
    one seed are the same run), as does a non-finite value (never averaged away)."""
    values: dict[str, dict[int, float]] = {}
    for run in runs:
        if run["variant"] != variant:
            continue
        value = float(run[metric])
        if not math.isfinite(value):
            raise ValueError(f"{metric}={value} in the {run['kind']} run of seed {run['seed']}: not finite")
        by_seed = values.setdefault(run["kind"], {})
        if run["seed"] in by_seed:
            raise ValueError(f"seed {run['seed']} of kind {run['kind']!r} (variant {variant!r}) is recorded twice")
        by_seed[run["seed"]] = value
    return {kind: _spread(by_seed) for kind, by_seed in values.items()}


def _spread(by_seed: dict[int, float]) -> SeedSpread:
    xs = list(by_seed.values())
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return SeedSpread(mean, std, min(xs), max(xs), tuple(sorted(by_seed)))


@dataclass(frozen=True)
class SeedLead:
    """One model minus a baseline, seed by seed, over the seeds both were run with (same recipe, same seed):
    ``per_seed`` {seed: difference}, its SeedSpread ``spread``, and ``wins`` (seeds where the model is ahead),
    ``ties`` (within ``tie`` of each other) and ``losses``."""

    per_seed: dict[int, float]
    spread: SeedSpread
    wins: int
    ties: int
    losses: int

    def __str__(self) -> str:
        spread = self.spread
        return (f"{spread.mean:+.3f} ± {spread.std:.3f} ({spread.low:+.3f} to {spread.high:+.3f}); ahead on "
                f"{self.wins} of {len(self.per_seed)} seeds, level on {self.ties}, behind on {self.losses}")


def seed_lead(runs: list[dict], kind: str, baseline: str = "dense", metric: str = "test_accuracy",
              variant: str = "", tie: float = 0.005) -> SeedLead:
    """``kind`` minus ``baseline`` in ``metric`` for each seed both have in ``variant`` ("" = the recipes); a
    difference within ``tie`` (0.005: half a point of accuracy) counts as level. Raises ValueError when the two
    share no seed (and as ``seed_spread`` does for a seed recorded twice or a non-finite value)."""
    by_seed = {k: {run["seed"]: float(run[metric]) for run in runs if run["kind"] == k and run["variant"] == variant}
               for k in (kind, baseline)}
    seed_spread([run for run in runs if run["kind"] in (kind, baseline)], metric, variant)  # the same checks
    seeds = sorted(set(by_seed[kind]) & set(by_seed[baseline]))
    if not seeds:
        raise ValueError(f"no seed has both a {kind!r} and a {baseline!r} run (variant {variant!r})")
    per_seed = {seed: by_seed[kind][seed] - by_seed[baseline][seed] for seed in seeds}
    gaps = list(per_seed.values())
    return SeedLead(per_seed, _spread(per_seed), wins=sum(d > tie for d in gaps),
                    ties=sum(abs(d) <= tie for d in gaps), losses=sum(d < -tie for d in gaps))


def seed_table(runs: list[dict], variant: str = "", names: dict[str, str] = KIND_NAMES) -> str:
    """A markdown table of ``variant``'s runs, one row per model kind (the kinds of ``names`` first, in its order,
    named as it names them; by default dense, Tokens Choice, Experts Choice, Soft MoE): forward MFLOPs per image,
    parameters, test accuracy (mean ± std, range), mean train loss, seeds."""
    accuracy, loss = seed_spread(runs, "test_accuracy", variant), seed_spread(runs, "train_loss", variant)
    first = {run["kind"]: run for run in runs if run["variant"] == variant}
    order = list(names)
    lines = ["| model | forward MFLOPs | parameters | test accuracy: mean ± std (range) | train loss | seeds |",
             "| --- | --- | --- | --- | --- | --- |"]
    for kind, spread in sorted(accuracy.items(), key=lambda item: order.index(item[0]) if item[0] in order else 9):
        lines.append(f"| {names.get(kind, kind)} | {first[kind]['flops'] / 1e6:.2f} "
                     f"| {first[kind]['params'] / 1e3:.0f}k | {spread.mean:.3f} ± {spread.std:.3f} "
                     f"({spread.low:.3f}-{spread.high:.3f}) | {loss[kind].mean:.3f} "
                     f"| {', '.join(map(str, spread.seeds))} |")
    return "\n".join(lines)
