"""Which points a planted bug costs: an assignment's solution with one answer cell changed, scored cell by cell as
the grader scores it.

Each bug is an edit of one answer cell of ``solutions/NN_slug.py`` (a piece of the learner's build). The notebook's
code cells run in order in one namespace, in a fresh process per bug, with ``LIBRARY`` set to False after the setup
cell (the branch the visible tests take in the grading sandbox, where the course library is absent) and the hidden
tests judged by ``answers.record`` against the library's references on the check's cases for each seed (the
comparison the grader makes outside the sandbox, ``compare.judge``). A grade cell scores its points when it raises
nothing. Prints one line per bug: the points on each seed and the grade cells that lost them.

    python tools/planted_bugs.py 03_vmoe_bpr [--seeds 0 1 2] [--bug NAME ...]

Issue 61's Done-when: a bug in one piece loses that piece's points and those of the pieces that call it, no others.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# assignment -> bug name -> (the answer cell's grade_id, the text replaced, its replacement)
BUGS = {
    "03_vmoe_bpr": {
        "priority lowest first": ("priority_answer", "jnp.argsort(-scores, axis=1, stable=True)",
                                  "jnp.argsort(scores, axis=1, stable=True)"),
        "TOP-2 choices before TOP-1": ("allocate_answer", "choices = jnp.swapaxes(in_order, 1, 2).reshape(groups, k * tokens)",
                                       "choices = jnp.swapaxes(jnp.flip(in_order, -1), 1, 2).reshape(groups, k * tokens)"),
        "combine without the gates": ("layer_answer", "expert_index, slot, gates, capacity)",
                                      "expert_index, slot, jnp.ones_like(gates), capacity)"),
        "aux loss without the 0.5 share": ("layer_answer", 'settings["aux_loss_weight"] * 0.5 * importance_loss',
                                           'settings["aux_loss_weight"] * importance_loss'),
        "no final LayerNorm": ("forward_answer", 'x = layer_norm(x, params["norm"])', "pass"),
        "loss without the aux term": ("loss_answer", "axis=1)) + aux", "axis=1))"),
        "update subtracted": ("step_answer", "jax.tree.map(jnp.add, params, update[0])",
                              "jax.tree.map(jnp.subtract, params, update[0])"),
    },
    "02_moe_layer": {
        "capacity rounded down": ("capacity_answer", "capacity_ratio / num_experts + 0.5 + 1e-9)",
                                  "capacity_ratio / num_experts)"),
        "combine without the gates": ("combine_answer", '"gtk,gtke,gtkb,gebd->gtd", gates,',
                                      '"gtk,gtke,gtkb,gebd->gtd", jnp.ones_like(gates),'),
        "load loss without the square": ("load_answer", "/ jnp.mean(load, axis=-1) ** 2)", "/ jnp.mean(load, axis=-1))"),
    },
    "04_limoe": {
        "entropy in log2": ("entropy_answer", "jnp.log(jnp.where(", "jnp.log2(jnp.where("),
        "global loss over padding": ("global_answer", "jnp.sum(probs * mask[..., None], axis=1)",
                                     "jnp.sum(probs, axis=1)"),
        "z loss without the square": ("z_answer", "axis=-1))) ** 2", "axis=-1)))"),
    },
    "05_soft_moe": {
        "phi not normalised": ("logits_answer", 'phi_unit = phi / jnp.sqrt(jnp.sum(jnp.square(phi), axis=0, keepdims=True) + EPS)',
                               "phi_unit = phi"),
        "combine over tokens": ("weights_answer", "jax.nn.softmax(logits, axis=2)", "jax.nn.softmax(logits, axis=1)"),
    },
    "06_mod": {
        "capacity rounded down": ("capacity_answer", "max(1, round(capacity * tokens))",
                                  "max(1, int(capacity * tokens))"),
        "attention scores over keys": ("scores_answer", "jnp.sum(maps, axis=(1, 2))", "jnp.sum(maps, axis=(1, 3))"),
        "chosen tokens in score order": ("select_answer", "index = jnp.sort(top, axis=1)", "index = top"),
    },
}


def score(assignment: str, bug: str | None, seed: int) -> dict[str, tuple[float, float]]:
    """{grade_id: (points earned, points)} for the solution of ``assignment`` with ``bug`` planted (None: as
    written), the hidden tests judged on ``seed``'s cases."""
    import jupytext

    from moe_course.course.inside import answers

    cells = jupytext.read(ROOT / "solutions" / f"{assignment}.py").cells
    grade_id, old, new = BUGS[assignment][bug] if bug else (None, "", "")
    os.environ[answers.CHECKS_ENV] = str(ROOT / "solutions" / "checks" / f"{assignment}.py")
    os.environ[answers.SEED_ENV] = str(seed)
    os.environ.pop(answers.ANSWERS_ENV, None)
    namespace: dict = {"__name__": "__main__"}
    scores, planted = {}, False
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        for cell in cells:
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            source = cell.source
            if grade_id is not None and meta.get("grade_id") == grade_id:
                if old not in source:
                    raise ValueError(f"bug {bug!r}: {old!r} is not in cell {grade_id}")
                source, planted = source.replace(old, new), True
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(source, f"<{meta.get('grade_id', 'cell')}>", "exec"), namespace)
                passed = True
            except Exception:  # a failing cell scores 0, as in nbgrader; the rest of the notebook still runs
                passed = False
            if meta.get("grade_id") == "setup":
                namespace["LIBRARY"] = False
            if meta.get("grade") and "points" in meta and cell.cell_type == "code":
                scores[meta["grade_id"]] = (float(meta["points"]) if passed else 0.0, float(meta["points"]))
    if grade_id is not None and not planted:
        raise ValueError(f"bug {bug!r}: no answer cell {grade_id}")
    return scores


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignment", choices=sorted(BUGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--bug", nargs="+", help="the bugs to plant (default: none, then each in turn)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one bug (or "" for none), JSON out
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps([score(args.assignment, args.one or None, seed) for seed in args.seeds]))
        return 0
    for bug in [""] + (args.bug or list(BUGS[args.assignment])):
        run = subprocess.run([sys.executable, __file__, args.assignment, "--one", bug, "--seeds",
                              *map(str, args.seeds)], capture_output=True, text=True, cwd=ROOT)
        if run.returncode != 0:
            print(f"{bug or 'none'}: failed to run: {run.stderr.strip().splitlines()[-1:]}")
            continue
        per_seed = json.loads(run.stdout.strip().splitlines()[-1])
        earned = [sum(e for e, _ in s.values()) for s in per_seed]
        total = sum(p for _, p in per_seed[0].values())
        lost = sorted({g for s in per_seed for g, (e, p) in s.items() if e < p})
        print(f"{bug or 'none (the solution)'}: {' / '.join(f'{e:g}' for e in earned)} of {total:g} on seeds "
              f"{', '.join(map(str, args.seeds))}; lost: {', '.join(lost) or 'nothing'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
