"""Recorded training runs the chapters read: one JSON object per line, as the sweep scripts under benchmarks/
append them (``glyphs.jsonl``: ``benchmarks/glyphs_sweep.py --out``). They ship with the package, so a chapter
downloaded from the website and run where the course was installed from a wheel finds them too
(``moe_course.analysis.sweeps.RESULTS``)."""
