//! Adaptive concurrency limit against fixed limits, in real time on loopback.
//!
//! A simulated backend behind axum serves `CAPACITY` requests at once in `BASE`; above that,
//! requests queue for its workers and latency grows in proportion (`BASE × in flight /
//! CAPACITY`). `CLIENTS` closed-loop clients (raw HTTP/1.1 keep-alive over TCP; a rejected
//! client waits `BASE` before trying again) keep it at three times its capacity for `SECS` seconds
//! per configuration. Reports p50/p99 latency of the successful requests and goodput, writes
//! `docs/bench/adaptive.svg` (the adaptive limits and latency over time) and the section of
//! BENCHMARKS.md to `target/loadtest/adaptive.md` (for `scripts/report.py`).
//!
//! To tell the limiter's part of the latency from the harness's, the backend also records the
//! time it gave each request (`BASE × max(1, in flight / CAPACITY)`): that is what the limit
//! decides. The rest of what a client sees (loopback, hyper, the scheduling of the clients
//! and the server on the same runtime) is the harness, shown by the best fixed limit, whose
//! backend time is always `BASE`.
//!
//! `cargo bench -p tollgate-bench --bench adaptive` (about 100 s once built).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tollgate::concurrency::{Gradient2, Vegas};
use tollgate::ConcurrencyLimitLayer;

const BASE: Duration = Duration::from_millis(50);
const CAPACITY: usize = 20;
const CLIENTS: usize = 60;
const SECS: u64 = 10;
/// The first second of each run is left out of the figures: the limits settle.
const WARMUP: Duration = Duration::from_secs(1);

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// When each request reached the backend, and the time the backend gave it.
static SERVED: Mutex<Vec<(Instant, Duration)>> = Mutex::new(Vec::new());

async fn backend() -> &'static str {
    let n = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    let latency = if n <= CAPACITY {
        BASE
    } else {
        BASE * n as u32 / CAPACITY as u32
    };
    if let Ok(mut served) = SERVED.lock() {
        served.push((Instant::now(), latency));
    }
    tokio::time::sleep(latency).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    "ok"
}

#[derive(Default)]
struct Stats {
    ok: Vec<Duration>,
    rejected: usize,
}

