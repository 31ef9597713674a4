//! Decisions per second on Redis, beside the server's floor for a trivial script.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench redis --features redis
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
//!   window, sliding log (10 000 per second, so each key's sorted set holds the requests of
//!   its last second), sliding counter, and one policy with all four. Measured in
//!   [`ROUNDS`] rounds, the kinds in a turning order; in a round, a kind takes [`SLICES`]
//!   turns with the floor, a floor slice (`redis-benchmark -n` [`SLICE_FLOOR_REQUESTS`],
//!   about a third of a second) and then the kind for as long, so that both see the same
//!   load of the machine, which on a shared one moves within a second. A round's ratio is
//!   the kind's decisions per second over its slices to the floor's over its own; its CPU
//!   ratio, the CPU time a floor request costs (the server's main thread and
//!   `redis-benchmark`) over what a decision costs (the server's main thread and the thread
//!   of this runtime), which the load of the machine moves far less than it moves rates.
//!   Printed per round, and as the median with the least and the most. `REDIS_BENCH=kinds`
//!   runs these rounds alone.
//!
//! * **client floor**: the same 64 tasks sending `EVALSHA` of `return 1` through one
//!   multiplexed `redis` connection, as the store does: what the client and one connection cost
//!   before any script work;
//! * **one hot key** shared by 3 instances (separate connections, 64 tasks spread over them),
//!   with a limit of a million per second (one per µs, the highest rate a Redis quota takes,
//!   which the leased fleet reaches): the memory store, Redis without a lease and Redis with a
//!   [`Lease`](tollgate::redis::Lease) of 50 units for 100 ms, with the Redis calls per
//!   decision counted by `INFO commandstats`.
//!
//! Prints decisions/s, the ratio to the floor, and p50/p99 latency of each.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::redis::{Lease, RedisRateLimiter, RedisStore};
use tollgate::{Quota, RateLimiter};

const CALLERS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
const FLOOR_REQUESTS: &str = "300000";
/// Rounds of the kinds against the floor.
const ROUNDS: usize = 7;
/// Slices of one kind in one round: each a floor slice, then the kind for as long.
const SLICES: usize = 4;
/// Requests of each floor slice (about a third of a second on this machine).
const SLICE_FLOOR_REQUESTS: &str = "25000";

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
    /// The server's own time per `EVALSHA` in the run (`INFO commandstats`), µs.
    server_us: f64,
    /// The CPU time of `redis-benchmark` for the floor, s (0 for the others).
    client_cpu_s: f64,
}

/// Zeroes the server's command statistics.
fn reset_stats(port: u16) {
    cli(port, &["CONFIG", "RESETSTAT"]);
}

/// `EVALSHA` calls and the server's µs per call since the last reset.
fn evalsha_stats(port: u16) -> (u64, f64) {
    let info = cli(port, &["INFO", "commandstats"]);
    let Some(line) = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
    else {
        return (0, 0.0);
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls=") as u64, field("usec_per_call="))
}

/// `EVALSHA` calls and the server's µs in them since the last reset.
fn evalsha_totals(port: u16) -> (f64, f64) {
    let (calls, per_call) = evalsha_stats(port);
    (calls as f64, calls as f64 * per_call)
}

/// `redis-benchmark` on `EVALSHA <sha of "return 1"> 0`, 64 connections, `requests` calls.
fn floor(port: u16, requests: &str) -> Figures {
    let sha = cli(port, &["SCRIPT", "LOAD", "return 1"]);
    reset_stats(port);
    let children = children_cpu_s();
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &CALLERS.to_string(), "-n", requests, "--csv"])
        .args(["EVALSHA", sha.trim(), "0"])
        .output()
        .expect("redis-benchmark (apt-get install -y redis-server)");
    let client_cpu_s = children_cpu_s() - children;
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
        server_us: evalsha_stats(port).1,
        client_cpu_s,
    }
}

/// The CPU time, in s, of this process's children that have ended (`/proc/self/stat`, in
/// clock ticks of 10 ms).
fn children_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // Fields 16 and 17 of the file (cutime, cstime), counted from the state, field 3.
    (fields.get(13).unwrap_or(&0.0) + fields.get(14).unwrap_or(&0.0)) / 100.0
}

/// The CPU time, in s, of a thread (`/proc/<path>/schedstat`, in ns): the server's main
/// thread, which runs every command, or `thread-self`, which runs the tokio runtime here.
fn thread_cpu_s(path: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{path}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e9)
}

/// The redis-server's process id.
fn server_pid(port: u16) -> String {
    cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(|p| p.trim().to_owned())
        .unwrap_or_default()
}

