//! `RateLimiter::until_ready` with many tasks waiting on one key, against the loop it replaced.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench waiting
//! # shorter, while developing:
//! cargo bench -p tollgate-bench --bench waiting -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Each iteration spawns `n` tasks that each wait for one request on one key of
//! `Quota::per_second(1000).burst(1)`, and runs until all are admitted, on a current-thread
//! runtime with tokio's clock paused (so the `n / 1000` simulated seconds cost no wall time):
//! the figure is the CPU cost of waiting alone.
//!
//! * `fifo_line/n`: `until_ready` (one FIFO line per key; only the head decides and sleeps).
//! * `every_waiter_retries/n`: the loop `until_ready` used to run in every waiting task:
//!   `check`, and on a rejection sleep for its retry time and ask again. Each admission then
//!   wakes every waiter.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tollgate::{Clock, Quota, RateLimiter};

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

fn limiter() -> RateLimiter<u32> {
    RateLimiter::<u32>::builder(Quota::per_second(1000).burst(1))
        .clock(Clock::tokio())
        .build()
}

/// The wait loop every waiting task ran before the line.
async fn every_waiter_retries(limiter: &RateLimiter<u32>, key: &u32) {
    loop {
        let d = limiter.check(key);
        match d.retry_after() {
            None => return,
            Some(wait) => tokio::time::sleep(wait).await,
        }
    }
}

fn run(rt: &tokio::runtime::Runtime, n: u32, fifo: bool) {
    rt.block_on(async {
        let limiter = limiter();
        let mut tasks = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let l = limiter.clone();
            tasks.push(tokio::spawn(async move {
                if fifo {
                    let _ = black_box(l.until_ready(&7).await);
                } else {
                    every_waiter_retries(&l, &7).await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("the task ends");
        }
    });
}

fn waiting(c: &mut Criterion) {
    let mut g = c.benchmark_group("until_ready_one_key");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    for n in [100u32, 1000] {
        let rt = paused_runtime();
        g.bench_with_input(BenchmarkId::new("fifo_line", n), &n, |b, &n| {
            b.iter(|| run(&rt, n, true))
        });
        g.bench_with_input(BenchmarkId::new("every_waiter_retries", n), &n, |b, &n| {
            b.iter(|| run(&rt, n, false))
        });
    }
    g.finish();
}

criterion_group!(benches, waiting);
criterion_main!(benches);
