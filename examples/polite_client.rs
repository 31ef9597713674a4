//! The client side of shaping: outbound calls to a partner API that allows 10 requests per
//! second wait their turn, so the caller never goes over the limit and never sees a 429.
//!
//! ```text
//! cargo run --example polite_client
//! ```
//!
//! A `tower::service_fn` stands in for the HTTP client (any `Service` works: a hyper- or
//! reqwest-based client, a gRPC channel) and prints when each call goes out. Twenty-five calls
//! are fired at once from five tasks; they go out 100 ms apart, at +0.000 s to +2.400 s, and
//! all 25 are answered. Then a queue consumer waits for its turn in the same queue with
//! `Shaper::until_slot`: its three jobs go at +2.500, +2.600 and +2.700 s.

use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::Quota;
use tollgate::{PoliteLayer, Shaper};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// The demo: 25 outbound calls from 5 tasks through one polite client, then 3 jobs of a queue
/// consumer in the same queue. `report` is told what happened and when (time since the
/// start); the number of answers is returned. Waiting is on tokio's timer, so the tests run
/// it under a paused clock.
pub async fn demo<R>(report: R) -> usize
where
    R: Fn(Duration, String) + Clone + Send + Sync + 'static,
{
    let started = Instant::now();

    // The outbound client: a path in, a status out. Replace with a real HTTP client.
    let log = report.clone();
    let http_client = service_fn(move |path: String| {
        let log = log.clone();
        async move {
            log(started.elapsed(), format!("GET {path}"));
            tokio::time::sleep(Duration::from_millis(30)).await; // the partner answers
            Ok::<_, Infallible>(200u16)
        }
    });

    // One queue for every call through this client: 10 per second, never faster.
    let shaper = Shaper::<()>::new(Quota::per_second(10));
    let client = ServiceBuilder::new()
        .layer(PoliteLayer::with_shaper(shaper.clone()))
        .service(http_client);

    let tasks: Vec<_> = (0..5)
        .map(|task| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for i in 0..5 {
                    let path = format!("/orders/{}", task * 5 + i);
                    let ready = infallible(client.ready().await);
                    let status = infallible(ready.call(path).await);
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();
    let mut answers = 0;
    for t in tasks {
        answers += t.await.map_or(0, |s| s.len());
    }

    // A queue consumer sharing the same queue, without Tower.
    for job in 0..3 {
        shaper.until_slot(&()).await;
        report(started.elapsed(), format!("job {job} may call the partner"));
    }
    answers
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    println!("25 calls from 5 tasks at once, shaped to 10 per second (one every 100 ms),");
    println!("then a queue consumer on the same queue:");
    let answers = demo(|at, what| println!("  +{:.3}s  {what}", at.as_secs_f64())).await;
    println!(
        "{answers} answers, none refused, in +{:.3}s",
        started.elapsed().as_secs_f64()
    );
}

fn infallible<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(never) => match never {},
    }
}
