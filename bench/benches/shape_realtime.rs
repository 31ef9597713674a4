//! Real-time check of traffic shaping over loopback: a server with `ShapeLayer` at 200/s is
//! driven at twice that rate for 10 s; the forwarded rate must be within 1% of 200/s.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench shape_realtime
//! ```
//!
//! Binds 127.0.0.1 only, sends a bounded number of requests (one new connection each, with
//! `Connection: close`), and stops by itself after about 12 s. Reports the forwarded rate, the
//! gaps between departures (as the handler sees them) and the answers the clients got.
//!
//! With `SHAPING_CSV=path`, also writes the offered and forwarded rates per half second
//! (`t_seconds,offered_per_sec,forwarded_per_sec`), which `scripts/report.py` plots.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::{Quota, ShapeLayer};

const RATE: u32 = 200;
const OVERLOAD: u32 = 2;
const SECONDS: u64 = 10;

#[derive(Default)]
struct Answers {
    ok: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

fn main() {
    // `cargo bench` passes `--bench`; a test build (`cargo test --benches`) only checks that it
    // builds and starts.
    if !std::env::args().any(|a| a == "--bench") {
        println!("shape_realtime: run with `cargo bench -p tollgate-bench --bench shape_realtime`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => rt.block_on(run()),
        Err(e) => eprintln!("shape_realtime: cannot start a runtime: {e}"),
    }
}

async fn run() {
    let departures = Arc::new(Mutex::new(Vec::<Instant>::with_capacity(4_096)));
    let handler = {
        let departures = departures.clone();
        move || {
            let departures = departures.clone();
            async move {
                lock(&departures).push(Instant::now());
                "ok"
            }
        }
    };
    // Up to one second of requests may wait; beyond that, 429.
    let app = Router::new()
        .route("/", get(handler))
        .layer(ShapeLayer::new(Quota::per_second(RATE)).max_waiting(RATE as usize));
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => return eprintln!("shape_realtime: cannot bind 127.0.0.1: {e}"),
    };
    let Ok(addr) = listener.local_addr() else {
        return eprintln!("shape_realtime: no local address");
    };
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let answers = Arc::new(Answers::default());
    let offered = RATE * OVERLOAD;
    let total = u64::from(offered) * SECONDS;
    let every = Duration::from_secs(1) / offered;
    println!(
        "shape_realtime: ShapeLayer at {RATE}/s on {addr}, offered {offered}/s for {SECONDS} s ({total} requests)"
    );
    let start = tokio::time::Instant::now();
    let start_std = Instant::now();
    let mut clients = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + every * i as u32).await;
        let answers = answers.clone();
        clients.push(tokio::spawn(async move {
            let status = tokio::time::timeout(Duration::from_secs(5), get_status(addr)).await;
            let counter = match status {
                Ok(Some(200)) => &answers.ok,
                Ok(Some(429)) => &answers.refused,
                _ => &answers.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }));
    }
    for c in clients {
        let _ = c.await;
    }
    server.abort();

    let times = lock(&departures).clone();
    report(&times, &answers);
    if let Ok(path) = std::env::var("SHAPING_CSV") {
        // A relative path is taken from the repository's root, where the commands run, not
        // from this package's directory, where cargo runs the bench.
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let path = root.join(path);
        write_series(&path.to_string_lossy(), start_std, every, total, &times);
    }
}

/// Offered and forwarded requests per second, in half-second bins from the first request.
fn write_series(path: &str, start: Instant, every: Duration, total: u64, times: &[Instant]) {
    const BIN: f64 = 0.5;
    let bins = ((SECONDS as f64 + 2.0) / BIN) as usize;
    let mut offered = vec![0u32; bins];
    let mut forwarded = vec![0u32; bins];
    for i in 0..total {
        let t = (every * i as u32).as_secs_f64();
        if let Some(b) = offered.get_mut((t / BIN) as usize) {
            *b += 1;
        }
    }
    for t in times {
        let t = t.saturating_duration_since(start).as_secs_f64();
        if let Some(b) = forwarded.get_mut((t / BIN) as usize) {
            *b += 1;
        }
    }
    let mut csv = String::from("t_seconds,offered_per_sec,forwarded_per_sec\n");
    for i in 0..bins {
        let t = (i as f64 + 1.0) * BIN;
        let per_sec = |n: u32| f64::from(n) / BIN;
        csv.push_str(&format!(
            "{t},{},{}\n",
            per_sec(offered[i]),
            per_sec(forwarded[i])
        ));
    }
    match std::fs::write(path, csv) {
        Ok(()) => println!("  series written to {path}"),
        Err(e) => eprintln!("shape_realtime: cannot write {path}: {e}"),
    }
}

/// One request on a fresh connection; the status code of the answer.
async fn get_status(addr: std::net::SocketAddr) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::with_capacity(512);
    stream.read_to_end(&mut buf).await.ok()?;
    let line = buf.split(|&b| b == b'\r').next()?;
    std::str::from_utf8(line.get(9..12)?).ok()?.parse().ok()
}

fn report(times: &[Instant], answers: &Answers) {
    let n = times.len();
    if n < 2 {
        return println!("shape_realtime: only {n} requests were forwarded");
    }
    let mut times = times.to_vec();
    times.sort();
    let span = times[n - 1] - times[0];
    let rate = (n - 1) as f64 / span.as_secs_f64();
    let error = (rate - f64::from(RATE)) / f64::from(RATE) * 100.0;
    let mut gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    let pct = |p: f64| gaps[((gaps.len() - 1) as f64 * p).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  forwarded {n} in {:.3} s = {rate:.2}/s (configured {RATE}/s, error {error:+.3}%) {}",
        span.as_secs_f64(),
        if error.abs() <= 1.0 {
            "within 1%"
        } else {
            "NOT within 1%"
        }
    );
    println!(
        "  gaps between departures: min {:.3} ms, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms (ideal {:.3} ms)",
        ms(gaps[0]),
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(gaps[gaps.len() - 1]),
        1000.0 / f64::from(RATE)
    );
    // The most departures in any one-second window, against the rate.
    let mut most = 0;
    let mut j = 0;
    for i in 0..n {
        while times[i] - times[j] >= Duration::from_secs(1) {
            j += 1;
        }
        most = most.max(i - j + 1);
    }
    println!("  most departures in any 1 s window: {most} (rate {RATE}/s)");
    println!(
        "  answers: {} × 200, {} × 429, {} failed",
        answers.ok.load(Ordering::Relaxed),
        answers.refused.load(Ordering::Relaxed),
        answers.failed.load(Ordering::Relaxed)
    );
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
