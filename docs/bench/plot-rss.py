#!/usr/bin/env python3
"""Plot a CSV of resident memory over time as an SVG line chart.

    plot-rss.py IN.csv OUT.svg [TITLE]

The CSV's first column is seconds; every other column is one process's
resident memory in KiB, headed by its name. Standard library only, so the
soak script needs nothing installed.
"""
import csv
import sys

W, H, L, R, T, B = 760, 360, 70, 20, 40, 50
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "Resident memory"
    with open(src) as f:
        rows = list(csv.reader(f))
    head, rows = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    xs = [float(r[0]) for r in rows]
    series = [[float(r[i]) / 1024 for r in rows] for i in range(1, len(head))]
    xmax = max(xs[-1], 1.0)
    ymax = max(max(s) for s in series) * 1.15 or 1.0
    sx = lambda x: L + (W - L - R) * x / xmax
    sy = lambda y: H - B - (H - T - B) * y / ymax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for k in range(6):
        y = ymax * k / 5
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.0f}</text>')
    for k in range(7):
        x = xmax * k / 6
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 18}" text-anchor="middle">{x / 60:.0f}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">minutes</text>')
    out.append(f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" '
               f'text-anchor="middle">RSS (MiB)</text>')
    for i, s in enumerate(series):
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, s))
        c = COLOURS[i % len(COLOURS)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{pts}"/>')
        out.append(f'<text x="{L + 10 + 150 * i}" y="{T + 4}" fill="{c}">'
                   f'{head[i + 1].removesuffix("_kib")}</text>')
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
