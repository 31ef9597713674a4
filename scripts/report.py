#!/usr/bin/env python3
"""Writes BENCHMARKS.md and its SVG plots from the outputs of scripts/benchmarks.

Inputs (any may be missing; their sections are then left out):
  target/loadtest/results.csv      round,config,requests_per_sec,non_2xx
  target/loadtest/memory.txt       output of examples/memory_per_key
  target/loadtest/flood.txt        output of examples/flood
  target/loadtest/shaping.csv      t_seconds,offered_per_sec,forwarded_per_sec
  target/loadtest/shaping.txt      output of benches/shape_realtime.rs
  target/loadtest/redis.txt        output of benches/redis.rs
  docs/bench/notes.md              the analysis behind the figures, pasted as it is
  target/loadtest/extra.md         further sections, pasted as they are
"""
import csv
import os
import platform
import statistics
import subprocess
import sys

OUT = "target/loadtest"
DOC = "BENCHMARKS.md"
PLOTS = "docs/bench"

LABELS = {
    "bare": "bare axum",
    "plain_429": "axum answering 429 itself",
    "tollgate": "RateLimitLayer, limit not reached",
    "tollgate_429": "RateLimitLayer, every request rejected",
    "governor": "tower_governor, limit not reached",
    "governor_429": "tower_governor, every request rejected",
    "conc_tollgate": "ConcurrencyLimitLayer (body tracked)",
    "conc_tower": "tower GlobalConcurrencyLimitLayer",
    "stacked": "rate limit + concurrency + shaping",
}


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def bar_chart(path, title, items, unit):
    """items: list of (label, value, highlight)."""
    width, left, bar_h, gap, top = 760, 300, 22, 8, 40
    height = top + len(items) * (bar_h + gap) + 30
    vmax = max(v for _, v, _ in items) or 1
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="13">',
        f'<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="24" font-size="16" font-weight="bold">{title}</text>',
    ]
    for i, (label, v, hl) in enumerate(items):
        y = top + i * (bar_h + gap)
        w = (width - left - 110) * v / vmax
        color = "#d9534f" if hl == "reject" else ("#337ab7" if hl == "ours" else "#999999")
        out.append(f'<text x="{left - 8}" y="{y + 16}" text-anchor="end">{label}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 16}">{v:,.0f} {unit}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def line_chart(path, title, xs, series, unit):
    """series: list of (label, ys, color)."""
    width, height, left, bottom, top, right = 760, 340, 70, 40, 40, 20
    xmax = max(xs) or 1
    ymax = max(max(ys) for _, ys, _ in series) * 1.1 or 1
    px = lambda x: left + (width - left - right) * x / xmax
    py = lambda y: height - bottom - (height - bottom - top) * y / ymax
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="10" y="24" font-size="16" font-weight="bold">{title}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
        f'<text x="{(width) / 2}" y="{height - 8}" text-anchor="middle">seconds</text>',
    ]
    for k in range(0, int(xmax) + 1, 2):
        out.append(f'<text x="{px(k):.1f}" y="{height - bottom + 16}" text-anchor="middle">{k}</text>')
    for k in range(5):
        y = ymax * k / 4
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:,.0f}</text>')
    for i, (label, ys, color) in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        out.append(f'<text x="{width - right - 200}" y="{top + 16 * (i + 1)}" fill="{color}">{label} ({unit})</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    os.makedirs(PLOTS, exist_ok=True)
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip() or platform.processor()
    lines = ["# Benchmarks", ""]
    lines += [
        "Written by `scripts/benchmarks` (do not edit by hand). Every figure below was measured",
        "in one run on the machine described here; compare ratios, not absolute numbers.",
        "",
        f"- Machine: {sh('nproc')} cores, {sh('uname -m')}, "
        f"{cpu}",
        f"- Rust: {sh('rustc --version')}",
        f"- Load tool: {sh('wrk -v 2>&1 | head -n1') or 'wrk'}",
        "",
    ]
    res = os.path.join(OUT, "results.csv")
    if os.path.exists(res):
        rows = list(csv.DictReader(open(res)))
        by = {}
        for r in rows:
            by.setdefault(r["config"], []).append(float(r["requests_per_sec"]))
        rounds = max(int(r["round"]) for r in rows)
        bare = statistics.median(by.get("bare", [0])) or None
        lines += [
            "## HTTP throughput",
            "",
            "An Axum hello-world on loopback, the server on one core (one tokio worker) and",
            f"`wrk -t1 -c32` on the other; {rounds} rounds, configurations interleaved, medians.",
            "Command: `scripts/benchmarks` (or `scripts/loadtest` for this part alone).",
            "",
            "| configuration | median req/s | ratio to bare | runs |",
            "|---|---:|---:|---|",
        ]
        items = []
        for c, v in by.items():
            m = statistics.median(v)
            ratio = f"{m / bare:.3f}" if bare else "-"
            runs = " ".join(f"{x:,.0f}" for x in v)
            lines.append(f"| {LABELS.get(c, c)} (`{c}`) | {m:,.0f} | {ratio} | {runs} |")
            hl = "reject" if c.endswith("429") else ("ours" if "tollgate" in c or c == "stacked" else "")
            items.append((LABELS.get(c, c), m, hl))
        bar_chart(os.path.join(PLOTS, "http.svg"), "Requests per second (median)", items, "req/s")
        lines += ["", "![requests per second](docs/bench/http.svg)", ""]

        def ratio(a, b):
            if a in by and b in by:
                return statistics.median(by[a]) / statistics.median(by[b])
            return None

        pairs = [
            ("tollgate", "bare", "RateLimitLayer / bare (aim ≥ 0.97)"),
            ("tollgate", "governor", "RateLimitLayer / tower_governor (aim ≥ 1)"),
            ("tollgate_429", "bare", "429 path / bare 200 path (aim ≥ 1)"),
            ("tollgate_429", "plain_429", "429 path / axum's own 429"),
            ("tollgate_429", "governor_429", "429 path / tower_governor's 429 path"),
            ("conc_tollgate", "conc_tower", "ConcurrencyLimitLayer / tower's"),
            ("stacked", "bare", "all three stacked / bare"),
        ]
        lines += ["| ratio | value |", "|---|---:|"]
        for a, b, label in pairs:
            r = ratio(a, b)
            if r is not None:
                lines.append(f"| {label} | {r:.3f} |")
        lines.append("")
    mem = os.path.join(OUT, "memory.txt")
    if os.path.exists(mem):
        lines += [
            "## Memory per tracked key",
            "",
            "1 000 000 distinct IPv4 keys (as `PeerIp` makes them) in one `RateLimiter`; resident",
            "set growth divided by keys, then the keys go idle and are evicted.",
            "Command: `cargo run --release --example memory_per_key`.",
            "",
            "```text",
            open(mem).read().strip(),
            "```",
            "",
        ]
    flood = os.path.join(OUT, "flood.txt")
    if os.path.exists(flood):
        lines += [
            "## Key flood",
            "",
            "1 000 000 distinct IPv4 keys into a default `RateLimiter` (max_keys 1 000 000), an",
            "hour of quiet on a manual clock, then 1 000 clients each sending once per simulated",
            "second until only active keys are tracked. No background task: ordinary traffic",
            "sweeps the shards it touches. Command: `cargo run --release --example flood`.",
            "",
            "```text",
            open(flood).read().strip(),
            "```",
            "",
        ]
    shp = os.path.join(OUT, "shaping.csv")
    if os.path.exists(shp):
        rows = list(csv.DictReader(open(shp)))
        xs = [float(r["t_seconds"]) for r in rows]
        line_chart(
            os.path.join(PLOTS, "shaping.svg"),
            "Shaped output against its input",
            xs,
            [
                ("offered", [float(r["offered_per_sec"]) for r in rows], "#999999"),
                ("forwarded", [float(r["forwarded_per_sec"]) for r in rows], "#337ab7"),
            ],
            "req/s",
        )
        lines += [
            "## Shaping precision",
            "",
            "A `ShapeLayer` at 200/s on loopback, driven at 400/s for 10 s with real time",
            "(`SHAPING_CSV=target/loadtest/shaping.csv cargo bench --bench shape_realtime`).",
            "",
            "![shaped output](docs/bench/shaping.svg)",
            "",
        ]
        txt = os.path.join(OUT, "shaping.txt")
        if os.path.exists(txt):
            lines += ["```text", open(txt).read().strip(), "```", ""]
    rds = os.path.join(OUT, "redis.txt")
    if os.path.exists(rds):
        lines += [
            "## Redis throughput",
            "",
            "Decisions per second through one multiplexed connection, beside `redis-benchmark`",
            "running a trivial `EVALSHA` on the same server in the same run (the floor)",
            "(`cargo bench --bench redis --features redis`).",
            "",
            "```text",
            open(rds).read().strip(),
            "```",
            "",
        ]
    notes = os.path.join(PLOTS, "notes.md")
    if os.path.exists(notes):
        lines += [open(notes).read().strip(), ""]
    extra = os.path.join(OUT, "extra.md")
    if os.path.exists(extra):
        lines += [open(extra).read().strip(), ""]
    with open(DOC, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    sys.exit(main())
