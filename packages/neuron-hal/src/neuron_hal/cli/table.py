"""Box-drawn tables as AWS's neuron-ls prints them, and byte sizes for people."""

from __future__ import annotations


def box(headers: list[str], rows: list[list]) -> str:
    """``+---+`` ruled table: a header row, then one row per entry (cells left-aligned)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(values):
        return "|" + "|".join(f" {v:<{w}} " for v, w in zip(values, widths)) + "|"

    return "\n".join([rule, line(headers), rule, *(line(r) for r in cells), rule])


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
