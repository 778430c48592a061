"""What the table scripts (fast-onset-table.sh, precision-table.sh,
hints-table.sh) share: medians that skip what does not apply, numbers as
docs/simulation.md writes them, the runs a script wrote for each scenario
and variant, and the table of a knob turned off and on."""

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


def knob_table(work, seeds, knob, columns):
    """Prints the table of a knob's runs, off and on (`runs_for_all` with
    variants "false true"): per scenario and variant, the worst account's
    name, then each of `columns`, (heading, key, decimals), as its median,
    and the seeds the medians are over."""
    print(f"| scenario | {knob} | account (worst) | " + " | ".join(h for h, _, _ in columns) + " |")
    print("|---" * (len(columns) + 3) + "|")
    for name in scenarios(work):
        for on in ("false", "true"):
            rows = runs(work, name, on)
            cells = [fmt(med(rows, key), digits) for _, key, digits in columns]
            print(f"| {name} | {'on' if on == 'true' else 'off'} | {rows[0]['account']} | "
                  + " | ".join(cells) + " |")
    if seeds:
        print(f"\nMedians over seeds 1..{seeds}.")
