"""What the table scripts (fast-onset-table.sh, precision-table.sh,
hints-table.sh) share: medians that skip what does not apply, numbers as
docs/simulation.md writes them, and the runs a script wrote for each
scenario and variant."""

import json
import os
import statistics


def median(xs):
    """The median of `xs` less its Nones; None when nothing is left."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def med(rows, key):
    """The median of `key` over `rows` (one dict per run)."""
    return median(r[key] for r in rows)


def fmt(x, digits):
    """`x` with `digits` decimals and thin thousands, or "–" for None."""
    if x is None:
        return "–"
    return f"{x:,.{digits}f}".replace(",", " ")


def scenarios(work):
    """The scenarios `runs_for_all` wrote runs of into `work`, sorted."""
    return sorted({f.rsplit("-", 1)[0] for f in os.listdir(work) if f.endswith(".jsonl")})


def runs(work, name, variant):
    """The runs of scenario `name` under `variant`, one JSON value each."""
    with open(f"{work}/{name}-{variant}.jsonl") as f:
        return [json.loads(line) for line in f]
