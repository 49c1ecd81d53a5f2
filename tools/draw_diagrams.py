"""Draw the architecture diagrams at the top of the model chapters (issue 53, item 5).

One SVG per chapter, ``docs/_static/diagrams/NN_slug.svg``: where the routed layer sits in the block and what
flows through it. Each chapter's first markdown cell shows its diagram as ``../docs/_static/diagrams/NN_slug.svg``
(the path from ``chapters/``, which JupyterLab resolves; the website's extension rewrites ``../docs/`` links of
chapter pages, see ``course_site.DOCS_LINK``). Drawn from code with matplotlib patches, so a change is a
reviewed diff of this file; text stays text in the SVG (``svg.fonttype = none``) and the output is
deterministic (fixed ``svg.hashsalt``, no date).

Run: ``python tools/draw_diagrams.py`` (rewrites every diagram), ``--check`` (exit 1 when a committed diagram
differs from a fresh drawing with the installed matplotlib), ``--out DIR`` (draw elsewhere).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "_static" / "diagrams"

# One colour per role, the same in every diagram.
TOKEN, ROUTER, EXPERT, DENSE, DROP, SLOT, NORM = ("#d9e8f5", "#fbd9a6", "#c8e6c9", "#e6e0f0", "#f4b6b6", "#fff2b3",
                                                   "#eeeeee")
EDGE = "#444444"
TEXT_SCALE = 1.3  # the site shows a diagram about 750 px wide: type set for that, not for the 13-inch canvas
RC = {"svg.fonttype": "none", "svg.hashsalt": "moe-course-diagrams", "font.family": "sans-serif",
      "font.size": 10}


def _canvas(width: float, height: float):
    """A figure of ``width`` x ``height`` inches whose data coordinates are inches (0, 0 at the bottom left)."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def box(ax, x, y, w, h, text="", color=DENSE, size=10, weight="normal", dashed=False, radius=0.08):
    """A rounded box with its lower left corner at (x, y); returns its centre."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={radius}", facecolor=color,
                                edgecolor=EDGE, linewidth=1.0, linestyle="--" if dashed else "-"))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size * TEXT_SCALE, weight=weight)
    return x + w / 2, y + h / 2


def arrow(ax, start, end, text="", color=EDGE, dashed=False, bend=0.0, size=9, offset=(0.0, 0.12)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color, linewidth=1.2,
                                 linestyle="--" if dashed else "-", connectionstyle=f"arc3,rad={bend}",
                                 shrinkA=1, shrinkB=1))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text, ha="center",
                va="bottom", fontsize=size * TEXT_SCALE, color=color)


def label(ax, x, y, text, size=9, ha="center", va="center", color="#222222", **kwargs):
    ax.text(x, y, text, ha=ha, va=va, fontsize=size * TEXT_SCALE, color=color, **kwargs)


def tokens(ax, x, y, colors, size=0.28, gap=0.06, vertical=False):
    """A row (or column) of token squares; returns their centres."""
    centres = []
    for i, c in enumerate(colors):
        cx, cy = (x, y - i * (size + gap)) if vertical else (x + i * (size + gap), y)
        ax.add_patch(Rectangle((cx, cy), size, size, facecolor=c, edgecolor=EDGE, linewidth=0.8))
        centres.append((cx + size / 2, cy + size / 2))
    return centres


def _residual(ax, x_from, y_from, x_side, y_to, x_to):
    """A residual connection drawn beside the boxes: right from (x_from, y_from), up, left into the adder."""
    ax.plot([x_from, x_side, x_side], [y_from, y_from, y_to], color=EDGE, linewidth=1.2)
    arrow(ax, (x_side, y_to), (x_to, y_to))


def _pre_ln_block(ax, x, y, routed_text, routed_color, width=2.2):
    """The pre-LN encoder block of chapter 1 with its MLP replaced: LN -> attention -> +, LN -> routed -> +."""
    cx, side = x + width / 2, x + width + 0.2
    box(ax, x - 0.25, y - 0.25, width + 0.75, 5.1, color="#fafafa", dashed=True)
    label(ax, cx, y + 4.65, "encoder block (pre-LN)", size=9, style="italic")
    arrow(ax, (cx, y - 0.7), (cx, y + 0.25))
    box(ax, x, y + 0.25, width, 0.45, "LayerNorm", NORM, size=9)
    box(ax, x, y + 0.95, width, 0.6, "self-attention", DENSE)
    arrow(ax, (cx, y + 0.7), (cx, y + 0.95))
    adders = [(cx, y + 1.95), (cx, y + 4.1)]
    for point in adders:
        ax.add_patch(plt.Circle(point, 0.14, facecolor="white", edgecolor=EDGE, zorder=3))
        label(ax, *point, "+", size=11, zorder=4)
    arrow(ax, (cx, y + 1.55), (cx, adders[0][1] - 0.14))
    _residual(ax, cx, y + 0.1, side, adders[0][1], cx + 0.14)
    box(ax, x, y + 2.3, width, 0.45, "LayerNorm", NORM, size=9)
    arrow(ax, (cx, adders[0][1] + 0.14), (cx, y + 2.3))
    centre = box(ax, x, y + 3.0, width, 0.7, routed_text, routed_color, weight="bold")
    arrow(ax, (cx, y + 2.75), (cx, y + 3.0))
    arrow(ax, (cx, y + 3.7), (cx, adders[1][1] - 0.14))
    _residual(ax, cx, y + 2.15, side, adders[1][1], cx + 0.14)
    label(ax, side + 0.05, y + 1.25, "residual", size=7.5, ha="left", color="#555555", rotation=90)
    arrow(ax, (cx, adders[1][1] + 0.14), (cx, y + 5.2))
    return centre


def draw_01(ax):
    """Chapter 1: a ViT -- patches -> tokens (+ position embedding, class token) -> L blocks -> norm, pool, head."""
    label(ax, 6.5, 6.55, "A Vision Transformer: image -> patches -> tokens -> encoder blocks -> head", size=13,
          weight="bold")
    # the image cut into a 3 x 3 grid of patches
    for i in range(3):
        for j in range(3):
            ax.add_patch(Rectangle((0.3 + j * 0.42, 4.2 + i * 0.42), 0.42, 0.42, facecolor=TOKEN if (i + j) % 2
                                   else "#b9d3ea", edgecolor=EDGE, linewidth=0.8))
    label(ax, 0.93, 5.65, "image (H, W, 3)", size=8)
    label(ax, 0.93, 3.95, "cut into P = HW / p^2\npatches of p x p", size=7.5, va="top")
    box(ax, 1.95, 4.35, 1.7, 0.95, "patch embedding\nconv p x p, stride p\n= one linear map", DENSE, size=7.5)
    arrow(ax, (1.6, 4.83), (1.95, 4.83))
    centres = tokens(ax, 4.0, 5.35, [SLOT] + [TOKEN] * 9, size=0.28, gap=0.07, vertical=True)
    label(ax, 4.14, 5.85, "tokens (P, D)", size=8)
    label(ax, 4.4, centres[0][1], "class token (option)", size=7.5, ha="left")
    arrow(ax, (3.65, 4.83), (4.0, 4.6))
    box(ax, 4.4, 2.45, 1.55, 0.75, "+ position\nembedding\n(learned, P x D)", DENSE, size=7.5)
    arrow(ax, (4.4, 2.83), (4.3, 2.83))
    # the stack of L blocks, zoomed on the right
    box(ax, 6.3, 1.2, 1.6, 3.9, color="#fafafa", dashed=True)
    for b in range(4):
        y = 1.45 + b * 0.9
        box(ax, 6.45, y, 1.3, 0.6, f"block {b}" if b < 3 else "block L-1", DENSE, size=8.5)
        if b == 2:
            label(ax, 7.1, y + 0.75, "...", size=10)
    label(ax, 7.1, 5.28, "L encoder blocks", size=8.5, style="italic")
    arrow(ax, (4.55, 1.95), (6.45, 1.75))
    _pre_ln_block(ax, 9.0, 0.9, "MLP\nW2 gelu(W1 x)", DENSE, width=2.0)
    arrow(ax, (7.75, 3.0), (8.75, 3.0), dashed=True, color="#888888")
    label(ax, 5.6, 0.55, "one block, zoomed: in self-attention every token attends to every token of its\n"
          "image (the maps can be returned); later chapters swap its MLP for a routed layer", size=7.5)
    box(ax, 11.7, 4.4, 1.15, 0.5, "LayerNorm", NORM, size=8)
    box(ax, 11.7, 3.4, 1.15, 0.75, "pool: class\ntoken or mean", NORM, size=7.5)
    box(ax, 11.7, 2.4, 1.15, 0.75, "head\n-> logits", DENSE, size=8)
    arrow(ax, (12.27, 4.4), (12.27, 4.15))
    arrow(ax, (12.27, 3.4), (12.27, 3.15))
    ax.plot([7.1, 7.1, 12.27], [5.45, 6.2, 6.2], color=EDGE, linewidth=1.2)
    arrow(ax, (12.27, 6.2), (12.27, 4.9))
    label(ax, 12.27, 1.95, "logits: one\nper class", size=7.5)


def draw_02(ax):
    """Chapter 2: a sparse MoE layer in a pre-LN block; router -> TOP-k -> buffers -> experts -> combine."""
    label(ax, 6.5, 6.55, "A sparse MoE layer replaces the MLP of a pre-LN block", size=13, weight="bold")
    centre = _pre_ln_block(ax, 0.5, 0.9, "MoE layer", EXPERT)
    label(ax, 1.6, 0.05, "tokens x: (groups, tokens, D)", size=8)
    # the zoom
    box(ax, 3.55, 0.35, 9.2, 5.75, color="#fcfcfc", dashed=True)
    arrow(ax, (centre[0] + 1.1, centre[1]), (3.55, 4.2), dashed=True, color="#888888")
    label(ax, 8.15, 5.85, "inside the MoE layer (one group of tokens; E = 4 experts, k = 1 shown)", size=9,
          style="italic")
    ins = tokens(ax, 3.8, 4.75, [TOKEN] * 6, vertical=True, size=0.3, gap=0.12)
    label(ax, 3.95, 5.3, "tokens", size=8)
    box(ax, 4.6, 3.9, 1.6, 1.0, "router\nsoftmax(Wx + noise)", ROUTER, size=8)
    arrow(ax, (4.15, 4.3), (4.6, 4.4))
    box(ax, 4.6, 2.55, 1.6, 0.9, "TOP-k\ngates g(x)", ROUTER, size=8)
    arrow(ax, (5.4, 3.9), (5.4, 3.45))
    label(ax, 5.4, 2.05, "priority order:\nbatch order (vanilla)\nor by max gate (BPR)", size=7.5)
    # buffers: 4 experts with capacity 2
    label(ax, 7.45, 5.25, "dispatch into buffers\n(capacity B_e = round(k N P C / E))", size=8)
    fills = [[TOKEN, TOKEN], [TOKEN, "white"], [TOKEN, TOKEN], ["white", "white"]]
    for e, fill in enumerate(fills):
        yb = 4.35 - e * 0.95
        label(ax, 6.75, yb + 0.15, f"e{e + 1}", size=8)
        tokens(ax, 7.0, yb, fill, size=0.3, gap=0.04)
        box(ax, 8.45, yb - 0.1, 1.3, 0.5, f"expert {e + 1}\n(MLP)", EXPERT, size=7.5)
        arrow(ax, (7.7, yb + 0.15), (8.45, yb + 0.15))
        arrow(ax, (9.75, yb + 0.15), (10.45, 2.75 + (1.5 - e) * 0.3))
        arrow(ax, (6.2, 3.0), (6.95, yb + 0.15), color="#4477aa")
    # dropped token
    ax.add_patch(Rectangle((6.95, 0.75), 0.3, 0.3, facecolor=DROP, edgecolor=EDGE, linewidth=0.8))
    label(ax, 7.35, 0.9, "buffer full: token dropped by its expert,\noutput 0, the residual carries it on",
          size=7.5, ha="left")
    arrow(ax, (6.2, 2.7), (6.98, 1.05), color="#b03030")
    box(ax, 10.45, 2.2, 1.5, 1.1, "combine\nsum_e g_e(x) E_e(x)", ROUTER, size=8)
    arrow(ax, (11.95, 2.75), (12.6, 2.75))
    label(ax, 12.27, 3.2, "to the\nadder +", size=7.5)


def draw_03(ax):
    """Chapter 3: V-MoE's every-other layout; vanilla vs BPR allocation order."""
    label(ax, 6.5, 6.55, "V-MoE: MoE in every other block, and which tokens fill the buffers", size=13,
          weight="bold")
    # left: the stack
    x = 0.6
    box(ax, x, 0.35, 2.6, 0.55, "image -> 16 x 16 patches\n-> patch embedding", TOKEN, size=8)
    names = ["block 0: MLP", "block 1: MoE", "block 2: MLP", "block 3: MoE", "...", "block L-1: MoE"]
    for i, name in enumerate(names):
        y = 1.2 + i * 0.72
        if name == "...":
            label(ax, x + 1.3, y + 0.25, "...", size=12)
            continue
        box(ax, x, y, 2.6, 0.5, name, EXPERT if "MoE" in name else DENSE, size=9,
            weight="bold" if "MoE" in name else "normal")
        arrow(ax, (x + 1.3, y - 0.22 if i else 0.9), (x + 1.3, y))
    box(ax, x, 5.65, 2.6, 0.45, "LayerNorm, pool, head", NORM, size=8)
    arrow(ax, (x + 1.3, 5.3), (x + 1.3, 5.65))
    label(ax, x + 1.3, 0.1, "Every-2 (option: Last-n)", size=8, style="italic")
    # right: allocation
    box(ax, 3.75, 0.35, 9.0, 5.75, color="#fcfcfc", dashed=True)
    label(ax, 8.25, 5.85, "one MoE layer, one group of 8 tokens, k = 1, capacity 3 + 3 (C < 1)", size=9,
          style="italic")
    priority = [0.35, 0.9, 0.5, 0.8, 0.3, 0.95, 0.6, 0.7]  # max gate of each token
    expert = [1, 1, 2, 1, 2, 2, 1, 2]
    shades = ["#%02x%02x%02x" % (int(255 - 180 * p), int(255 - 120 * p), 255) for p in priority]

    def row(y, order, title, why):
        label(ax, 4.0, y + 0.7, title, size=9, ha="left", weight="bold")
        used, dropped = {1: 0, 2: 0}, []
        for slot, i in enumerate(order):
            cx = 4.0 + slot * 0.62
            served = used[expert[i]] < 3
            used[expert[i]] += served
            ax.add_patch(Rectangle((cx, y), 0.5, 0.5, facecolor=shades[i], edgecolor="#b03030" if not served
                                   else EDGE, linewidth=2.0 if not served else 0.8))
            label(ax, cx + 0.25, y + 0.25, f"{priority[i]:.2f}", size=7)
            label(ax, cx + 0.25, y - 0.15, f"e{expert[i]}", size=7)
            if not served:
                dropped.append(f"{priority[i]:.2f}")
                ax.plot([cx, cx + 0.5], [y, y + 0.5], color="#b03030", linewidth=1.5)
                ax.plot([cx, cx + 0.5], [y + 0.5, y], color="#b03030", linewidth=1.5)
        label(ax, 10.1, y + 0.25, f"dropped: {', '.join(dropped)}\n({why})", size=8, ha="left", color="#b03030")

    row(4.3, list(range(8)), "vanilla (App. C, Alg. 1): tokens in batch order", "whoever comes late")
    row(2.5, sorted(range(8), key=lambda i: -priority[i]),
        "BPR (Alg. 2): sorted by priority s(x) = max_e g(x)_e, highest first", "lowest priority")
    label(ax, 4.0, 1.55, "number: the token's top gate (its priority); e1/e2: its chosen expert; each expert\n"
          "serves 3 tokens; crossed out: dropped (the residual carries it). Vanilla drops whoever comes\n"
          "late; BPR drops the tokens the router is least sure of -- the paper's Fig. 7 at small C.",
          size=8, ha="left", va="center")


