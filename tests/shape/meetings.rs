//! A shaping queue inside a rate limit: the queue's refusal gives back what the rate limit
//! took, and is no strike for the rate limit's penalty box.
//!
//! Pins docs/design.md section 3 ("Stacked layers are all or nothing", "The penalty box
//! punishes the client's own traffic").

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::{Clock, Quota, RateLimitLayer, ShapeLayer};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

fn req(key: &str) -> Request<()> {
    Request::get("/").header("x-key", key).body(()).unwrap()
}

fn ok() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

/// The statuses of requests for `key` sent at once, in the order sent.
async fn at_once<S>(svc: &S, key: &'static str, n: usize) -> Vec<u16>
where
    S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(req(key)).await.unwrap().status().as_u16() })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_request_the_shaping_queue_refuses_gives_back_what_the_rate_limit_outside_took() {
    // A burst of 3 a minute outside; one a second inside, one waiting at most.
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Quota::per_minute(1).burst(3)).clock(Clock::tokio()))
        .layer(ShapeLayer::new(Quota::per_second(1)).max_waiting(1))
        .service(ok());
    // One leaves, one waits a second, one finds the queue full.
    assert_eq!(at_once(&svc, "-", 3).await, [200, 200, 429]);
    // The refused one took nothing: the third of the burst is left, and no fourth.
    assert_eq!(at_once(&svc, "-", 1).await, [200]);
    let refused = svc.clone().oneshot(req("-")).await.unwrap();
    assert_eq!(refused.status(), 429);
    // The rate limit's refusal, at 2 s: its burst frees a place at 60 s.
    assert_eq!(refused.headers()["retry-after"], "58");
}

#[tokio::test(start_paused = true)]
async fn a_request_the_shaping_queue_refuses_is_no_strike_for_a_penalty_box_outside() {
    // One strike bans for 10 minutes: any refusal taken for a strike would show.
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(Quota::per_minute(100))
                .key(Header::new("x-key"))
                .clock(Clock::tokio())
                .penalty_box(PenaltyBox::new(1, 60 * SEC, 600 * SEC)),
        )
        .layer(
            ShapeLayer::new(Quota::per_second(1))
                .max_waiting(1)
                .key(Header::new("x-key")),
        )
        .service(ok());
    assert_eq!(at_once(&svc, "a", 5).await, [200, 200, 429, 429, 429]);
    tokio::time::sleep(SEC).await;
    assert_eq!(
        at_once(&svc, "a", 1).await,
        [200],
        "banned by the queue's refusals"
    );
}
