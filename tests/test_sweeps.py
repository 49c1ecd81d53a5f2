"""Seed statistics of recorded runs (moe_course.analysis.sweeps) and the table script built on them."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from moe_course.analysis.sweeps import RESULTS, read_runs, seed_lead, seed_spread


def _write(path, runs):
    path.write_text("".join(json.dumps(run) + "\n" for run in runs))
    return path


def _run(kind, seed, accuracy, variant="", **extra):
    return dict(kind=kind, variant=variant, seed=seed, test_accuracy=accuracy, train_loss=1 - accuracy,
                flops=4.7e6, params=191_000, **extra)


def test_seed_spread_is_mean_sample_std_and_range_per_kind_of_one_variant(tmp_path):
    runs = read_runs(_write(tmp_path / "runs.jsonl", [
        _run("dense", 0, 0.95), _run("tc", 0, 0.99), _run("dense", 1, 0.91), _run("dense", 2, 0.93),
        _run("dense", 0, 0.10, variant="--steps 10")]))
    table = seed_spread(runs)
    assert list(table) == ["dense", "tc"]
    dense = table["dense"]
    assert dense.mean == pytest.approx(0.93) and dense.std == pytest.approx(0.02)  # sqrt((4e-4 + 4e-4 + 0) / 2)
    assert (dense.low, dense.high, dense.seeds) == (0.91, 0.95, (0, 1, 2))
    assert table["tc"].std == 0 and table["tc"].seeds == (0,)
    assert seed_spread(runs, variant="--steps 10")["dense"].mean == 0.10
    assert seed_spread(runs, "train_loss")["dense"].mean == pytest.approx(0.07)
    assert str(dense).startswith("0.930 ± 0.020 (0.910-0.950, 3 seeds)")


def test_a_seed_recorded_twice_or_a_non_finite_number_is_refused(tmp_path):
    twice = read_runs(_write(tmp_path / "twice.jsonl", [_run("tc", 1, 0.9), _run("tc", 1, 0.8)]))
    with pytest.raises(ValueError, match="seed 1 of kind 'tc'.*twice"):
        seed_spread(twice)
    nan = read_runs(_write(tmp_path / "nan.jsonl", [_run("tc", 1, math.nan)]))
    with pytest.raises(ValueError, match="test_accuracy=nan.*not finite"):
        seed_spread(nan)


def test_seed_lead_pairs_seeds_and_counts_wins_ties_and_losses():
    runs = [_run("dense", 0, 0.90), _run("tc", 0, 0.95), _run("dense", 1, 0.97), _run("tc", 1, 0.968),
            _run("dense", 2, 0.95), _run("tc", 2, 0.93), _run("dense", 3, 0.90), _run("ec", 0, 0.99),
            _run("tc", 4, 0.99)]  # seeds 3 (dense) and 4 (tc) have no partner
    lead = seed_lead(runs, "tc")
    assert lead.per_seed == pytest.approx({0: 0.05, 1: -0.002, 2: -0.02})
    assert (lead.wins, lead.ties, lead.losses) == (1, 1, 1)
    assert lead.spread.mean == pytest.approx(0.028 / 3) and lead.spread.seeds == (0, 1, 2)
    assert lead.spread.std == pytest.approx(math.sqrt(sum((d - 0.028 / 3) ** 2 for d in (0.05, -0.002, -0.02)) / 2))
    assert str(lead).endswith("ahead on 1 of 3 seeds, level on 1, behind on 1")
    with pytest.raises(ValueError, match="no seed has both a 'soft' and a 'dense' run"):
        seed_lead(runs, "soft")
    with pytest.raises(ValueError, match="recorded twice"):
        seed_lead(runs + [_run("tc", 0, 0.5)], "tc")


def test_read_runs_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_run("tc", 0, 0.9)) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:3: not JSON"):
        read_runs(path)
    path.write_text(json.dumps({"kind": "tc", "seed": 0}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a run needs the fields kind, variant and seed"):
        read_runs(path)


def test_glyphs_table_prints_the_recipes_first_then_each_variant(tmp_path):
    path = _write(tmp_path / "runs.jsonl", [_run("soft", 0, 0.5, variant="--experts 4"), _run("tc", 0, 0.99),
                                            _run("dense", 0, 0.95), _run("dense", 1, 0.91)])
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "glyphs_table.py"),
                          str(path)], capture_output=True, text=True, check=True).stdout
    recipes, experts = out.split("--experts 4:")
    assert "the recipes" in recipes and "Soft MoE" in experts and "Soft MoE" not in recipes
    rows = [line for line in recipes.splitlines() if line.startswith("| dense") or line.startswith("| Tokens")]
    assert rows[0].startswith("| dense ViT | 4.70 | 191k | 0.930 ± 0.028 (0.910-0.950) | 0.070 | 0, 1 |"), rows
    assert rows[1].startswith("| Tokens Choice (BPR)"), rows
    assert "- Tokens Choice (BPR) minus dense: +0.040 ± 0.000 (+0.040 to +0.040); ahead on 1 of 1 seeds" in recipes
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "glyphs_table.py"),
                          "--summary", str(path)], capture_output=True, text=True, check=True).stdout
    assert "| the recipes | 0.930 (2) | 0.990 (1) |  |  |" in out and "| --experts 4 |  |  |  | 0.500 (1) |" in out, out


def test_the_recorded_glyphs_runs_read():
    runs = read_runs(RESULTS / "glyphs.jsonl")
    assert {run["kind"] for run in runs} == {"dense", "tc", "ec", "soft"}
    assert all(0 <= run["test_accuracy"] <= 1 for run in runs)


def _limoe_run(kind, seed, zero_shot, busiest=0.5, variant="--patch-size 4"):
    routing = {} if kind == "dense" else {f"{metric}/text/layer{i}": value for i in (0, 1) for metric, value in
                                          (("success", 0.9), ("busiest", busiest), ("experts90", 3))}
    return dict(kind=kind, variant=variant, seed=seed, test_zero_shot=zero_shot, flops=2.8e7,
                **{"test_i2t_recall@1": 0.2, "test_t2i_recall@1": 0.3}, routing=routing,
                curves={"loss": [[50, 2.0], [100, 1.0], [150, 0.5]], "loss_max": [[50, 3.0], [100, 1.5], [150, 2.5]],
                        "busiest/text/layer1": [[50, busiest / 2], [100, busiest]]})


def test_limoe_table_rows_spread_over_seeds_and_the_worst_loss_spike():
    from moe_course.analysis.limoe_runs import curves_of, flattened, limoe_seed_table

    runs = [_limoe_run("paper", 0, 0.8, busiest=0.4), _limoe_run("paper", 1, 0.9, busiest=0.6),
            _limoe_run("dense", 0, 0.7), _limoe_run("paper", 0, 0.1, variant="")]
    assert flattened(runs[0])["loss_spike"] == pytest.approx(2.5 / 1.0)  # the window after the mean 1.0
    table = limoe_seed_table(runs, "--patch-size 4").splitlines()
    paper, dense = table[2].split(" | "), table[3].split(" | ")
    assert paper[0] == "| + global entropy (the paper's 5 terms)" and dense[0] == "| dense one tower"
    assert paper[2] == f"0.850 ± {math.sqrt(0.005):.3f} (0.800-0.900)" and paper[-1] == "0, 1 |"
    assert paper[5] == "0.500 (0.600) / 0.500 (0.600)" and paper[6] == "3,3 / 3,3" and dense[4] == "--"
    assert limoe_seed_table(runs, "--patch-size 4", include_dense=False).splitlines() == table[:3]  # chapter 4, sec. 3
    assert curves_of(runs, "paper", "busiest/text/layer1", "--patch-size 4") == {
        0: ([50, 100], [0.2, 0.4]), 1: ([50, 100], [0.3, 0.6])}
    with pytest.raises(KeyError, match="no curve 'val_zero_shot'"):
        curves_of(runs, "paper", "val_zero_shot", "--patch-size 4")


def _tau_run(soft_min, seed, text_shares, experts90):
    run = _limoe_run("paper", seed, 0.8 + seed / 100, variant=f"--experts 4 --text-soft-min {soft_min}")
    run["routing"].update({f"shares/text/layer{i}": text_shares for i in (0, 1)})
    run["routing"].update({f"experts90/{m}/layer{i}": experts90 for m in ("text", "image") for i in (0, 1)})
    return {**run, "options": {"text_soft_min": soft_min},
            "config": {"text_tau": math.log(soft_min), "num_experts": 4, "patch_size": 4}}


def test_soft_minimum_table_rows_by_threshold_with_effective_experts():
    from moe_course.analysis.limoe_runs import effective_experts, soft_minimum, soft_minimum_table

    assert effective_experts([0.5, 0.5, 0.0, 0.0]) == pytest.approx(2.0)
    assert effective_experts([2, 2, 2, 2]) == pytest.approx(4.0)  # shares are normalised
    with pytest.raises(ValueError, match="no token was routed"):
        effective_experts([0.0, 0.0])
    runs = [_tau_run(4, 0, [0.25] * 4, 4), _tau_run(1, 0, [1.0, 0, 0, 0], 1), _tau_run(4, 1, [0.5, 0.5, 0, 0], 2),
            {**_limoe_run("paper", 0, 0.5), "options": {"text_soft_min": None}}]  # no threshold set: not a row
    assert soft_minimum(runs[1]) == 1.0
    rows = [row.split(" | ") for row in soft_minimum_table(runs, experts=4).splitlines()[2:]]
    assert [row[0] for row in rows] == ["| 1", "| 4"]
    assert rows[1][1:4] == ["3.0 (4,2) / 3.0 (4,2)", "3.0 / 3.0", "3.0 / 3.0"]
    assert rows[1][5] == f"0.805 ± {math.sqrt(0.00005):.3f}" and rows[1][6] == "0, 1 |"
    with pytest.raises(ValueError, match="experts=32"):
        soft_minimum_table(runs)


def test_the_recorded_limoe_runs_read():
    from moe_course.analysis.limoe_runs import limoe_seed_table

    runs = read_runs(RESULTS / "limoe.jsonl")
    assert {run["kind"] for run in runs} <= {"classic", "local", "paper", "dense"}
    for variant in {run["variant"] for run in runs}:
        assert limoe_seed_table(runs, variant).count("\n") >= 2


def test_upcycling_table_names_the_arms_and_leads_over_dense_continued(tmp_path):
    from moe_course.analysis.upcycling import ARMS, upcycling_table

    runs = [_run(kind, seed, accuracy + seed / 100, test_loss=1 - accuracy - seed / 100) for seed in (0, 1)
            for kind, accuracy in (("dense-start", 0.5), ("dense", 0.6), ("upcycled", 0.7), ("scratch", 0.55))]
    lines = upcycling_table(runs).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:6]] == list(ARMS.values())
    assert lines[-4].startswith("- (b) upcycled V-MoE minus (a) dense, continued: +0.100 ± 0.000")
    assert lines[-3].startswith("- (c) V-MoE from scratch (N + M) minus (a) dense, continued: -0.050")
    assert lines[-2] == ("- test loss, (b) upcycled V-MoE minus (a) dense, continued: -0.100 ± 0.000 (-0.100 to "
                         "-0.100); lower on 2 of 2 seeds, within 0.005 on 0")
    assert lines[-1].startswith("- test loss, (c) V-MoE from scratch (N + M) minus (a) dense, continued: +0.050")
    written = _write(tmp_path / "runs.jsonl", runs)
    out = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "upcycle_table.py"),
                          str(written)], check=True, capture_output=True, text=True, timeout=120).stdout
    assert "the defaults:" in out and "| (b) upcycled V-MoE |" in out


def test_the_recorded_upcycling_runs_hold_five_seeds_of_each_arm():
    """moe_course/results/upcycling.jsonl (chapter 8, docs/results.md): the recipe's four arms on the same five or
    more seeds, at the FLOPs the script gives them (the V-MoE arms' steps for the dense steps' FLOPs)."""
    from moe_course.analysis.upcycling import ARMS, upcycling_table

    runs = read_runs(RESULTS / "upcycling.jsonl")
    recipe = [run for run in runs if run["variant"] == ""]
    seeds = {kind: {run["seed"] for run in recipe if run["kind"] == kind} for kind in ARMS}
    assert len(seeds["dense"]) >= 5 and all(s == seeds["dense"] for s in seeds.values()), seeds
    for run in recipe:
        if run["kind"] in ("upcycled", "scratch"):
            dense = next(r for r in recipe if r["kind"] == "dense" and r["seed"] == run["seed"])
            budget = run["extra_steps"] + (run["dense_steps"] if run["kind"] == "scratch" else 0)
            assert run["steps"] == round(budget * dense["flops"] / run["flops"]), run["kind"]
    for variant in {run["variant"] for run in runs}:
        assert upcycling_table(runs, variant).count("\n") >= 8