/// Runs `CALLERS` tasks calling `call(task)` for `period`; the latencies in µs and the time.
async fn drive<F, Fut>(period: Duration, call: F) -> (Vec<u32>, Duration)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let tasks: Vec<_> = (0..CALLERS as u64)
        .map(|task| {
            let call = call.clone();
            tokio::spawn(async move {
                let end = Instant::now() + period;
                let mut lat = Vec::with_capacity(100_000);
                while Instant::now() < end {
                    let t = Instant::now();
                    call(task).await;
                    lat.push(t.elapsed().as_micros() as u32);
                }
                lat
            })
        })
        .collect();
    let start = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    (all, start.elapsed())
}

fn figures(mut lat: Vec<u32>, took: Duration, server_us: f64) -> Figures {
    lat.sort_unstable();
    let pct = |p: f64| f64::from(lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]) / 1e3;
    Figures {
        per_sec: lat.len() as f64 / took.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        server_us,
        client_cpu_s: 0.0,
    }
}

/// `EVALSHA` of `return 1` through one multiplexed connection of the `redis` crate.
async fn client_floor(port: u16) -> Figures {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let conn = redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect");
    let script = redis::Script::new("return 1");
    let call = move |_| {
        let mut conn = conn.clone();
        let script = script.clone();
        async move {
            let one: i64 = script.invoke_async(&mut conn).await.expect("evalsha");
            assert_eq!(one, 1);
        }
    };
    let _warm = drive(Duration::from_millis(300), call.clone()).await;
    reset_stats(port);
    let (lat, took) = drive(RUN, call).await;
    figures(lat, took, evalsha_stats(port).1)
}

/// Where one hot key is decided.
#[derive(Clone, Copy)]
enum Hot {
    Memory,
    Redis,
    Leased,
}

/// 3 instances deciding one key, the 64 tasks spread over them; returns the figures and the
/// Redis calls per decision.
async fn hot_key(port: u16, how: Hot) -> (Figures, f64) {
    let quota = Quota::per_second(1_000_000).burst(1_000_000);
    let name = match how {
        Hot::Memory => "hot-memory",
        Hot::Redis => "hot-redis",
        Hot::Leased => "hot-leased",
    };
    let mut redis = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
            .await
            .expect("connect")
            .timeout(Duration::from_secs(1));
        let store = match how {
            Hot::Leased => store.lease(Lease::new(50, Duration::from_millis(100))),
            _ => store,
        };
        redis.push(
            RedisRateLimiter::<u64>::builder(store, quota.clone())
                .name(name)
                .build(),
        );
    }
    // The memory store decides a million a second on one key: its quota never limits.
    let memory = RateLimiter::<u64>::new(Quota::per_second(1_000_000_000).burst(1_000_000_000));
    let call = move |task: u64| {
        let memory = memory.clone();
        let limiter = redis[(task % 3) as usize].clone();
        async move {
            let d = match how {
                Hot::Memory => {
                    let d = memory.check(&0);
                    // Yield as a Redis call would, so the tasks take turns alike.
                    tokio::task::yield_now().await;
                    d
                }
                _ => limiter.check(&0).await,
            };
            assert!(d.is_allowed() && !d.is_degraded(), "{name}: {d:?}");
        }
    };
    let _warm = drive(Duration::from_millis(300), call.clone()).await;
    reset_stats(port);
    let (lat, took) = drive(RUN, call).await;
    let n = lat.len() as f64;
    let (calls, server_us) = evalsha_stats(port);
    (figures(lat, took, server_us), calls as f64 / n)
}

async fn measure(port: u16, name: &str, quotas: Vec<Quota>) -> Figures {
    measure_for(port, name, quotas, RUN).await
}

/// As [`measure`], running for `period`.
async fn measure_for(port: u16, name: &str, quotas: Vec<Quota>, period: Duration) -> Figures {
    let kind = Kind::new(port, name, &quotas).await;
    let _warm = kind.run(Duration::from_millis(300)).await;
    reset_stats(port);
    let (lat, took) = kind.run(period).await;
    figures(lat, took, evalsha_stats(port).1)
}

/// A limiter on one connection, its [`CALLERS`] tasks each on its own key, kept from one run
/// to the next.
struct Kind {
    name: String,
    limiter: RedisRateLimiter<u64>,
}

impl Kind {
    async fn new(port: u16, name: &str, quotas: &[Quota]) -> Self {
        let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
            .await
            .expect("connect")
            .timeout(Duration::from_secs(1));
        let mut builder =
            RedisRateLimiter::<u64>::builder(store, quotas[0].clone()).name(name.to_owned());
        for q in &quotas[1..] {
            builder = builder.quota(q.clone());
        }
        Kind {
            name: name.to_owned(),
            limiter: builder.build(),
        }
    }