/// Reads one response; its status.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    let err = |m: &str| std::io::Error::other(m.to_string());
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).map_err(|_| err("head"))?;
            let status: u16 = head
                .get(9..12)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| err("status"))?;
            let len: usize = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            let total = end + 4 + len;
            while buf.len() < total {
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Err(err("closed"));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            buf.drain(..total);
            return Ok(status);
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(err("closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn client(addr: SocketAddr, start: Instant, until: Instant, stats: Arc<Mutex<Stats>>) {
    let mut ok = Vec::new();
    let mut rejected = 0;
    'connect: while Instant::now() < until {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut buf = Vec::with_capacity(1024);
        while Instant::now() < until {
            let t0 = Instant::now();
            if stream
                .write_all(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
                .await
                .is_err()
            {
                continue 'connect;
            }
            let Ok(status) = read_response(&mut stream, &mut buf).await else {
                continue 'connect;
            };
            let counted = t0 >= start + WARMUP;
            if status == 200 {
                if counted {
                    ok.push(t0.elapsed());
                }
            } else {
                if counted {
                    rejected += 1;
                }
                tokio::time::sleep(BASE).await;
            }
        }
    }
    let mut s = stats.lock().unwrap();
    s.ok.extend(ok);
    s.rejected += rejected;
}

struct Row {
    name: String,
    p50: Duration,
    p99: Duration,
    /// p99 of the time the backend gave the requests.
    backend_p99: Duration,
    goodput: f64,
    rejected: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// Serves `app`, runs the clients for `secs`, returns the figures.
async fn run(name: &str, app: Router, clients: usize, secs: u64) -> Row {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let stats = Arc::new(Mutex::new(Stats::default()));
    SERVED.lock().unwrap().clear();
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|_| tokio::spawn(client(addr, start, until, stats.clone())))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    server.abort();
    let mut s = std::mem::take(&mut *stats.lock().unwrap());
    s.ok.sort();
    let mut served: Vec<Duration> = SERVED
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= start + WARMUP && *at < until)
        .map(|(_, d)| *d)
        .collect();
    served.sort();
    let measured = (Duration::from_secs(secs) - WARMUP).as_secs_f64();
    let row = Row {
        name: name.to_string(),
        p50: percentile(&s.ok, 0.50),
        p99: percentile(&s.ok, 0.99),
        backend_p99: percentile(&served, 0.99),
        goodput: s.ok.len() as f64 / measured,
        rejected: s.rejected as f64 / measured,
    };
    // Let the requests still in the backend finish before the next run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    row
}

fn app() -> Router {
    Router::new().route("/", get(backend))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One sample of an adaptive run: seconds since its start, the limit, the latency in ms.
type Trace = Vec<(f64, usize, f64)>;

/// A hand-written SVG: the limits (and the capacity) above, the latencies below; one colour
/// per algorithm.
fn svg(traces: &[(&str, &str, Trace)], no_load_ms: f64) -> String {
    let (w, h, pad) = (720.0, 220.0, 50.0);
    let all = || traces.iter().flat_map(|(_, _, t)| t.iter());
    let t_max = all().map(|t| t.0).fold(1.0, f64::max);
    let l_max = all().map(|t| t.1).max().unwrap_or(1).max(CAPACITY * 2) as f64;
    let ms_max = all().map(|t| t.2).fold(no_load_ms * 3.0, f64::max);
    let x = |t: f64| pad + t / t_max * (w - 2.0 * pad);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        2.0 * h + 20.0
    );
    let mut panel = |top: f64,
                     title: &str,
                     max: f64,
                     series: &[(String, &str)],
                     refs: &[(f64, &str)]| {
        let y = |v: f64| top + h - pad / 2.0 - v / max * (h - pad);
        out += &format!(
            "<text x=\"{pad}\" y=\"{}\" font-weight=\"bold\">{title}</text>\n",
            top + 16.0
        );
        out += &format!(
            "<line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
            y(0.0),
            w - pad,
            y(0.0)
        );
        for i in 0..=4 {
            let v = max * f64::from(i) / 4.0;
            out += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v:.0}</text>\n",
                pad - 4.0,
                y(v) + 4.0
            );
        }
        for (v, label) in refs {
            out += &format!(
                "<line x1=\"{pad}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"gray\" stroke-dasharray=\"4 3\"/><text x=\"{1}\" y=\"{2}\" text-anchor=\"end\" fill=\"gray\">{label}</text>\n",
                y(*v),
                w - pad,
                y(*v) - 3.0
            );
        }
        for (points, color) in series {
            out += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{points}\"/>\n"
            );
        }
    };
    let limits: Vec<(String, &str)> = traces
        .iter()
        .map(|(_, color, trace)| {
            let points = trace
                .iter()
                .map(|(t, l, _)| {
                    let y = 0.0 + h - pad / 2.0 - *l as f64 / l_max * (h - pad);
                    format!("{:.1},{:.1} ", x(*t), y)
                })
                .collect();
            (points, *color)
        })
        .collect();
    let latencies: Vec<(String, &str)> = traces
        .iter()
        .map(|(_, color, trace)| {
            let points = trace
                .iter()
                .map(|(t, _, m)| {
                    let y = h + 20.0 + h - pad / 2.0 - m.min(ms_max) / ms_max * (h - pad);
                    format!("{:.1},{:.1} ", x(*t), y)
                })
                .collect();
            (points, *color)
        })
        .collect();
    let legend: Vec<String> = traces
        .iter()
        .map(|(name, color, _)| format!("<tspan fill=\"{color}\">{name}</tspan>"))
        .collect();
    panel(
        0.0,
        &format!("Adaptive limit over time, s: {}", legend.join(", ")),
        l_max,
        &limits,
        &[(CAPACITY as f64, "backend capacity")],
    );
    panel(
        h + 20.0,
        "Measured latency (average of ~8 requests), ms",
        ms_max,
        &latencies,
        &[
            (no_load_ms, "no-load latency"),
            (2.0 * no_load_ms, "2 × no-load"),
        ],
    );
    for s in 0..=(t_max as u64) {
        out += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{s}</text>\n",
            x(s as f64),
            2.0 * h + 16.0
        );
    }
    out += "</svg>\n";
    out
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut rows = Vec::new();
        // The backend alone, one request at a time.
        let no_load = run("no-load (1 client, no limit)", app(), 1, 3).await;
        let no_load_ms = ms(no_load.p50);
        rows.push(no_load);
        rows.push(run("(a) no limit", app(), CLIENTS, SECS).await);
        // tower's global form: one semaphore however often axum wraps the handler (the
        // per-layer `ConcurrencyLimitLayer` did not limit here at all: 397 req/s at a limit of 5).
        let tower = |n| app().layer(tower::limit::GlobalConcurrencyLimitLayer::new(n));
        rows.push(run("(b) tower ConcurrencyLimit(50), waits", tower(50), CLIENTS, SECS).await);
        rows.push(run("(c) tower ConcurrencyLimit(5), waits", tower(5), CLIENTS, SECS).await);
        rows.push(run("tower ConcurrencyLimit(20), waits", tower(20), CLIENTS, SECS).await);
        let fixed = |n| app().layer(ConcurrencyLimitLayer::new(n));
        rows.push(run("(b') fixed 50 (too high), rejects", fixed(50), CLIENTS, SECS).await);
        rows.push(run("(c') fixed 5 (too low), rejects", fixed(5), CLIENTS, SECS).await);
        rows.push(run("best fixed: 20 (= capacity)", fixed(20), CLIENTS, SECS).await);

        let tight = Gradient2::new(20, 4, 1000).tolerance(1.2);
        let layer = ConcurrencyLimitLayer::new(1000).adaptive(tight);
        rows.push(run("(d') adaptive Gradient2, tolerance 1.2", app().layer(layer), CLIENTS, SECS).await);

        let mut traces = Vec::new();
        let gradient2 = ConcurrencyLimitLayer::new(1000).adaptive(Gradient2::new(20, 4, 1000));
        let vegas = ConcurrencyLimitLayer::new(1000).adaptive(Vegas::new(20, 4, 1000));
        for (name, color, layer) in [
            ("(d) adaptive Gradient2 (defaults)", "steelblue", gradient2),
            ("(e) adaptive Vegas (defaults)", "seagreen", vegas),
        ] {
            let trace = Arc::new(Mutex::new(Vec::new()));
            let (l, tr) = (layer.clone(), trace.clone());
            let sampler = tokio::spawn(async move {
                let start = Instant::now();
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let latency = l.latency().map_or(0.0, ms);
                    tr.lock()
                        .unwrap()
                        .push((start.elapsed().as_secs_f64(), l.limit(), latency));
                }
            });
            rows.push(run(name, app().layer(layer), CLIENTS, SECS).await);
            sampler.abort();
            let trace = trace.lock().unwrap().clone();
            let label = if name.contains("Vegas") { "Vegas" } else { "Gradient2" };
            traces.push((label, color, trace));
        }

        let mut md = String::new();
        md += "## Adaptive concurrency\n\n";
        md += &format!(
            "A simulated backend behind axum on loopback serves {CAPACITY} requests at once in \
             {} ms; above that, requests queue for its workers and latency grows in proportion \
             (`{} ms × in flight / {CAPACITY}`). {CLIENTS} closed-loop clients (HTTP/1.1 \
             keep-alive; a rejected client waits {} ms) drive it at three times its capacity for \
             {SECS} s per configuration, the first second not counted. Latency is that of the \
             successful requests, as the clients see it; goodput is successful requests per \
             second. Command: `cargo bench -p tollgate-bench --bench adaptive`.\n\n",
            BASE.as_millis(),
            BASE.as_millis(),
            BASE.as_millis()
        );
        md += "| configuration | p50 ms | p99 ms | p99 / no-load | backend p99 ms | goodput req/s | goodput / best fixed | rejected req/s |\n";
        md += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
        let best = rows
            .iter()
            .filter(|r| r.name.starts_with("best"))
            .map(|r| r.goodput)
            .fold(0.0, f64::max);
        for r in &rows {
            md += &format!(
                "| {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.0} | {:.2} | {:.0} |\n",
                r.name,
                ms(r.p50),
                ms(r.p99),
                ms(r.p99) / no_load_ms,
                ms(r.backend_p99),
                r.goodput,
                r.goodput / best,
                r.rejected
            );
        }
        let row = |prefix: &str| rows.iter().find(|r| r.name.starts_with(prefix));
        let harness = row("best").map_or(0.0, |r| ms(r.p99) - ms(BASE));
        for prefix in ["(d)", "(e)"] {
            if let Some(r) = row(prefix) {
                md += &format!(
                    "\n{}: p99 / no-load p50 = **{:.2}** (aim ≤ 2), goodput / best fixed limit = \
                     **{:.2}** (aim ≥ 0.9).",
                    r.name,
                    ms(r.p99) / no_load_ms,
                    r.goodput / best
                );
            }
        }
        md += &format!(
            "\n\nThe harness (loopback, hyper, 60 clients and the server on one 2-thread runtime) \
             adds {harness:.1} ms at p99: the best fixed limit's backend time is always {} ms. \
             tower's `ConcurrencyLimit` waits instead of rejecting, so with closed-loop clients \
             its latency is the client count over the throughput (Little's law), whatever the \
             limit.\n\n![adaptive limits and latency over time](docs/bench/adaptive.svg)\n",
            BASE.as_millis()
        );
        println!("\n{md}");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/loadtest");
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(format!("{dir}/adaptive.md"), &md);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bench/adaptive.svg");
        match std::fs::write(path, svg(&traces, no_load_ms)) {
            Ok(()) => println!("wrote {path}"),
            Err(e) => println!("could not write {path}: {e}"),
        }
    });
}