def draw_04(ax):
    """Chapter 4: LIMoE's one tower."""
    label(ax, 6.5, 6.55, "LIMoE: one shared encoder for image patches and text tokens", size=13, weight="bold")
    label(ax, 6.5, 6.12, "image tokens outnumber text tokens (B/16: 196 vs 16), and both compete for the same "
          "expert buffers", size=8.5)
    box(ax, 0.2, 4.35, 1.6, 0.8, "image\n-> patches", TOKEN, size=9)
    box(ax, 0.2, 1.95, 1.6, 0.8, "caption\n-> subwords", SLOT, size=9)
    box(ax, 2.05, 4.35, 1.5, 0.8, "patch\nembedding", DENSE, size=9)
    box(ax, 2.05, 1.95, 1.5, 0.8, "token\nembedding", DENSE, size=9)
    arrow(ax, (1.8, 4.75), (2.05, 4.75))
    arrow(ax, (1.8, 2.35), (2.05, 2.35))
    box(ax, 3.8, 1.55, 5.55, 4.2, color="#fafafa", dashed=True)
    label(ax, 6.57, 5.5, "one encoder, shared weights, not told which token is text", size=8.5, style="italic")
    tokens(ax, 4.0, 4.75, [TOKEN] * 5 + [SLOT] * 2 + [NORM], size=0.3, gap=0.06, vertical=True)
    label(ax, 4.47, 2.38, "pad", size=6.5, color="#666666")
    label(ax, 2.1, 0.85, "attention is masked: image tokens attend\nto their image, text tokens to their caption;"
          "\npadding (grey) is left out of attention,\npooling and every routing loss", size=7.5)
    arrow(ax, (3.55, 4.75), (4.0, 4.5))
    arrow(ax, (3.55, 2.35), (4.0, 2.3))
    for i, moe in enumerate([False, True, False, True]):
        x = 4.65 + i * 1.17
        box(ax, x, 2.0, 0.95, 3.1, "MoE\nk = 1" if moe else "MLP\nblock", EXPERT if moe else DENSE, size=9,
            weight="bold" if moe else "normal")
        arrow(ax, (x - 0.22 if i else 4.3, 3.55), (x, 3.55))
        if moe:
            arrow(ax, (x + 0.47, 2.0), (x + 0.47, 1.3), dashed=True, color="#b07020")
    label(ax, 6.57, 1.75, "one router per MoE layer for both modalities, BPR during training", size=8)
    box(ax, 4.65, 0.2, 4.45, 1.1, "auxiliary losses: importance + load over all tokens (V-MoE),\n"
        "+ per modality: local entropy (each token confident),\nglobal entropy (the modality uses >= S experts, "
        "tau = log S)", ROUTER, size=7.5)
    box(ax, 9.6, 4.4, 1.6, 0.75, "average over\nimage tokens", NORM, size=8)
    box(ax, 9.6, 1.95, 1.6, 0.75, "average over\ntext tokens", NORM, size=8)
    arrow(ax, (9.1, 3.9), (9.6, 4.6))
    arrow(ax, (9.1, 3.2), (9.6, 2.5))
    box(ax, 11.45, 4.4, 1.3, 0.75, "projection\nW_img", DENSE, size=8)
    box(ax, 11.45, 1.95, 1.3, 0.75, "projection\nW_txt", DENSE, size=8)
    arrow(ax, (11.2, 4.78), (11.45, 4.78))
    arrow(ax, (11.2, 2.33), (11.45, 2.33))
    box(ax, 10.1, 2.95, 2.7, 1.1, "contrastive loss (Eq. 1),\nboth directions,\nlearned temperature", "#f8d0e0",
        size=8)
    arrow(ax, (12.1, 4.4), (12.1, 4.05))
    arrow(ax, (12.1, 2.7), (12.1, 2.95))


