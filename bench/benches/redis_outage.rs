//! A limit kept in Redis, through an outage: what three instances admit before, while and
//! after Redis is gone, in real time on loopback.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench redis_outage --features redis
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (`--save "" --appendonly no`; install:
//! `apt-get install -y redis-server`). Three limiter instances, each on its own `RedisStore`
//! connection with a 50 ms timeout and `FailMode::Local(Share::one_in(3))`, share one key
//! limited to 300 per second, burst 30; each instance is driven by 8 tasks asking as fast as
//! they can (all 24 tasks on one thread, the other core left to Redis). The timeline:
//!
//! * 0 to 5 s: Redis decides;
//! * at 5 s Redis is killed (`SIGKILL`): each instance decides alone, at 100 per second, burst
//!   10;
//! * at 10 s a fresh `redis-server` starts on the same port, with no state: Redis decides
//!   again, from a full burst;
//! * the run ends at 15 s.
//!
//! Then the same run again with leases on the store (`Lease::new(20, 100 ms)`), about 32 s in
//! all. A decision belongs to the outage when the local fallback made it between the kill and
//! the first decision Redis made again for its instance; else to before or after it (a
//! fallback decision while Redis was up, a call that outlasted the timeout, is counted and
//! reported as such). Prints,
//! per phase, what was admitted per second in all and by each instance, the admissions beside
//! what the quota allows in that time (a full burst plus the rate over the time; during the
//! outage each instance's own scaled burst and rate), the decisions per second and the p50/p99
//! time of a decision and of an admission; then the admissions of each second. Writes
//! `docs/bench/redis_outage.svg` (admitted per second over time, per instance and in all, the
//! outage shaded).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::redis::{FailMode, Lease, RedisRateLimiter, RedisStore, Share};
use tollgate::Quota;

const INSTANCES: usize = 3;
const TASKS: usize = 8;
const RATE: u32 = 300;
const BURST: u32 = 30;
const TIMEOUT: Duration = Duration::from_millis(50);
/// Redis is killed at one phase and started again at two.
const PHASE: Duration = Duration::from_secs(5);
const RUN: Duration = Duration::from_secs(15);
/// The counting resolution.
const BUCKET: Duration = Duration::from_millis(100);
const BUCKETS: usize = 150;
/// Buckets per point of the plot (500 ms).
const PLOT_BIN: usize = 5;
const PHASES: [&str; 3] = [
    "Redis decides",
    "Redis killed: local fallback",
    "Redis restarted, empty",
];
const COLORS: [&str; INSTANCES] = ["steelblue", "seagreen", "darkorange"];

/// A `redis-server` of this bench, killed when dropped.
struct Server {
    port: u16,
    child: Option<Child>,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut server = Server { port, child: None };
        server.restart();
        server
    }

    /// Kills the server at once, as a crash would.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A fresh server on the same port, with no state; returns once it answers `PING`.
    fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): apt-get install -y redis-server")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pong() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn pong(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the tasks of a run share.
struct Shared {
    /// Set by the control thread: 0 until the kill, 1 until the fresh server answers, 2.
    phase: AtomicU8,
    /// `[instance × BUCKETS + bucket]`, by the time a decision ends.
    admitted: Vec<AtomicU64>,
    /// `[phase × INSTANCES + instance]`.
    phase_admitted: Vec<AtomicU64>,
    phase_decided: Vec<AtomicU64>,
    /// Per instance, ns from the start to the end of its first decision by Redis after the
    /// restart.
    back: Vec<AtomicU64>,
}

impl Shared {
    fn new() -> Shared {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        Shared {
            phase: AtomicU8::new(0),
            admitted: zeros(INSTANCES * BUCKETS),
            phase_admitted: zeros(3 * INSTANCES),
            phase_decided: zeros(3 * INSTANCES),
            back: (0..INSTANCES).map(|_| AtomicU64::new(u64::MAX)).collect(),
        }
    }
}

fn count(v: &[AtomicU64], i: usize) -> u64 {
    v[i].load(Ordering::Relaxed)
}

/// The phase of a decision not made by the local fallback (by Redis, from its deny cache or
/// a lease): before or after the outage, by when it ended.
fn phase_of(phase_at_end: u8, since: Duration) -> usize {
    match phase_at_end {
        0 => 0,
        // Redis answering between the kill's mark and its death, or the fresh server
        // answering before the control thread saw it up.
        1 if since < PHASE + PHASE / 2 => 0,
        _ => 2,
    }
}

