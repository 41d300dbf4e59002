"""Markdown cells and tables, and the comparison of regenerated tables with committed ones
(bench/lib/check_reports.sh)."""

import difflib

NONE = "–"
# A cell whose inputs a committed raw file does not record: it matches any committed cell.
UNKNOWN = "(not in the raw data)"


def ms(x, bound=False):
    """Seconds as milliseconds: one decimal below 100 ms, whole ones above; `bound` (a lower
    bound) adds ≥."""
    if x is None:
        return NONE
    s = f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"
    return ("≥ " + s) if bound else s


def fmt_us(x):
    """Seconds as µs below 1 ms, else as ms with two decimals."""
    return NONE if x is None else (f"{x * 1e6:.0f}" if x < 1e-3 else f"{x * 1e3:.2f} ms")


def fmt(x, spec=".1f", unit=""):
    return NONE if x is None else f"{x:{spec}}{unit}"


def ratio(x, y):
    return f"{x / y:.2f}" if (x is not None and y) else NONE


def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def tables(text):
    """The tables of a Markdown text: lists of consecutive lines that start with '|'."""
    out, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def same_line(new, old):
    """Whether a regenerated line matches a committed one; UNKNOWN cells match any cell.
    Returns (matches, unknown cells)."""
    if UNKNOWN not in new:
        return new == old, 0
    a, b = cells(new), cells(old)
    if len(a) != len(b):
        return False, 0
    unknown = sum(1 for x in a if x == UNKNOWN)
    return all(x == y or x == UNKNOWN for x, y in zip(a, b)), unknown


def compare(committed_text, regenerated_text, name):
    """Checks that every table of the regenerated text is one of the committed text's tables,
    line for line (the committed file may have more: hand-written notes). Returns
    (ok, lines of explanation)."""
    old = tables(committed_text)
    new = tables(regenerated_text)
    if not new:
        return False, [f"{name}: nothing regenerated"]
    ok, notes, rows, unknown = True, [], 0, 0
    for t in new:
        match = None
        for o in old:
            if len(o) == len(t) and o[0] == t[0]:
                res = [same_line(a, b) for a, b in zip(t, o)]
                if all(m for m, _ in res):
                    match = sum(u for _, u in res)
                    break
        if match is None:
            ok = False
            # The committed table with the same header, or the first, for the diff.
            near = next((o for o in old if o[0] == t[0]), old[0] if old else [])
            notes.append(f"{name}: a regenerated table differs from the committed one:")
            notes += ["  " + l for l in difflib.unified_diff(
                near, t, "committed", "regenerated", lineterm="", n=1)]
        else:
            rows += len(t) - 2
            unknown += match
    if ok:
        notes.append(f"{name}: {len(new)} table(s), {rows} rows identical"
                     + (f" ({unknown} cells whose inputs the raw data does not record, "
                        "marked unknown)" if unknown else ""))
    return ok, notes
