"""Do the chapters' claims hold on another CPU and seed? Each chapter run under perturbed numerics and seeds.

A chapter asserts what it measures, so the same notebook trained with another seed, or with XLA generating
code for another instruction set, must still pass. Each run is one (ISA, seed) pair: ``native`` lets XLA use
every instruction set the CPU has (AVX-512 where present), ``avx2`` sets ``XLA_FLAGS=--xla_cpu_max_isa=AVX2``,
what an AVX2-only CPU (an AMD EPYC before Zen 4, say) computes; the seed goes to ``MOE_COURSE_SEED``, which
every chapter reads. A chapter passes exactly when tests/test_chapters.py would pass it (the same runner).
Prints a table chapter x run -> pass/FAIL with each chapter's key printed numbers, then the first failing
assertion of every failed run.

Usage: python benchmarks/chapter_robustness.py [--chapters 01_vit 04_limoe] [--runs native:0 native:1 avx2:0]
       [--jobs 2] [--keep DIR] [--json results.json]
       python benchmarks/chapter_robustness.py --report DIR [DIR ...]
Runs one chapter at a time by default (--jobs 2 on two cores takes about as long: each run uses both cores).
With --keep DIR every run's notebook and outputs stay in DIR, and DIR/results.json holds the rows; --report prints
the table again from such folders (a later folder's run replaces an earlier one's), so that a chapter changed and
run again joins the table of the others.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from chapter_runner import CHAPTERS, run_chapter  # noqa: E402

ISA_FLAGS = {"native": "", "avx2": "--xla_cpu_max_isa=AVX2"}
DEFAULT_RUNS = ("native:0", "native:1", "native:2", "avx2:0")
# What each chapter's table row shows: a printed line matched by the pattern, first group, in printed order.
KEY_NUMBERS = {
    "01_vit": [("test acc", r"test accuracy (\d\.\d+) \(logistic"),
               ("top patch on digit", r"most-attended patch lies on the digit in (\d+%)")],
    "02_moe_layer": [("noise flips", r"changed by the noise: (\d+%)"),
                     ("length~priority", r"token length and BPR priority score: (-?\d\.\d+)")],
    "03_vmoe_bpr": [("V-MoE test acc", r"V-MoE \(E=8, k=2\): test accuracy (\d\.\d+)"),
                    ("BPR lead C<0.5", r"BPR minus vanilla below C = 0.5, mean ([+-]?[\d.]+)")],
    "04_limoe": [("zero-shot", r"LIMoE trained here: zero-shot (\d\.\d+)"),
                 ("text served", r"test success rates: .*?text/layer0 (\d\.\d+)"),
                 ("1 expert: drop", r"router_drop .*1 kept: (\d\.\d+)"),
                 ("pred", r"router_pred .*1 kept: (\d\.\d+)")],
    "05_soft_moe": [("Soft MoE test acc", r"Soft MoE trained here: test accuracy (\d\.\d+)")],
    "06_mod": [("dense test acc", r"dense backbone \([^)]*\): test accuracy (\d\.\d+)"),
               ("A-MoD - std, start", r"A-MoD minus standard MoD before fine-tuning: ([+-]?[\d.]+)"),
               ("A-MoD - isoFLOP, tuned", r"A-MoD minus isoFLOP after fine-tuning: ([+-]?[\d.]+)")],
    "07_scale": [("8-dev vs 1 gap", r"-- largest difference ([\d.e+-]+)")],
}


def cpu_line() -> str:
    """The CPU's model name and whether it has AVX-512 (Linux /proc/cpuinfo; the platform string elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", info, re.M) or re.search("(.*)", "")).group(1).split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model.group(1) if model else platform.machine()}, {os.cpu_count()} cores, {isa}"


def parse_run(text: str) -> tuple[str, int]:
    isa, _, seed = text.partition(":")
    if isa not in ISA_FLAGS or not seed.isdigit():
        raise argparse.ArgumentTypeError(f"run {text!r} is not ISA:SEED with ISA in {sorted(ISA_FLAGS)} and a "
                                         "non-negative integer seed, e.g. native:0 or avx2:1")
    return isa, int(seed)


def key_numbers(stem: str, text: str) -> str:
    found = []
    for label, pattern in KEY_NUMBERS.get(stem, []):
        match = re.search(pattern, text)
        found.append(f"{label} {match.group(1) if match else '?'}")
    return "; ".join(found)