    /// The tasks deciding for `period`: every decision's latency in µs, and the time taken.
    async fn run(&self, period: Duration) -> (Vec<u32>, Duration) {
        let tasks: Vec<_> = (0..CALLERS as u64)
            .map(|key| {
                let l = self.limiter.clone();
                tokio::spawn(async move {
                    let end = Instant::now() + period;
                    let mut lat = Vec::with_capacity(100_000);
                    // Decisions not admitted (none expected: a store timeout on a machine
                    // stalled for a second is the one known cause), and the first of them.
                    let mut missed = (0u64, None);
                    while Instant::now() < end {
                        let t = Instant::now();
                        let d = l.check(&key).await;
                        lat.push(t.elapsed().as_micros() as u32);
                        if !d.is_allowed() || d.is_degraded() {
                            missed.0 += 1;
                            missed.1.get_or_insert_with(|| format!("{d:?}"));
                        }
                    }
                    (lat, missed)
                })
            })
            .collect();
        let start = Instant::now();
        let mut all = Vec::new();
        let mut missed = (0u64, None);
        for t in tasks {
            let (lat, (n, first)) = t.await.expect("task");
            all.extend(lat);
            missed.0 += n;
            missed.1 = missed.1.or(first);
        }
        if let (n @ 1.., Some(first)) = missed {
            eprintln!(
                "{}: {n} of {} decisions not admitted, the first: {first}",
                self.name,
                all.len()
            );
        }
        (all, start.elapsed())
    }
}

/// What one round of a kind measured, against its floor.
#[derive(Clone, Copy)]
struct Round {
    /// The kind's decisions per second over the floor's.
    ratio: f64,
    /// The CPU time (the server's and the client's) of a floor request over a decision's.
    cpu_ratio: f64,
    /// The server's µs per call of the kind, and of the floor.
    server_us: f64,
    floor_us: f64,
}

/// One round of `kind`: [`SLICES`] turns of a floor slice and the kind for as long.
async fn round(port: u16, server: &str, kind: &Kind) -> Round {
    let _warm = kind.run(Duration::from_millis(200)).await;
    let (mut floor_n, mut floor_s, mut floor_calls, mut floor_us) = (0.0, 0.0, 0.0, 0.0);
    let (mut kind_n, mut kind_s, mut kind_calls, mut kind_us) = (0.0, 0.0, 0.0, 0.0);
    let (mut floor_cpu, mut kind_cpu) = (0.0, 0.0);
    for _ in 0..SLICES {
        let server_cpu = thread_cpu_s(server);
        let f = floor(port, SLICE_FLOOR_REQUESTS);
        floor_cpu += thread_cpu_s(server) - server_cpu + f.client_cpu_s;
        let requests: f64 = SLICE_FLOOR_REQUESTS.parse().expect("a number");
        let took = requests / f.per_sec;
        floor_n += requests;
        floor_s += took;
        let (calls, us) = evalsha_totals(port);
        floor_calls += calls;
        floor_us += us;
        reset_stats(port);
        let (server_cpu, own_cpu) = (thread_cpu_s(server), thread_cpu_s("thread-self"));
        let (lat, elapsed) = kind.run(Duration::from_secs_f64(took)).await;
        kind_cpu += thread_cpu_s(server) - server_cpu + thread_cpu_s("thread-self") - own_cpu;
        kind_n += lat.len() as f64;
        kind_s += elapsed.as_secs_f64();
        let (calls, us) = evalsha_totals(port);
        kind_calls += calls;
        kind_us += us;
    }
    Round {
        ratio: (kind_n / kind_s) / (floor_n / floor_s),
        cpu_ratio: (floor_cpu / floor_n) / (kind_cpu / kind_n),
        server_us: kind_us / kind_calls,
        floor_us: floor_us / floor_calls,
    }
}

/// The median, least and most of `v`.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let (_server, port) = start_server();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if std::env::var("REDIS_BENCH").map_or(true, |v| v != "kinds") {
        calls_and_hot_key(port, &rt);
    }
    kinds_against_the_floor(port, &rt);
}