/// The time of each decision in ns, by phase.
type Lat = [Vec<u32>; 3];

/// A decision of the local fallback.
struct Local {
    instance: usize,
    /// When it ended, ns from the start.
    at: u64,
    /// ns.
    took: u32,
    allowed: bool,
}

/// What one task saw: the time of each decision and of each admission not made by the local
/// fallback, by phase, and the fallback's decisions.
#[derive(Default)]
struct Seen {
    lat: Lat,
    admitted: Lat,
    local: Vec<Local>,
}

/// One task of one instance: decisions as fast as it can until the end.
async fn flood(
    limiter: RedisRateLimiter<u64>,
    instance: usize,
    start: Instant,
    shared: Arc<Shared>,
) -> Seen {
    let mut seen = Seen::default();
    let add = |v: &[AtomicU64], i: usize| v[i].fetch_add(1, Ordering::Relaxed);
    loop {
        let t = Instant::now();
        if t >= start + RUN {
            return seen;
        }
        let d = limiter.check(&0).await;
        let done = Instant::now();
        let since = done - start;
        let took = u32::try_from((done - t).as_nanos()).unwrap_or(u32::MAX);
        let at = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        let bucket = (since.as_nanos() / BUCKET.as_nanos()) as usize;
        if d.is_allowed() {
            add(
                &shared.admitted,
                instance * BUCKETS + bucket.min(BUCKETS - 1),
            );
        }
        if d.is_local() {
            seen.local.push(Local {
                instance,
                at,
                took,
                allowed: d.is_allowed(),
            });
        } else {
            let phase = phase_of(shared.phase.load(Ordering::Relaxed), since);
            seen.lat[phase].push(took);
            add(&shared.phase_decided, phase * INSTANCES + instance);
            if d.is_allowed() {
                add(&shared.phase_admitted, phase * INSTANCES + instance);
                seen.admitted[phase].push(took);
            }
            if phase == 2 {
                shared.back[instance].fetch_min(at, Ordering::Relaxed);
            }
        }
        // Rejections known to the deny cache and local decisions need no I/O: let the other
        // tasks (and the runtime's drivers) run.
        tokio::task::yield_now().await;
    }
}

/// The figures of one phase.
struct Phase {
    /// Seconds.
    from: f64,
    to: f64,
    admitted: [u64; INSTANCES],
    decided: u64,
    /// Decisions of the local fallback while Redis was up (a call over the timeout).
    slow: u64,
    /// The time of a decision.
    p50_us: f64,
    p99_us: f64,
    /// The time of an admission.
    admitted_p50_us: f64,
    admitted_p99_us: f64,
    /// Lower percentiles of the time of a decision.
    p10_us: f64,
    p25_us: f64,
    /// What the quota allows in the phase: a full burst plus the rate over its time (each
    /// instance at its share during the outage).
    allowance: f64,
}

struct Run {
    label: &'static str,
    phases: Vec<Phase>,
    /// Admitted per bucket, per instance.
    buckets: Vec<[u64; INSTANCES]>,
    killed_at: f64,
    back_at: f64,
    /// Seconds from the restart to each instance's first decision by Redis.
    redis_again: [f64; INSTANCES],
    /// Requests served from leases, per instance.
    leased: [u64; INSTANCES],
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    f64::from(sorted[i]) / 1e3
}

