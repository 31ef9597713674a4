#!/usr/bin/env python3
"""Writes BENCHMARKS.md and its SVG plots from the outputs of scripts/benchmarks.

`scripts/report.py --table results.csv` prints the HTTP table alone (scripts/loadtest uses it).
`scripts/report.py --update` puts the HTTP and instruction sections (and docs/bench/notes.md) of
this machine's target/loadtest into the existing BENCHMARKS.md, leaving the other sections.

Inputs (any may be missing; their sections are then left out):
  target/loadtest/results.csv      round,config,requests_per_sec,non_2xx,requests,
                                   cpu_seconds,cpu_us_per_request
  target/loadtest/callgrind.csv    config,instructions,requests,instructions_per_request
                                   (scripts/callgrind_http)
  target/loadtest/memory.txt       output of examples/memory_per_key
  target/loadtest/flood.txt        output of examples/flood
  target/loadtest/shaping.csv      t_seconds,offered_per_sec,forwarded_per_sec
  target/loadtest/shaping.txt      output of bench/benches/shape_realtime.rs
  target/loadtest/redis.txt        output of bench/benches/redis.rs
  target/loadtest/preface.md       a note on the run, pasted under the machine description
  docs/bench/notes.md              the analysis behind the figures, pasted as it is
  target/loadtest/adaptive.md      output of bench/benches/adaptive.rs (its section, as it is)
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
    "noop_layer": "a layer that does nothing (floor of any layer)",
    "floor_fields": "a layer appending the two fields as constants (floor of a layer sending them)",
    "floor_429": "a layer answering 429 with the three fields as constants (floor of a rejecting layer)",
    "tollgate": "`RateLimitLayer` per IP, not limiting (draft fields)",
    "tollgate_noheaders": "`RateLimitLayer` per IP, not limiting, no fields",
    "tollgate_429": "`RateLimitLayer` per IP, every request rejected",
    "governor": "tower_governor, not limiting (no fields)",
    "governor_429": "tower_governor, every request rejected",
    "axgov": "axum-governor, not limiting (draft + X- fields)",
    "axgov_429": "axum-governor, every request rejected",
    "conc_tower": "tower `GlobalConcurrencyLimitLayer`",
    "conc_tollgate": "`ConcurrencyLimitLayer` (body tracked)",
    "shape": "`ShapeLayer` per IP, never delaying",
    "stacked": "the three tollgate layers stacked",
}


def load_runs(path):
    """config -> list of (cpu us per request, req/s), in run order."""
    by = {}
    for r in csv.DictReader(open(path)):
        us = r.get("cpu_us_per_request")
        by.setdefault(r["config"], []).append(
            (float(us) if us else float("nan"), float(r["requests_per_sec"]))
        )
    return by


def http_table(path):
    """The markdown table and ratios of one results.csv, the plot items and the rounds."""
    rows = list(csv.DictReader(open(path)))
    rounds = max(int(r["round"]) for r in rows)
    by = load_runs(path)
    cpu = {c: statistics.median(u for u, _ in v) for c, v in by.items()}
    rps = {c: statistics.median(r for _, r in v) for c, v in by.items()}
    # Each round runs every configuration once, close together in time: a ratio is the median
    # of the ratios within a round, so that the machine getting busier or quieter between
    # rounds (it is shared) moves both sides of a ratio alike.
    per_round = {}
    for row in rows:
        us = row.get("cpu_us_per_request")
        if us:
            per_round.setdefault(row["config"], {})[row["round"]] = float(us)

    def paired(a, b):
        if a not in per_round or b not in per_round:
            return None
        both = [per_round[a][k] / per_round[b][k] for k in per_round[a] if k in per_round[b]]
        return statistics.median(both) if both else None

    def base(c):
        return "plain_429" if c.endswith("_429") and c != "plain_429" else "bare"

    out = [
        "| configuration | CPU µs per request | ratio | spread µs | req/s |",
        "|---|---:|---:|---:|---:|",
    ]
    items = []
    order = [c for c in LABELS if c in by] + [c for c in by if c not in LABELS]
    for c in order:
        b = base(c)
        v = paired(c, b)
        ratio = f"{v:.3f} x {'429' if b == 'plain_429' else 'bare'}" if v is not None else "-"
        us = [u for u, _ in by[c]]
        out.append(
            f"| {LABELS.get(c, c)} (`{c}`) | {cpu[c]:.2f} | {ratio} | "
            f"{min(us):.2f}–{max(us):.2f} | {rps[c]:,.0f} |"
        )
        hl = "reject" if c.endswith("429") else (
            "ours" if "tollgate" in c or c in ("stacked", "shape") else "")
        items.append((LABELS.get(c, c).replace("`", ""), cpu[c] * 1000, hl))

    r = paired

    pairs = [
        ("tollgate", "bare", "RateLimitLayer with fields / bare (aim ≤ 1.03)"),
        ("tollgate_noheaders", "bare", "RateLimitLayer without fields / bare"),
        ("tollgate", "governor", "RateLimitLayer with fields / tower_governor without"),
        ("tollgate", "axgov", "RateLimitLayer / axum-governor (both with fields)"),
        ("tollgate_429", "plain_429", "429 path / axum's own 429 (aim ≤ 1.0)"),
        ("tollgate_429", "governor_429", "429 path / tower_governor's 429 path"),
        ("tollgate_429", "axgov_429", "429 path / axum-governor's 429 path"),
        ("conc_tollgate", "conc_tower", "ConcurrencyLimitLayer / tower's"),
        ("stacked", "bare", "all three stacked / bare"),
        ("noop_layer", "bare", "a layer doing nothing / bare"),
        ("floor_fields", "bare", "a layer appending constant fields / bare"),
        ("tollgate", "floor_fields", "RateLimitLayer with fields / that floor"),
        ("floor_429", "plain_429", "a layer answering 429 from constants / axum's own 429"),
        ("tollgate_429", "floor_429", "429 path / that floor"),
    ]
    out += ["", "| ratio of CPU per request | value |", "|---|---:|"]
    for a, b, label in pairs:
        v = r(a, b)
        if v is not None:
            out.append(f"| {label} | {v:.3f} |")
    parts = ["tollgate", "shape", "conc_tollgate"]
    if all(c in cpu for c in parts + ["stacked", "bare"]):
        each = [cpu[c] - cpu["bare"] for c in parts]
        alone = sum(each)
        stacked = cpu["stacked"] - cpu["bare"]
        out += [
            "",
            f"Stacking: the three layers stacked cost {stacked:.2f} µs per request over bare, "
            f"the three alone {alone:.2f} µs together "
            "(" + " + ".join(f"{x:.2f}" for x in each) + ").",
        ]
    return out, items, rounds



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


def http_section():
    """The HTTP load section (and its plot), if scripts/loadtest has run."""
    lines = []
    res = os.path.join(OUT, "results.csv")
    if os.path.exists(res):
        table, items, rounds = http_table(res)
        lines += [
            "## HTTP load: server CPU per request",
            "",
            "An Axum hello-world on loopback, the server on core 0 (one tokio worker) and",
            f"`wrk -t1 -c32` on core 1; {rounds} rounds, configurations interleaved, medians. The",
            "server's CPU time (utime + stime from `/proc/PID/stat` over the wrk run) divided by",
            "the requests wrk completed is the cost per request; the ratios use it, since wrk on",
            "one core can be the bottleneck and then every configuration reaches about the same",
            "requests/s. Rows answering 429 are set against Axum answering 429 itself, the others",
            "against bare Axum; a ratio is the median over the rounds of the ratio within each",
            "round (a round runs every configuration once, within a minute). The `noop_layer`,",
            "`floor_fields` and `floor_429` rows are floors: layers that decide nothing and send",
            "constants, what any layer (sending these fields) costs on an Axum route.",
            "Spread: lowest and highest run.",
            "Command: `scripts/benchmarks` (or `scripts/loadtest` for this part alone).",
            "",
        ]
        lines += table
        bar_chart(
            os.path.join(PLOTS, "http.svg"),
            "Server CPU per request (median, lower is better)",
            items,
            "ns",
        )
        lines += ["", "![server CPU per request](docs/bench/http.svg)", ""]
    return lines


def callgrind_section():
    """The instructions-per-request section, if scripts/callgrind_http has run."""
    lines = []
    cg = os.path.join(OUT, "callgrind.csv")
    if os.path.exists(cg):
        per = {r["config"]: int(r["instructions_per_request"]) for r in csv.DictReader(open(cg))}

        def base(c):
            return "plain_429" if c.endswith("_429") and c != "plain_429" else "bare"

        lines += [
            "## Instructions per request",
            "",
            "The same server under `valgrind --tool=callgrind`, counters zeroed after a warm-up",
            "and dumped after a `wrk -c1` run: instructions divided by the requests served.",
            "They move by about 1% from run to run (every request pays one wake-up of the server;",
            "the periodic work of the runtime is shared among fewer requests when the machine is busy).",
            "Command: `scripts/callgrind_http` (profiles in `target/callgrind/`).",
            "",
            "| configuration | instructions per request | ratio |",
            "|---|---:|---:|",
        ]
        order = [c for c in LABELS if c in per] + [c for c in per if c not in LABELS]
        for c in order:
            b = base(c)
            ratio = f"{per[c] / per[b]:.3f} x {'429' if b == 'plain_429' else 'bare'}" if b in per else "-"
            lines.append(f"| {LABELS.get(c, c)} (`{c}`) | {per[c]:,} | {ratio} |")
        lines.append("")
    return lines


def splice(doc, heading, section):
    """`doc` with its section `heading` (up to the next `## `) replaced by `section`."""
    start = doc.find("\n" + heading + "\n")
    if start < 0 or not section:
        return doc
    end = doc.find("\n## ", start + 1)
    end = len(doc) if end < 0 else end
    return doc[: start + 1] + "\n".join(section).strip() + "\n\n" + doc[end + 1 :]


def update():
    """Re-measured HTTP figures and instruction counts (and the notes on them) put into the
    existing BENCHMARKS.md, the other sections left as the last full run wrote them."""
    doc = open(DOC).read()
    doc = splice(doc, "## HTTP load: server CPU per request", http_section())
    doc = splice(doc, "## Instructions per request", callgrind_section())
    notes = os.path.join(PLOTS, "notes.md")
    if os.path.exists(notes):
        doc = splice(doc, "## Where the time goes", open(notes).read().strip().splitlines())
    preface = os.path.join(OUT, "preface.md")
    if os.path.exists(preface) and "- Load tool:" in doc.partition("\n## ")[0]:
        head, sep, rest = doc.partition("\n## ")
        intro = head[: head.index("- Load tool:")]
        tool = head[head.index("- Load tool:"):].splitlines()[0]
        doc = intro + tool + "\n\n" + open(preface).read().strip() + "\n" + sep + rest
    with open(DOC, "w") as f:
        f.write(doc)
    print(f"updated {DOC}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        table, _, _ = http_table(sys.argv[2])
        print("\n".join(table))
        return 0
    if len(sys.argv) == 2 and sys.argv[1] == "--update":
        update()
        return 0
    os.makedirs(PLOTS, exist_ok=True)
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip() or platform.processor()
    lines = ["# Benchmarks", ""]
    lines += [
        "Written by `scripts/benchmarks` (do not edit by hand). Every figure below was measured",
        ("on the machine described here (see the note on the run below)"
         if os.path.exists(os.path.join(OUT, "preface.md")) else
         "in one run on the machine described here") +
        "; compare ratios, not absolute numbers.",
        "",
        f"- Machine: {sh('nproc')} cores, {sh('uname -m')}, "
        f"{cpu}",
        f"- Rust: {sh('rustc --version')}",
        f"- Load tool: {sh('wrk -v 2>&1 | head -n1') or 'wrk'}",
        "",
    ]
    preface = os.path.join(OUT, "preface.md")
    if os.path.exists(preface):
        lines += [open(preface).read().strip(), ""]
    lines += http_section() + callgrind_section()
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
    txt = os.path.join(OUT, "shaping.txt")
    if os.path.exists(shp) or os.path.exists(txt):
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
            "(`SHAPING_CSV=target/loadtest/shaping.csv cargo bench -p tollgate-bench --bench shape_realtime`).",
            "",
        ]
        if os.path.exists(os.path.join(PLOTS, "shaping.svg")):
            lines += ["![shaped output](docs/bench/shaping.svg)", ""]
        if os.path.exists(txt):
            lines += ["```text", open(txt).read().strip(), "```", ""]
    rds = os.path.join(OUT, "redis.txt")
    if os.path.exists(rds):
        lines += [
            "## Redis throughput",
            "",
            "Decisions per second through one multiplexed connection, beside `redis-benchmark`",
            "running a trivial `EVALSHA` on the same server in the same run (the floor)",
            "(`cargo bench -p tollgate-bench --bench redis --features redis`).",
            "",
            "```text",
            open(rds).read().strip(),
            "```",
            "",
        ]
    notes = os.path.join(PLOTS, "notes.md")
    if os.path.exists(notes):
        lines += [open(notes).read().strip(), ""]
    adaptive = os.path.join(OUT, "adaptive.md")
    if os.path.exists(adaptive):
        lines += [open(adaptive).read().strip(), ""]
    extra = os.path.join(OUT, "extra.md")
    if os.path.exists(extra):
        lines += [open(extra).read().strip(), ""]
    with open(DOC, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    sys.exit(main())
