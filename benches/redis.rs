//! Decisions per second on Redis, beside the server's floor for a trivial script.
//!
//! ```text
//! cargo bench --bench redis --features redis
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (install: `apt-get install -y
//! redis-server`), then measures in the same run:
//!
//! * **floor**: `redis-benchmark -c 64` running `EVALSHA` of `return 1` (64 connections, the
//!   least any script call can cost on this server);
//! * **tollgate**: 64 tokio tasks calling `RedisRateLimiter::check` through one shared,
//!   multiplexed connection, each on its own key, with a quota that never rejects (every
//!   decision is one `EVALSHA` of the GCRA script, no deny cache shortcut);
//! * **each quota kind** the same way, one quota per policy that never rejects: GCRA, fixed
//!   window, sliding log (10 000 per second, so each key's sorted set holds the ~1 000 requests
//!   of its last second), sliding counter, and one policy with all four.
//!
//! Prints decisions/s, the ratio to the floor, and p50/p99 latency of each.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::Quota;

const CALLERS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
const FLOOR_REQUESTS: &str = "300000";

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--bind", "127.0.0.1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}): apt-get install -y redis-server")
        });
    let server = Server(child);
    for _ in 0..500 {
        if cli(port, &["PING"]).trim() == "PONG" {
            return (server, port);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not answer on port {port}");
}

fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

struct Figures {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// `redis-benchmark` on `EVALSHA <sha of "return 1"> 0`, 64 connections.
fn floor(port: u16) -> Figures {
    let sha = cli(port, &["SCRIPT", "LOAD", "return 1"]);
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &CALLERS.to_string(), "-n", FLOOR_REQUESTS, "--csv"])
        .args(["EVALSHA", sha.trim(), "0"])
        .output()
        .expect("redis-benchmark (apt-get install -y redis-server)");
    let csv = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = csv
        .lines()
        .find(|l| l.starts_with("\"EVALSHA"))
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {csv}"));
    let cols: Vec<f64> = row
        .split("\",\"")
        .skip(1)
        .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Figures {
        per_sec: cols[0],
        p50_ms: cols[3],
        p99_ms: cols[5],
    }
}

async fn measure(port: u16, name: &str, quotas: Vec<Quota>) -> Figures {
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect("connect")
        .timeout(Duration::from_secs(1));
    let mut builder =
        RedisRateLimiter::<u64>::builder(store, quotas[0].clone()).name(name.to_owned());
    for q in &quotas[1..] {
        builder = builder.quota(q.clone());
    }
    let limiter = builder.build();
    let run = |period: Duration| {
        let tasks: Vec<_> = (0..CALLERS as u64)
            .map(|key| {
                let l = limiter.clone();
                tokio::spawn(async move {
                    let end = Instant::now() + period;
                    let mut lat = Vec::with_capacity(100_000);
                    while Instant::now() < end {
                        let t = Instant::now();
                        let d = l.check(&key).await;
                        lat.push(t.elapsed().as_micros() as u32);
                        assert!(d.is_allowed() && !d.is_degraded());
                    }
                    lat
                })
            })
            .collect();
        async move {
            let start = Instant::now();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.expect("task"));
            }
            (all, start.elapsed())
        }
    };
    let _warm = run(Duration::from_millis(300)).await;
    let (mut lat, took) = run(RUN).await;
    lat.sort_unstable();
    let pct = |p: f64| f64::from(lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]) / 1e3;
    Figures {
        per_sec: lat.len() as f64 / took.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
    }
}

fn main() {
    let (_server, port) = start_server();
    let floor = floor(port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ours = rt.block_on(measure(
        port,
        "bench",
        vec![
            Quota::per_second(1_000_000).burst(1_000_000),
            Quota::per_day(1_000_000_000),
        ],
    ));
    let second = Duration::from_secs(1);
    let gcra = || Quota::per_second(1_000_000).burst(1_000_000);
    let fixed = || Quota::fixed_window(1_000_000, second);
    let log = || Quota::sliding_log(Quota::MAX_LOG_COUNT, second);
    let counter = || Quota::sliding_window(1_000_000, second);
    let kinds: Vec<(&str, Vec<Quota>)> = vec![
        ("kind: GCRA", vec![gcra()]),
        ("kind: fixed window", vec![fixed()]),
        ("kind: sliding log (10 000/s)", vec![log()]),
        ("kind: sliding counter", vec![counter()]),
        (
            "kinds: all four in one policy",
            vec![gcra(), fixed(), log(), counter()],
        ),
    ];
    let per_kind: Vec<(&str, Figures)> = kinds
        .into_iter()
        .enumerate()
        .map(|(i, (label, quotas))| {
            (
                label,
                rt.block_on(measure(port, &format!("kind{i}"), quotas)),
            )
        })
        .collect();
    println!();
    println!("Redis decisions, {CALLERS} concurrent callers, redis-server on 127.0.0.1:{port}");
    println!(
        "{:<48} {:>12} {:>9} {:>9}",
        "", "calls/s", "p50 ms", "p99 ms"
    );
    println!(
        "{:<48} {:>12.0} {:>9.3} {:>9.3}",
        "floor: redis-benchmark EVALSHA 'return 1' (-c 64)",
        floor.per_sec,
        floor.p50_ms,
        floor.p99_ms
    );
    println!(
        "{:<48} {:>12.0} {:>9.3} {:>9.3}",
        "tollgate: check(), 2 quotas, 1 connection", ours.per_sec, ours.p50_ms, ours.p99_ms
    );
    println!("ratio to the floor: {:.2}", ours.per_sec / floor.per_sec);
    for (label, f) in &per_kind {
        println!(
            "{:<48} {:>12.0} {:>9.3} {:>9.3}   ratio {:.2}",
            label,
            f.per_sec,
            f.p50_ms,
            f.p99_ms,
            f.per_sec / floor.per_sec
        );
    }
}
