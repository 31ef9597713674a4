//! The admitted rate over time of a warm-up quota after idleness, as a table and an SVG plot.
//!
//! ```text
//! cargo run --example warmup_plot            # prints the table, writes docs/bench/warmup.svg
//! cargo run --example warmup_plot -- OUT.svg # writes the plot elsewhere
//! ```
//!
//! Two front ends of the same curve, 100 requests per second with a 4 s warm-up and cold
//! factor 3, go through the same phases: busy from 0 to 6 s, idle for 3 s, busy again from 9 to
//! 13 s, idle for 7 s, and busy from 20 to 24 s.
//!
//! * a rate limit, `RateLimiter` with `Quota::per_second(100).burst(1).warm_up(..)`, asked
//!   every 100 µs while busy (a flood: what it admits is its limit);
//! * a shaper, `Shaper` with `.warm_up(..)`, with a request always waiting while busy.
//!
//! Everything runs on a manual clock or tokio's paused clock, so the figures are exact and the
//! run takes no real time. The plot shows what each admits per 100 ms, scaled to requests per
//! second: a cold key starts at a third of the rate and reaches it after spending the warm-up
//! period's worth of stored permits; a 3 s pause cools it part way (it resumes at about half
//! the rate), a 7 s pause completely.

use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::Shaper;
use tollgate::{Clock, Quota, RateLimiter};

/// Requests per second when warm.
const RATE: u32 = 100;
/// Busy phases, in seconds: (from, to).
const BUSY: [(f64, f64); 3] = [(0.0, 6.0), (9.0, 13.0), (20.0, 24.0)];
const END: f64 = 24.0;
/// Width of a bucket of the plot, in seconds.
const BUCKET: f64 = 0.1;

/// The times a rate limit with warm-up admits requests, asked every 100 µs during the phases
/// of [`BUSY`], in seconds.
pub fn admissions() -> Vec<f64> {
    let quota = Quota::per_second(RATE)
        .burst(1)
        .warm_up(Duration::from_secs(4), 3);
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<u8>::builder(quota).clock(clock).build();
    let mut out = Vec::new();
    let step = Duration::from_micros(100);
    for (from, to) in BUSY {
        time.set(Duration::from_secs_f64(from));
        while time.now().as_secs_f64() < to {
            if limiter.check(&0).is_allowed() {
                out.push(time.now().as_secs_f64());
            }
            time.advance(step);
        }
    }
    out
}

/// The departure times of a shaper kept busy during the phases of [`BUSY`], in seconds.
pub async fn departures() -> Vec<f64> {
    let shaper = Shaper::<u8>::builder(Quota::per_second(RATE))
        .warm_up(Duration::from_secs(4), 3)
        .build();
    let start = Instant::now();
    let mut out = Vec::new();
    for (from, to) in BUSY {
        tokio::time::sleep_until(start + Duration::from_secs_f64(from)).await;
        loop {
            shaper.until_slot(&0).await;
            let t = start.elapsed().as_secs_f64();
            if t >= to {
                break;
            }
            out.push(t);
        }
    }
    out
}

/// Departures per bucket, scaled to requests per second.
pub fn rates(times: &[f64]) -> Vec<f64> {
    let n = (END / BUCKET).round() as usize;
    let mut counts = vec![0u32; n];
    for &t in times {
        let i = (t / BUCKET) as usize;
        if i < n {
            counts[i] += 1;
        }
    }
    counts.iter().map(|&c| f64::from(c) / BUCKET).collect()
}

/// The plot: the rate per bucket of the rate limit and of the shaper, and the warm rate, as an
/// SVG document.
pub fn svg(limited: &[f64], shaped: &[f64]) -> String {
    let (w, h) = (720.0, 300.0);
    let (left, right, top, bottom) = (50.0, 15.0, 20.0, 40.0);
    let max_rate = f64::from(RATE) * 1.2;
    let x = |t: f64| left + t / END * (w - left - right);
    let y = |r: f64| top + (1.0 - r / max_rate) * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    for (from, to) in BUSY {
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{:.1}" fill="#f0f4ff"/>"##,
            x(from),
            x(to) - x(from),
            h - top - bottom
        );
    }
    for r in [0u32, 25, 50, 75, 100] {
        let yy = y(f64::from(r));
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{r}</text>"##,
            w - right,
            left - 5.0,
            yy + 4.0
        );
    }
    for t in (0..=END as u32).step_by(2) {
        let xx = x(f64::from(t));
        let _ = write!(
            s,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{t}</text>"#,
            h - bottom + 15.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time (s); shaded: a request always waiting</text>"#,
        (left + w - right) / 2.0,
        h - 5.0
    );
    let _ = write!(
        s,
        r#"<text x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle">requests per second</text>"#,
        h / 2.0,
        h / 2.0
    );
    let warm = y(f64::from(RATE));
    let _ = write!(
        s,
        r##"<line x1="{left}" x2="{:.1}" y1="{warm:.1}" y2="{warm:.1}" stroke="#999" stroke-dasharray="4 3"/>"##,
        w - right
    );
    for (rates, colour, dash) in [(shaped, "#e08a1e", "none"), (limited, "#1f5fbf", "5 3")] {
        let mut points = String::new();
        for (i, r) in rates.iter().enumerate() {
            let t0 = i as f64 * BUCKET;
            let _ = write!(
                points,
                "{:.1},{:.1} {:.1},{:.1} ",
                x(t0),
                y(*r),
                x(t0 + BUCKET),
                y(*r)
            );
        }
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="{colour}" stroke-dasharray="{dash}" stroke-width="1.5" points="{}"/>"##,
            points.trim_end()
        );
    }
    let _ = write!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#666">rate 100/s, warm-up 4 s, cold factor 3: <tspan fill="#1f5fbf">rate limit (dashed)</tspan>, <tspan fill="#e08a1e">shaper</tspan></text>"##,
        left + 8.0,
        top + 12.0
    );
    s.push_str("</svg>\n");
    s
}

/// The table printed: what each admitted in each second.
pub fn table(limited: &[f64], shaped: &[f64]) -> String {
    let mut out = String::from("| second | rate limit | shaper |\n|---:|---:|---:|\n");
    let count = |times: &[f64], sec: u32| {
        times
            .iter()
            .filter(|&&t| t >= f64::from(sec) && t < f64::from(sec + 1))
            .count()
    };
    for sec in 0..END as u32 {
        let _ = writeln!(
            out,
            "| {sec}–{} | {} | {} |",
            sec + 1,
            count(limited, sec),
            count(shaped, sec)
        );
    }
    out
}

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/bench/warmup.svg".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    let shaped = runtime.block_on(departures());
    let limited = admissions();
    print!("{}", table(&limited, &shaped));
    if let Err(e) = std::fs::write(&out, svg(&rates(&limited), &rates(&shaped))) {
        eprintln!("could not write {out}: {e}");
        std::process::exit(1);
    }
    println!("plot written to {out}");
}