def draw_05(ax):
    """Chapter 5: Soft MoE's slots: dispatch softmax over tokens, combine softmax over slots."""
    label(ax, 6.5, 6.55, "Soft MoE: experts work on slots, weighted averages of all tokens", size=13,
          weight="bold")
    m, s = 6, 4  # tokens, slots (n = 2 experts x p = 2 slots)
    # logits grid twice
    def grid(x0, y0, title, note, direction):
        label(ax, x0 + s * 0.35 / 2, y0 + 0.55 + m * 0.35 / 2 + 1.25, title, size=9, weight="bold")
        for i in range(m):
            for j in range(s):
                ax.add_patch(Rectangle((x0 + j * 0.35, y0 + (m - 1 - i) * 0.35), 0.35, 0.35, facecolor=ROUTER
                                       if (i * 7 + j * 3) % 5 in (0, 2) else "#fde9c8", edgecolor=EDGE,
                                       linewidth=0.6))
        if direction == "column":
            ax.add_patch(Rectangle((x0 + 0.35, y0), 0.35, m * 0.35, fill=False, edgecolor="#b03030", linewidth=2))
        else:
            ax.add_patch(Rectangle((x0, y0 + 3 * 0.35), s * 0.35, 0.35, fill=False, edgecolor="#b03030",
                                   linewidth=2))
        label(ax, x0 + s * 0.35 / 2, y0 - 0.35, note, size=7.5, va="top")
        label(ax, x0 - 0.12, y0 + m * 0.35 / 2, "tokens", size=7.5, rotation=90, ha="right")
        label(ax, x0 + s * 0.35 / 2, y0 + m * 0.35 + 0.15, "slots", size=7.5)
    tokens(ax, 0.4, 4.9, [TOKEN] * m, size=0.3, gap=0.05, vertical=True)
    label(ax, 0.75, 5.45, "X: m tokens", size=8)
    box(ax, 1.05, 3.6, 1.25, 0.9, "logits\nX Phi\n(m x n p)", ROUTER, size=8)
    arrow(ax, (0.75, 4.05), (1.05, 4.05))
    grid(2.9, 2.8, "dispatch D", "softmax down each\ncolumn: over tokens", "column")
    arrow(ax, (2.3, 4.05), (2.85, 4.05))
    # slots
    box(ax, 5.05, 3.15, 1.55, 1.8, "slots\nX~ = D^T X\n(n p, D)\neach a weighted\naverage of\nall tokens", SLOT,
        size=7.5)
    arrow(ax, (4.35, 3.85), (5.05, 4.0))
    box(ax, 7.0, 4.35, 1.45, 0.75, "expert 1\nslots 1, 2", EXPERT, size=8)
    box(ax, 7.0, 3.0, 1.45, 0.75, "expert 2\nslots 3, 4", EXPERT, size=8)
    arrow(ax, (6.6, 4.3), (7.0, 4.7))
    arrow(ax, (6.6, 3.8), (7.0, 3.4))
    box(ax, 8.85, 3.45, 1.1, 1.2, "slot\noutputs\nY~", SLOT, size=8)
    arrow(ax, (8.45, 4.7), (8.85, 4.3))
    arrow(ax, (8.45, 3.4), (8.85, 3.8))
    grid(10.25, 2.8, "combine C", "softmax along each\nrow: over slots", "row")
    arrow(ax, (9.95, 4.05), (10.2, 4.05))
    label(ax, 11.75, 4.05, "Y = C Y~\n(m, D): each\ntoken reads\nall slots", size=8, ha="left")
    label(ax, 6.5, 1.35, "Same logits X Phi (inputs and Phi L2-normalised, times a learned scale) for both weights.\n"
          "Every step is differentiable, and no token is dropped.\n"
          "Compare Tokens Choice (each token picks k experts) and Experts Choice (each expert picks its top tokens).",
          size=8.5)