def first_failure(output: str) -> str:
    """The failing assertion (or error) line of an nbval report, shortened."""
    lines = [line.strip() for line in output.splitlines()]
    picked = [line for line in lines if line.startswith(("AssertionError", "E ", "ValueError", "Error"))]
    return (picked[0] if picked else (lines[-1] if lines else "no output"))[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stems = [chapter.stem for chapter in CHAPTERS]
    parser.add_argument("--chapters", nargs="+", default=stems, choices=stems, metavar="STEM",
                        help=f"chapters to run (default all): {' '.join(stems)}")
    parser.add_argument("--runs", nargs="+", type=parse_run, default=[parse_run(r) for r in DEFAULT_RUNS],
                        help="ISA:SEED pairs, ISA native or avx2 (default: " + " ".join(DEFAULT_RUNS) + ")")
    parser.add_argument("--jobs", type=int, default=1, help="chapter runs at once (default 1)")
    parser.add_argument("--keep", type=Path, help="keep every run's notebook, outputs and checkpoints here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--report", type=Path, nargs="+", metavar="DIR", help="print the table of earlier --keep "
                        "folders instead of running anything")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs} is not allowed; use a positive integer")
    if args.report:
        missing = [str(folder) for folder in args.report if not (folder / "results.json").is_file()]
        if missing:
            parser.error(f"--report: no results.json in {', '.join(missing)} (folders written with --keep)")
        print(f"device: CPU ({cpu_line()}); the table of {', '.join(map(str, args.report))}")
        sys.exit(print_table(reported_rows(args.report)))

    print(f"device: CPU ({cpu_line()}); XLA_FLAGS in this shell: {os.environ.get('XLA_FLAGS', '') or '(none)'}")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="chapter-robustness-"))
    by_stem = {chapter.stem: chapter for chapter in CHAPTERS}
    jobs = [(by_stem[stem], isa, seed) for stem in args.chapters for isa, seed in args.runs]  # in the order given

    def one(job):
        chapter, isa, seed = job
        flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), ISA_FLAGS[isa]]))
        started = time.perf_counter()
        run = run_chapter(chapter, folder / f"{chapter.stem}-{isa}-seed{seed}",
                          {"MOE_COURSE_SEED": str(seed), "XLA_FLAGS": flags})
        seconds = time.perf_counter() - started
        row = {"chapter": chapter.stem, "isa": isa, "seed": seed, "passed": run.returncode == 0,
               "seconds": round(seconds), "numbers": key_numbers(chapter.stem, run.text()),
               "failure": "" if run.returncode == 0 else first_failure(run.output)}
        print(f"  {row['chapter']:13s} {isa}:{seed}  {'pass' if row['passed'] else 'FAIL'}  {row['seconds']:4d} s  "
              f"{row['numbers']}", flush=True)
        return row

    print(f"{len(jobs)} chapter runs, {args.jobs} at a time; as they finish:", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    results = json.dumps({"cpu": cpu_line(), "rows": rows}, indent=1)
    for path in filter(None, [args.json, args.keep and args.keep / "results.json"]):
        path.write_text(results)
    sys.exit(print_table(rows))


def reported_rows(folders: list[Path]) -> list[dict]:
    """The rows of earlier --keep folders, key numbers read again from each run's outputs; later folders win."""
    rows = {}
    for folder in folders:
        for row in json.loads((folder / "results.json").read_text())["rows"]:
            outputs = folder / f"{row['chapter']}-{row['isa']}-seed{row['seed']}" / "outputs.json"
            if outputs.is_file():
                text = "\n".join(cell.get("text", "") for cell in json.loads(outputs.read_text()))
                row = {**row, "numbers": key_numbers(row["chapter"], text)}
            rows[row["chapter"], row["isa"], row["seed"]] = row
    return list(rows.values())


def print_table(rows: list[dict]) -> int:
    """Print chapter x run -> pass/FAIL, each run's key numbers, then every failure; returns 1 if any failed."""
    runs = list(dict.fromkeys(f"{r['isa']}:{r['seed']}" for r in rows))
    stems = [chapter.stem for chapter in CHAPTERS if any(r["chapter"] == chapter.stem for r in rows)]
    print("\nchapter        " + "  ".join(f"{run:>9s}" for run in runs) + "   key numbers per run")
    for stem in stems:
        mine = {f"{r['isa']}:{r['seed']}": r for r in rows if r["chapter"] == stem}
        print(f"{stem:13s}  " + "  ".join(f"{'pass' if mine[run]['passed'] else 'FAIL':>9s}" if run in mine
                                          else f"{'-':>9s}" for run in runs))
        for run in (run for run in runs if run in mine):
            print(f"{'':15s}{run:>9s}: {mine[run]['numbers']} ({mine[run]['seconds']} s)")
    failed = [r for r in rows if not r["passed"]]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} runs passed; {sum(r['seconds'] for r in rows) / 60:.0f} "
          "chapter-minutes")
    for r in failed:
        print(f"FAIL {r['chapter']} {r['isa']}:{r['seed']}: {r['failure']}")
    return 1 if failed else 0


if __name__ == "__main__":
    main()
