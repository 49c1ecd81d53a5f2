"""tools/check_transcription.py: no exercise answer is written out in a chapter (issues 45 and 53), and the check
does flag an answer that is (the assignment-3 answer before issue 45, a chapter function under new names, and
the one-line expressions and prose formulas chapters 1, 2 and 7 held before issue 53); it runs on the standard
library alone."""

import ast
import builtins
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "check_transcription.py"

# chapters/02_moe_layer.py's literal allocation loops as they stood when issue 45 was filed (a frozen copy:
# the chapter itself keeps changing)
CHAPTER_LOOPS = '''
def fill_buffers(expert_index, token_order, capacity, num_experts):
    """The shared body of Algorithms 1-3. expert_index: (tokens, k). Returns slot (tokens, k), -1 = dropped."""
    tokens, k = expert_index.shape
    buffers = [[] for _ in range(num_experts)]  # empty buffers of `capacity` slots
    slot = np.full((tokens, k), -1)
    for i in range(k):  # TOP-1 choices of all tokens first, then TOP-2, ...
        for p in token_order:
            e = int(expert_index[p, i])
            if len(buffers[e]) < capacity:  # expert e not full: add token p to its buffer
                slot[p, i] = len(buffers[e])
                buffers[e].append(p)
    return slot


def sort_by_priority(gates):
    scores = [float(max(row)) for row in gates]
    return sorted(range(len(gates)), key=lambda p: -scores[p])


def algorithm_2_bpr(expert_index, gates, capacity, num_experts):
    return fill_buffers(expert_index, sort_by_priority(gates), capacity, num_experts)
'''
# solutions/03_vmoe_bpr.py's bpr_slots before issue 45: chapter 2's loops with a group axis
OLD_BPR = '''
def bpr_slots(expert_index, gates, capacity, num_experts, score="max"):
    ### BEGIN SOLUTION
    groups, tokens, k = expert_index.shape
    order = priority_order(gates, score)
    slot = np.full(expert_index.shape, -1)
    for g in range(groups):
        fill = np.zeros(num_experts, int)
        for i in range(k):
            for t in order[g]:
                e = expert_index[g, t, i]
                if fill[e] < capacity:
                    slot[g, t, i] = fill[e]
                    fill[e] += 1
    return slot
    ### END SOLUTION
'''


# Expressions the chapters held before issue 53 (frozen copies), each the answer of an exercise function
OLD_EXPRESSIONS = {
    "01_vit.py": '''
kernel = model.patch_embed.proj.kernel[...]  # (p, p, C, D)
by_hand = patchify(images, config.patch_size) @ kernel.reshape(-1, config.width) + model.patch_embed.proj.bias[...]
''',
    "02_moe_layer.py": '''
top = np.argsort(-dense_gate, axis=1, kind="stable")[:, :k]  # (tokens, k) the k experts with the largest gate
''',
    "07_scale.py": '''
# %% [markdown]
# A device cuts its `(g, E, B, D)` buffers into n blocks and keeps one, so each exchange sends
# `(n - 1) * g * (E / n) * B * D` numbers, and the forward pass has two exchanges (there and back):
#
# `bytes = 2 * (n - 1) * g * (E / n) * B * D * 4` (float32), independent of how many slots are filled.
''',
}
# Exercise 7's byte count was an answer then (it is a debug task now, handed out): the formula above held it.
# Exercise 1's embed_patches was one then (issue 61 made the task the whole embedding, class token and position
# embeddings included, in jax.numpy): the chapter's one-liner above held it.
OLD_ANSWERS = {"01_vit.py": '''
# %% nbgrader={"grade": false, "grade_id": "embed_answer", "locked": false, "schema_version": 3, "solution": true}
def embed_patches(images, kernel, bias, patch_size):
    ### BEGIN SOLUTION
    p, _, c, width = kernel.shape
    return patchify(images, patch_size) @ kernel.reshape(p * p * c, width) + bias
    ### END SOLUTION
''', "02_moe_layer.py": '''
# %% nbgrader={"grade": false, "grade_id": "topk_answer", "locked": false, "schema_version": 3, "solution": true}
def top_k_routing(logits, k):
    ### BEGIN SOLUTION
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    expert_index = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return expert_index, np.take_along_axis(probs, expert_index, axis=-1)
    ### END SOLUTION
''', "07_scale.py": '''
# %% nbgrader={"grade": false, "grade_id": "bytes_answer", "locked": false, "schema_version": 3, "solution": true}
def mesh_bytes(total_groups, tokens_per_group, num_experts, k, capacity_ratio, dim, data, expert, itemsize=4):
    ### BEGIN SOLUTION
    capacity = max(1, int(np.floor(k * tokens_per_group * capacity_ratio / num_experts + 0.5 + 1e-9)))
    groups_per_device = total_groups // (data * expert)
    block = groups_per_device * (num_experts // expert) * capacity * dim
    return 2 * (expert - 1) * block * itemsize
    ### END SOLUTION
'''}