def draw_06(ax):
    """Chapter 6: an MoD block's skip path; standard vs attention router."""
    label(ax, 6.5, 6.55, "Mixture-of-Depths: only the top C P tokens go through the block", size=13,
          weight="bold")
    colors = [TOKEN, DROP, TOKEN, DROP, TOKEN, DROP, DROP, TOKEN]
    ins = tokens(ax, 0.4, 5.4, colors, size=0.3, gap=0.1, vertical=True)
    label(ax, 0.55, 5.95, "P tokens", size=8)
    box(ax, 1.3, 4.3, 2.2, 1.35, "router score r_i\nstandard: x_i W_r\nattention: attention\nreceived in block l-1",
        ROUTER, size=8)
    arrow(ax, (0.85, 4.9), (1.3, 4.95))
    box(ax, 1.3, 2.7, 2.2, 0.9, "top round(C P)\nof r (per image)", ROUTER, size=8.5)
    arrow(ax, (2.4, 4.3), (2.4, 3.6))
    # block on selected
    box(ax, 4.3, 3.3, 4.1, 2.4, color="#fafafa", dashed=True)
    label(ax, 6.35, 5.45, "block, on the C P chosen tokens only", size=8.5, style="italic")
    box(ax, 4.55, 4.25, 1.7, 0.8, "LN, attention\namong chosen", DENSE, size=8)
    box(ax, 6.5, 4.25, 1.7, 0.8, "LN, MLP", DENSE, size=8)
    arrow(ax, (6.25, 4.65), (6.5, 4.65))
    label(ax, 6.35, 3.65, "(each with its residual)", size=7.5)
    arrow(ax, (3.5, 3.15), (4.55, 4.45), "chosen (blue)", size=8, offset=(-0.35, 0.1))
    box(ax, 8.65, 4.15, 2.05, 1.0, "standard: update\nx sigmoid(r_i), W_r's\ngradient; attention:\nupdate as is",
        ROUTER, size=7.5)
    arrow(ax, (8.2, 4.65), (8.65, 4.65))
    box(ax, 10.85, 3.1, 1.45, 1.2, "scatter back\nto their\npositions", NORM, size=8)
    arrow(ax, (10.6, 4.65), (11.3, 4.3))
    # skip path
    ax.plot([2.4, 2.4, 11.6], [2.7, 2.1, 2.1], color="#b03030", linewidth=1.6)
    arrow(ax, (11.6, 2.1), (11.6, 3.1), color="#b03030")
    label(ax, 7.0, 1.8, "skip path: the other P - round(C P) tokens (red) leave the block unchanged -- "
          "no attention, no MLP, no compute", size=8.5, color="#b03030")
    tokens(ax, 12.55, 5.0, [TOKEN if c == TOKEN else "#fbe3e3" for c in colors], size=0.26, gap=0.08,
           vertical=True)
    arrow(ax, (12.3, 3.7), (12.55, 3.7))
    label(ax, 6.5, 0.75, "MoD on every other block; C = 0.5 or 0.125. The attention router (A-MoD) has no "
          "parameters: r_i = mean over heads h and\nquery rows j of A^(l-1)[h, j, i]; the standard router "
          "learns only through the multiplier (Eq. 2: r_i; here\nbounded as sigmoid(r_i), the ranking unchanged).", size=8.5)