async fn run(label: &'static str, lease: Option<Lease>) -> Run {
    let mut server = Server::start();
    let url = format!("redis://127.0.0.1:{}", server.port);
    let quota = Quota::per_second(RATE).burst(BURST);
    let share = Share::one_in(INSTANCES as u32);
    let mut limiters = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::connect(&url)
            .await
            .expect("connect")
            .timeout(TIMEOUT)
            .on_failure(FailMode::Local(share));
        let store = match lease {
            Some(lease) => store.lease(lease),
            None => store,
        };
        limiters.push(
            RedisRateLimiter::<u64>::builder(store, quota.clone())
                .name("outage")
                .try_build()
                .expect("a valid limiter"),
        );
    }
    let shared = Arc::new(Shared::new());
    let start = Instant::now();
    let control = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            std::thread::sleep((start + PHASE).saturating_duration_since(Instant::now()));
            // Marked before the signal: every decision Redis misses from here on is the
            // outage's.
            shared.phase.store(1, Ordering::Relaxed);
            let killed = start.elapsed();
            server.kill();
            std::thread::sleep((start + 2 * PHASE).saturating_duration_since(Instant::now()));
            server.restart();
            let back = start.elapsed();
            shared.phase.store(2, Ordering::Relaxed);
            (server, killed, back)
        })
    };
    let tasks: Vec<_> = (0..INSTANCES * TASKS)
        .map(|i| {
            let instance = i % INSTANCES;
            tokio::spawn(flood(
                limiters[instance].clone(),
                instance,
                start,
                shared.clone(),
            ))
        })
        .collect();
    let (mut lat, mut lat_admitted, mut local) = (Lat::default(), Lat::default(), Vec::new());
    for t in tasks {
        let seen = t.await.expect("a flood task");
        for (all, mine) in lat.iter_mut().zip(seen.lat) {
            all.extend(mine);
        }
        for (all, mine) in lat_admitted.iter_mut().zip(seen.admitted) {
            all.extend(mine);
        }
        local.extend(seen.local);
    }
    let (server, killed, back) = control.join().expect("the control thread");
    drop(server);
    let (killed_at, back_at) = (killed.as_secs_f64(), back.as_secs_f64());
    let killed_ns = u64::try_from(killed.as_nanos()).unwrap_or(u64::MAX);
    let end_ns = u64::try_from(RUN.as_nanos()).unwrap_or(u64::MAX);
    // Each instance's first decision by Redis after the restart ends its outage.
    let again: [u64; INSTANCES] =
        std::array::from_fn(|i| shared.back[i].load(Ordering::Relaxed).min(end_ns));
    let mut admitted: [[u64; INSTANCES]; 3] = std::array::from_fn(|p| {
        std::array::from_fn(|i| count(&shared.phase_admitted, p * INSTANCES + i))
    });
    let mut decided: [u64; 3] = std::array::from_fn(|p| {
        (0..INSTANCES)
            .map(|i| count(&shared.phase_decided, p * INSTANCES + i))
            .sum()
    });
    // The fallback's decisions outside the outage: a call to Redis that took longer than the
    // timeout, while Redis was up.
    let mut slow = [0u64; 3];
    for l in &local {
        let phase = if (killed_ns..=again[l.instance]).contains(&l.at) {
            1
        } else {
            let p = if l.at < killed_ns { 0 } else { 2 };
            slow[p] += 1;
            p
        };
        decided[phase] += 1;
        lat[phase].push(l.took);
        if l.allowed {
            admitted[phase][l.instance] += 1;
            lat_admitted[phase].push(l.took);
        }
    }
    let secs = |ns: u64| ns as f64 / 1e9;
    let first_redis = again.iter().copied().min().map_or(f64::NAN, secs);
    let last_redis = again.iter().copied().max().map_or(f64::NAN, secs);
    let bounds = [
        (0.0, killed_at),
        (killed_at, last_redis),
        (first_redis, RUN.as_secs_f64()),
    ];
    let (rate, burst, share) = (f64::from(RATE), f64::from(BURST), share.get());
    let phases = bounds
        .iter()
        .zip(lat.iter_mut().zip(lat_admitted.iter_mut()))
        .enumerate()
        .map(|(p, (&(from, to), (lat, lat_admitted)))| {
            lat.sort_unstable();
            lat_admitted.sort_unstable();
            let allowance = if p == 1 {
                // Each instance from its own full local burst, at its share, until Redis
                // decides for it again.
                again
                    .iter()
                    .map(|&a| (burst * share).floor() + rate * share * (secs(a) - killed_at))
                    .sum()
            } else {
                burst + rate * (to - from)
            };
            Phase {
                from,
                to,
                admitted: admitted[p],
                decided: decided[p],
                slow: slow[p],
                p50_us: percentile(lat, 0.50),
                p99_us: percentile(lat, 0.99),
                admitted_p50_us: percentile(lat_admitted, 0.50),
                admitted_p99_us: percentile(lat_admitted, 0.99),
                p10_us: percentile(lat, 0.10),
                p25_us: percentile(lat, 0.25),
                allowance,
            }
        })
        .collect();
    let buckets = (0..BUCKETS)
        .map(|b| std::array::from_fn(|i| count(&shared.admitted, i * BUCKETS + b)))
        .collect();
    let redis_again = std::array::from_fn(|i| {
        let ns = shared.back[i].load(Ordering::Relaxed);
        if ns == u64::MAX {
            f64::NAN
        } else {
            ns as f64 / 1e9 - back_at
        }
    });
    let leased = std::array::from_fn(|i| limiters[i].leased());
    Run {
        label,
        phases,
        buckets,
        killed_at,
        back_at,
        redis_again,
        leased,
    }
}