def _run(*args):
    # -S -I: no site-packages (nor the checkout on sys.path): the check must run on the standard library alone
    return subprocess.run([sys.executable, "-S", "-I", str(TOOL), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_the_check_imports_only_the_standard_library():
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(TOOL.read_text()))
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(TOOL.read_text()))
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


@pytest.mark.parametrize("chapter, answer", [("01_vit.py", "embed_patches"), ("02_moe_layer.py", "top_k_routing"),
                                             ("07_scale.py", "mesh_bytes")])
def test_a_one_line_expression_or_a_prose_formula_is_flagged(tmp_path, chapter, answer):
    """The answer's returned value (its names assigned once inlined) against a chapter's one-liner or the
    formula in its markdown: a data attribute (``config.width``) or a parameter read (``bias[...]``) hides
    nothing."""
    (tmp_path / chapter).write_text(OLD_EXPRESSIONS[chapter])
    solution = ROOT / "solutions" / chapter
    if chapter in OLD_ANSWERS:
        solution = tmp_path / "solutions" / chapter
        solution.parent.mkdir()
        solution.write_text(OLD_ANSWERS[chapter])
    done = _run("--solutions", str(solution), "--chapters", str(tmp_path / chapter))
    line = next(line for line in done.stdout.splitlines() if f" {answer} " in line)
    assert done.returncode == 1 and line.startswith("TRANSCRIBED"), done.stdout
    assert f"at {chapter}:" in line.split("expression")[1], line


def test_no_exercise_function_is_written_out_in_a_chapter():
    done = _run()
    lines = done.stdout.strip().splitlines()
    solutions = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py"))
    asked = sum(1 for path in solutions for node in ast.parse(path.read_text()).body
                if isinstance(node, ast.FunctionDef)
                and "### BEGIN SOLUTION" in ast.get_source_segment(path.read_text(), node))
    assert len(lines) == asked + 1 and asked >= 7, done.stdout  # one line per function, then the count
    assert done.returncode == 0 and lines[-1].startswith(f"0 of {asked} exercise functions transcribed"), done.stdout


def test_the_old_bpr_answer_is_flagged(tmp_path):
    (tmp_path / "02_moe_layer.py").write_text(CHAPTER_LOOPS)
    (tmp_path / "03_vmoe_bpr.py").write_text(OLD_BPR)
    done = _run("--solutions", str(tmp_path / "03_vmoe_bpr.py"), "--chapters", str(tmp_path / "02_moe_layer.py"))
    assert done.returncode == 1, done.stdout
    assert done.stdout.splitlines()[0].startswith("TRANSCRIBED 03_vmoe_bpr.py"), done.stdout
    assert done.stdout.splitlines()[-1].startswith("1 of 1 exercise functions transcribed"), done.stdout


def test_a_chapter_function_under_new_names_is_flagged(tmp_path):
    """A real chapter's function, renamed, re-commented and given a docstring, is the same normalised body."""
    chapter = ROOT / "chapters" / "02_moe_layer.py"
    text = chapter.read_text()
    function = next(node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)
                    and len(ast.unparse(node).split()) > 30)
    renamed = ast.parse(ast.get_source_segment(text, function))
    names = {}
    for node in ast.walk(renamed):
        if isinstance(node, ast.Name) and node.id not in dir(builtins):
            node.id = names.setdefault(node.id, f"mine_{len(names)}")
        elif isinstance(node, ast.arg):
            node.arg = names.setdefault(node.arg, f"mine_{len(names)}")
    statements = renamed.body[0].body[1:] if ast.get_docstring(renamed.body[0]) else renamed.body[0].body
    body = "\n".join("    " + line for line in ast.unparse(statements).splitlines())  # its docstring replaced
    (tmp_path / "99_copy.py").write_text(f'def copied(*args):\n    """My own words."""\n    ### BEGIN SOLUTION\n'
                                         f"    # a comment of mine\n{body}\n    ### END SOLUTION\n")
    done = _run("--solutions", str(tmp_path / "99_copy.py"), "--chapters", str(chapter))
    assert done.returncode == 1 and "body 1.00" in done.stdout, done.stdout