/// The floor, `check()` of two GCRA quotas, the client floor and the hot key.
fn calls_and_hot_key(port: u16, rt: &tokio::runtime::Runtime) {
    let floor = floor(port, FLOOR_REQUESTS);
    let ours = rt.block_on(measure(
        port,
        "bench",
        vec![
            Quota::per_second(1_000_000).burst(1_000_000),
            Quota::per_day(1_000_000_000),
        ],
    ));
    let client = rt.block_on(client_floor(port));
    let hot = [
        (
            "hot key: memory store",
            rt.block_on(hot_key(port, Hot::Memory)),
        ),
        (
            "hot key: Redis, no lease",
            rt.block_on(hot_key(port, Hot::Redis)),
        ),
        (
            "hot key: Redis, lease 50 / 100 ms",
            rt.block_on(hot_key(port, Hot::Leased)),
        ),
    ];
    println!();
    println!("Redis decisions, {CALLERS} concurrent callers, redis-server on 127.0.0.1:{port}");
    println!(
        "{:<48} {:>12} {:>9} {:>9} {:>10}",
        "", "calls/s", "p50 ms", "p99 ms", "server µs"
    );
    println!(
        "{:<48} {:>12.0} {:>9.3} {:>9.3}",
        "floor: redis-benchmark EVALSHA 'return 1' (-c 64)",
        floor.per_sec,
        floor.p50_ms,
        floor.p99_ms
    );
    println!(
        "{:<48} {:>12.0} {:>9.3} {:>9.3} {:>10.2}",
        "tollgate: check(), 2 quotas, 1 connection",
        ours.per_sec,
        ours.p50_ms,
        ours.p99_ms,
        ours.server_us
    );
    println!("ratio to the floor: {:.2}", ours.per_sec / floor.per_sec);
    println!(
        "{:<48} {:>12.0} {:>9.3} {:>9.3} {:>10.2}   ratio {:.2}",
        "client floor: EVALSHA 'return 1', 1 connection",
        client.per_sec,
        client.p50_ms,
        client.p99_ms,
        client.server_us,
        client.per_sec / floor.per_sec
    );
    println!(
        "tollgate over the client floor: {:.2}",
        ours.per_sec / client.per_sec
    );
    println!();
    println!("One hot key, 3 instances, {CALLERS} callers, 1 000 000/s burst 1 000 000:");
    for (label, (f, per_decision)) in &hot {
        println!(
            "{:<48} {:>12.0} {:>9.3} {:>9.3} {:>10.2}   Redis calls per decision {:.3}",
            label, f.per_sec, f.p50_ms, f.p99_ms, f.server_us, per_decision
        );
    }
}

/// Each kind against the floor, in rounds.
fn kinds_against_the_floor(port: u16, rt: &tokio::runtime::Runtime) {
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
    // Per kind and round: the ratio to the round's floor, the server's µs per call, and the
    // floor's. The kinds take turns in an order that turns by one each round.
    let runners: Vec<Kind> = kinds
        .iter()
        .enumerate()
        .map(|(i, (_, quotas))| rt.block_on(Kind::new(port, &format!("kind{i}"), quotas)))
        .collect();
    let server = server_pid(port);
    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(); kinds.len()];
    for r in 0..ROUNDS {
        for j in 0..kinds.len() {
            let i = (r + j) % kinds.len();
            rounds[i].push(rt.block_on(round(port, &server, &runners[i])));
        }
    }
    println!();
    println!(
        "Each kind against the floor, {ROUNDS} rounds of {SLICES} turns each of a floor slice \
         (redis-benchmark -c 64 -n {SLICE_FLOOR_REQUESTS}) and the kind for as long; median \
         [least, most], then every round:"
    );
    println!(
        "{:<48} {:>22} {:>22} {:>22} {:>18}",
        "", "ratio to the floor", "CPU ratio", "server µs per call", "floor server µs"
    );
    for ((label, _), r) in kinds.iter().zip(&rounds) {
        let ratio = spread(&r.iter().map(|x| x.ratio).collect::<Vec<_>>());
        let cpu = spread(&r.iter().map(|x| x.cpu_ratio).collect::<Vec<_>>());
        let us = spread(&r.iter().map(|x| x.server_us).collect::<Vec<_>>());
        let floor_us = spread(&r.iter().map(|x| x.floor_us).collect::<Vec<_>>());
        println!(
            "{:<48} {:>6.2} [{:.2}, {:.2}] {:>8.2} [{:.2}, {:.2}] {:>8.2} [{:.2}, {:.2}] {:>8.2} \
             [{:.2}, {:.2}]",
            label,
            ratio.0,
            ratio.1,
            ratio.2,
            cpu.0,
            cpu.1,
            cpu.2,
            us.0,
            us.1,
            us.2,
            floor_us.0,
            floor_us.1,
            floor_us.2
        );
        let each = |f: fn(&Round) -> f64| {
            r.iter()
                .map(|x| format!("{:.2}", f(x)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!("{:<48} rounds: {}", "", each(|x| x.ratio));
        println!("{:<48} CPU:    {}", "", each(|x| x.cpu_ratio));
    }
}