/// The phase table of a run, in Markdown.
fn table(run: &Run) -> String {
    let mut md = format!("{}:\n\n", run.label);
    md += "| phase | s | admitted/s, all | per instance | limit | admitted / allowance | decisions/s | p50 / p99 µs | admitted: p50 / p99 µs |\n";
    md += "|---|---|---:|---|---:|---:|---:|---:|---:|\n";
    for (i, p) in run.phases.iter().enumerate() {
        let secs = p.to - p.from;
        let all: u64 = p.admitted.iter().sum();
        let each: Vec<String> = p
            .admitted
            .iter()
            .map(|&a| format!("{:.0}", a as f64 / secs))
            .collect();
        let limit = if i == 1 {
            format!("{} × {}", INSTANCES, RATE / INSTANCES as u32)
        } else {
            RATE.to_string()
        };
        let _ = writeln!(
            md,
            "| {} | {:.2}–{:.2} | {:.0} | {} | {limit} | {all} / {:.0} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} |",
            PHASES[i],
            p.from,
            p.to,
            all as f64 / secs,
            each.join(" / "),
            p.allowance,
            p.decided as f64 / secs,
            p.p50_us,
            p.p99_us,
            p.admitted_p50_us,
            p.admitted_p99_us,
        );
    }
    let again: Vec<String> = run
        .redis_again
        .iter()
        .map(|s| format!("{:.0} ms", s * 1e3))
        .collect();
    let _ = write!(
        md,
        "\nKilled at {:.3} s, answering again at {:.3} s; first decision by Redis after the \
         restart, per instance: {}.",
        run.killed_at,
        run.back_at,
        again.join(", ")
    );
    let outage = &run.phases[1];
    let _ = write!(
        md,
        " The fallback's decisions took p10 {:.1} ms, p25 {:.1} ms, p50 {:.1} ms, p99 {:.1} ms.",
        outage.p10_us / 1e3,
        outage.p25_us / 1e3,
        outage.p50_us / 1e3,
        outage.p99_us / 1e3
    );
    let _ = write!(
        md,
        " Decided by the fallback while Redis was up (a call over the {} ms timeout): {} \
         before the outage, {} after.",
        TIMEOUT.as_millis(),
        run.phases[0].slow,
        run.phases[2].slow
    );
    if run.leased.iter().any(|&n| n > 0) {
        let leased: Vec<String> = run.leased.iter().map(u64::to_string).collect();
        let _ = write!(md, " Served from leases: {}.", leased.join(" / "));
    }
    md.push('\n');
    md
}

/// Admitted per second by each instance and in all, one line per second.
fn per_second(run: &Run) -> String {
    let mut out = format!("{}, admitted per second (instances, all):\n", run.label);
    let per = (1.0 / BUCKET.as_secs_f64()) as usize;
    for (s, chunk) in run.buckets.chunks(per).enumerate() {
        let each: [u64; INSTANCES] =
            std::array::from_fn(|i| chunk.iter().map(|b| b[i]).sum::<u64>());
        let _ = writeln!(
            out,
            "{s:>3}-{:<3} {:>5} {:>5} {:>5}  {:>5}",
            s + 1,
            each[0],
            each[1],
            each[2],
            each.iter().sum::<u64>()
        );
    }
    out
}