def draw_08(ax):
    """Sparse upcycling (chapter 8): a trained dense block becomes an MoE block."""
    label(ax, 6.5, 6.55, "Sparse upcycling: a trained dense block becomes an MoE block", size=13, weight="bold")
    mlp = _pre_ln_block(ax, 0.8, 1.0, "MLP (trained)", DENSE)
    label(ax, 1.9, 0.15, "dense checkpoint", size=9, weight="bold")
    x = 5.4
    box(ax, x - 0.25, 0.75, 7.45, 5.1, color="#fafafa", dashed=True)
    label(ax, x + 3.45, 5.55, "upcycled block: every weight but the router copied", size=9, style="italic")
    box(ax, x, 1.0, 6.9, 0.6, "LN -> self-attention -> +  (copied unchanged)", DENSE, size=9)
    box(ax, x, 1.85, 6.9, 0.4, "LayerNorm (copied)", NORM, size=9)
    box(ax, x, 2.5, 6.9, 0.6, "router: new, random init -> Experts Choice (each expert picks its top tokens)", ROUTER, size=9)
    for e in range(4):
        ex = x + 0.3 + e * 1.7
        box(ax, ex, 3.4, 1.4, 0.8, f"expert {e + 1}\n= MLP copy" if e < 3 else "...\nexpert E", EXPERT, size=8.5)
        arrow(ax, (ex + 0.7, 3.1), (ex + 0.7, 3.4))
        arrow(ax, (ex + 0.7, 4.2), (ex + 0.7, 4.5))
    box(ax, x, 4.5, 6.9, 0.5, "combine (weighted by the gates), +", EXPERT, size=9)
    for y0, y1 in ((1.6, 1.85), (2.25, 2.5)):
        arrow(ax, (x + 3.45, y0), (x + 3.45, y1))
    arrow(ax, (mlp[0] + 1.1, mlp[1]), (x + 0.25, 3.8), "copy the trained MLP\ninto every expert", color="#b07020",
          size=8.5, offset=(0.0, 0.15))
    label(ax, x + 3.45, 0.35, "Continued training teaches the router to split the tokens.", size=8.5)


DIAGRAMS = {"01_vit": draw_01, "02_moe_layer": draw_02, "03_vmoe_bpr": draw_03, "04_limoe": draw_04, "05_soft_moe": draw_05,
            "06_mod": draw_06, "08_upcycling": draw_08}


def render(name: str) -> str:
    """The SVG text of diagram ``name`` (a key of DIAGRAMS); raises ValueError for another name."""
    if name not in DIAGRAMS:
        raise ValueError(f"diagram name {name!r}: allowed are {sorted(DIAGRAMS)}")
    with plt.rc_context(RC):
        fig, ax = _canvas(13.0, 6.9)
        DIAGRAMS[name](ax)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the committed diagrams, write nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the SVG files (default: %(default)s)")
    args = parser.parse_args(argv)
    stale = []
    for name in DIAGRAMS:
        path, text = args.out / f"{name}.svg", render(name)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"differs from a fresh drawing: {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
