//! The client side of shaping: outbound calls to a partner API that allows 10 requests per
//! second wait their turn, so the caller never goes over the limit and never sees a 429.
//!
//! ```text
//! cargo run --example polite_client
//! ```
//!
//! A `tower::service_fn` stands in for the HTTP client (any `Service` works: a hyper- or
//! reqwest-based client, a gRPC channel) and prints when each call goes out. Twenty-five calls
//! are fired at once from five tasks; the timestamps are 100 ms apart. Then a queue consumer
//! waits for its turn in the same queue with `Shaper::until_slot`.

use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::shape::{PoliteLayer, Shaper};
use tollgate::Quota;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let stamp = move || format!("+{:.3}s", started.elapsed().as_secs_f64());

    // The outbound client: a path in, a status out. Replace with a real HTTP client.
    let http_client = service_fn(move |path: String| async move {
        println!("  {}  GET {path}", stamp());
        tokio::time::sleep(Duration::from_millis(30)).await; // the partner answers
        Ok::<_, Infallible>(200u16)
    });

    // One queue for every call through this client: 10 per second, never faster.
    let shaper = Shaper::<()>::new(Quota::per_second(10));
    let client = ServiceBuilder::new()
        .layer(PoliteLayer::with_shaper(shaper.clone()))
        .service(http_client);

    println!("25 calls from 5 tasks at once, shaped to 10 per second (one every 100 ms):");
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
    println!("{answers} answers, none refused, in {}", stamp());

    // A queue consumer sharing the same queue, without Tower.
    println!("A queue consumer on the same queue:");
    for job in 0..3 {
        shaper.until_slot(&()).await;
        println!("  {}  job {job} may call the partner", stamp());
    }
}

fn infallible<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(never) => match never {},
    }
}