/// One panel per run: admitted per second (per `PLOT_BIN` buckets) of each instance and in
/// all, the outage shaded, the limit and the fallback's share marked.
fn svg(runs: &[Run]) -> String {
    let (w, h, pad, right) = (720.0, 240.0, 50.0, 110.0);
    let bin = BUCKET.as_secs_f64() * PLOT_BIN as f64;
    let secs = RUN.as_secs_f64();
    let rates = |run: &Run| -> Vec<[f64; INSTANCES + 1]> {
        run.buckets
            .chunks(PLOT_BIN)
            .map(|c| {
                let each: [f64; INSTANCES] =
                    std::array::from_fn(|i| c.iter().map(|b| b[i]).sum::<u64>() as f64 / bin);
                let all = each.iter().sum();
                [each[0], each[1], each[2], all]
            })
            .collect()
    };
    let max = runs
        .iter()
        .flat_map(|r| rates(r).into_iter().map(|v| v[INSTANCES]))
        .fold(f64::from(RATE) * 1.3, f64::max);
    let max = (max / 100.0).ceil() * 100.0;
    let x = |t: f64| pad + t / secs * (w - pad - right);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        runs.len() as f64 * h + 20.0
    );
    for (k, run) in runs.iter().enumerate() {
        let top = k as f64 * h;
        let y = |v: f64| top + h - pad / 2.0 - v / max * (h - pad);
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#eeeeee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"gray\">Redis down</text>",
            x(run.killed_at),
            y(max),
            x(run.back_at) - x(run.killed_at),
            y(0.0) - y(max),
            (x(run.killed_at) + x(run.back_at)) / 2.0,
            y(max) + 14.0
        );
        let legend: Vec<String> = COLORS
            .iter()
            .enumerate()
            .map(|(i, c)| format!("<tspan fill=\"{c}\">instance {}</tspan>", i + 1))
            .chain(std::iter::once(
                "<tspan fill=\"black\">all</tspan>".to_owned(),
            ))
            .collect();
        let _ = writeln!(
            out,
            "<text x=\"{pad}\" y=\"{}\" font-weight=\"bold\">{}: admitted per second ({} ms bins): {}</text>",
            top + 16.0,
            run.label,
            (bin * 1e3).round(),
            legend.join(", ")
        );
        let _ = writeln!(
            out,
            "<line x1=\"{pad}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"black\"/>",
            y(0.0),
            x(secs)
        );
        for i in 0..=(max / 100.0) as u32 {
            let v = 100.0 * f64::from(i);
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
                pad - 4.0,
                y(v) + 4.0
            );
        }
        for (v, label) in [
            (f64::from(RATE), "limit".to_owned()),
            (
                f64::from(RATE) / INSTANCES as f64,
                format!("1/{INSTANCES} of the limit"),
            ),
        ] {
            let _ = writeln!(
                out,
                "<line x1=\"{pad}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"gray\" stroke-dasharray=\"4 3\"/><text x=\"{2}\" y=\"{3:.1}\" fill=\"gray\">{label}</text>",
                y(v),
                x(secs),
                x(secs) + 6.0,
                y(v) + 4.0
            );
        }
        let rates = rates(run);
        for (series, color) in COLORS.iter().chain(["black"].iter()).enumerate() {
            // Steps: each bin's rate held over its width.
            let mut points = String::new();
            for (b, r) in rates.iter().enumerate() {
                let (t0, t1) = (b as f64 * bin, (b + 1) as f64 * bin);
                let _ = write!(
                    points,
                    "{:.1},{:.1} {:.1},{:.1} ",
                    x(t0),
                    y(r[series]),
                    x(t1),
                    y(r[series])
                );
            }
            let width = if series == INSTANCES { 2.0 } else { 1.2 };
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" points=\"{points}\"/>"
            );
        }
        for s in (0..=secs as u64).step_by(1) {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{s}</text>",
                x(s as f64),
                y(0.0) + 14.0
            );
        }
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">seconds</text>",
        x(secs / 2.0),
        runs.len() as f64 * h + 14.0
    );
    out += "</svg>\n";
    out
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let runs = [
        rt.block_on(run("no lease", None)),
        rt.block_on(run(
            "lease 20 / 100 ms",
            Some(Lease::new(20, Duration::from_millis(100))),
        )),
    ];
    println!();
    println!(
        "One key, {RATE}/s burst {BURST}, {INSTANCES} instances × {TASKS} tasks, timeout {} ms, \
         local fallback at 1/{INSTANCES}",
        TIMEOUT.as_millis()
    );
    for run in &runs {
        println!();
        print!("{}", table(run));
    }
    for run in &runs {
        println!();
        print!("{}", per_second(run));
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/bench/redis_outage.svg"
    );
    match std::fs::write(path, svg(&runs)) {
        Ok(()) => println!("\nwrote {path}"),
        Err(e) => println!("\ncould not write {path}: {e}"),
    }
}
