"""Box-drawn tables as AWS's neuron-ls prints them, and byte sizes for people."""

from __future__ import annotations


def box(headers: list[str], rows: list[list]) -> str:
    """``+---+`` ruled table: header cells (a newline in one stacks its words, as AWS's "NEURON / DEVICE"),
    then one row per entry (cells left-aligned)."""
    cells = [[str(c) for c in row] for row in rows]
    heads = [h.split("\n") for h in headers]
    depth = max(len(h) for h in heads)
    heads = [h + [""] * (depth - len(h)) for h in heads]
    widths = [max([len(x) for x in h] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(values):
        return "|" + "|".join(f" {v:<{w}} " for v, w in zip(values, widths)) + "|"

    head = [line([h[k].center(w) for h, w in zip(heads, widths)]) for k in range(depth)]
    return "\n".join([rule, *head, rule, *(line(r) for r in cells), rule])


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
