//! Concurrency limits and shaping changed while serving: permits in flight finish, waiters
//! keep their place, every clone follows.
//!
//! Pins docs/design.md section 1 ("Concurrency limit", "Shaping") and section 3 ("A live quota
//! change").

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::{ConcurrencyLimitLayer, ConfigError};
use tower::{service_fn, Layer, Service, ServiceExt};

type Resp = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>;

fn handler(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_req: Request<()>| async { Ok(Response::new(Full::new(Bytes::from("ok")))) })
}

fn req(key: &str) -> Request<()> {
    Request::get("/").header("x-key", key).body(()).unwrap()
}

async fn send<S>(svc: &S, key: &str) -> Resp
where
    S: Service<Request<()>, Response = Resp, Error = Infallible> + Clone,
{
    svc.clone().oneshot(req(key)).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_lower_max_lets_requests_in_flight_finish_and_admits_none_until_below_it() {
    let layer = ConcurrencyLimitLayer::new(4);
    let handle = layer.handle().unwrap();
    let svc = layer.layer(handler());
    let mut held = Vec::new();
    for _ in 0..4 {
        let r = send(&svc, "-").await;
        assert_eq!(r.status(), StatusCode::OK);
        held.push(r);
    }
    handle.set_max(2).unwrap();
    assert_eq!(
        send(&svc, "-").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    // 4, then 3, then 2 in flight: still not below the new maximum.
    held.pop();
    assert_eq!(
        send(&svc, "-").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    held.pop();
    assert_eq!(
        send(&svc, "-").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    held.pop();
    // One in flight: one more may enter, and no third.
    let r = send(&svc, "-").await;
    assert_eq!(r.status(), StatusCode::OK);
    held.push(r);
    assert_eq!(
        send(&svc, "-").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(layer.in_flight(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_higher_max_admits_waiters_at_once_in_order() {
    let layer = ConcurrencyLimitLayer::new(1).queue(10, Duration::from_secs(10));
    let handle = layer.handle().unwrap();
    let svc = layer.clone().layer(handler());
    let first = send(&svc, "-").await;
    let start = tokio::time::Instant::now();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let r = send(&svc, "-").await;
                (r.status(), start.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(layer.waiting(), 3);
    handle.set_max(3).unwrap();
    let mut admitted = 0;
    for w in waiters {
        let (status, _) = w.await.unwrap();
        admitted += u32::from(status == StatusCode::OK);
    }
    // Two new places for three waiters; the third gets its place when a response ends
    // (each test response ends when dropped in its task).
    assert_eq!(admitted, 3);
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    drop(first);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_limit_follows_the_new_max_for_every_key() {
    let layer = ConcurrencyLimitLayer::new(1).key(Header::new("x-key"));
    let handle = layer.handle().unwrap();
    let a = layer.clone().layer(handler());
    let b = layer.layer(handler());
    let held_a = send(&a, "k1").await;
    assert_eq!(send(&b, "k1").await.status(), StatusCode::TOO_MANY_REQUESTS);
    handle.set_max(2).unwrap();
    let held_b = send(&b, "k1").await;
    assert_eq!(held_b.status(), StatusCode::OK);
    assert_eq!(send(&a, "k1").await.status(), StatusCode::TOO_MANY_REQUESTS);
    let mut k2 = Vec::new();
    for _ in 0..2 {
        k2.push(send(&a, "k2").await);
    }
    assert!(k2.iter().all(|r| r.status() == StatusCode::OK));
    drop((held_a, held_b));
}

#[tokio::test(start_paused = true)]
async fn a_shorter_queue_turns_new_waiters_away_and_keeps_those_in_line() {
    let layer = ConcurrencyLimitLayer::new(1).queue(3, Duration::from_secs(5));
    let handle = layer.handle().unwrap();
    let svc = layer.clone().layer(handler());
    let first = send(&svc, "-").await;
    let start = tokio::time::Instant::now();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, "-").await.status() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    handle.set_queue(1, Duration::from_secs(1)).unwrap();
    // Three wait, one is allowed: a newcomer is turned away, the three stay in line.
    assert_eq!(
        send(&svc, "-").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(layer.waiting(), 3);
    // They keep the 5 s they started with, not the new 1 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(layer.waiting(), 3);
    drop(first);
    for w in waiters {
        assert_eq!(w.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(start.elapsed(), Duration::from_millis(2010));
}

#[tokio::test(start_paused = true)]
async fn invalid_changes_are_refused_and_the_limit_stays() {
    let layer = ConcurrencyLimitLayer::new(2);
    let handle = layer.handle().unwrap();
    assert_eq!(handle.set_max(0), Err(ConfigError::InvalidConcurrency(0)));
    assert!(matches!(
        handle.set_queue(5, Duration::from_secs(1)),
        Err(ConfigError::NotChangeable(_))
    ));
    assert_eq!(handle.max(), 2);
    let svc = layer.layer(handler());
    let _a = send(&svc, "-").await;
    let _b = send(&svc, "-").await;
    assert_eq!(
        send(&svc, "-").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test(start_paused = true)]
async fn a_handle_cannot_be_taken_from_a_layer_applied_without_one() {
    let layer = ConcurrencyLimitLayer::new(2);
    let _svc = layer.layer(handler());
    assert!(matches!(layer.handle(), Err(ConfigError::NotChangeable(_))));
}

#[tokio::test(start_paused = true)]
async fn the_policy_field_follows_the_new_max() {
    let layer = ConcurrencyLimitLayer::new(2).name("conc");
    let handle = layer.handle().unwrap();
    let svc = layer.layer(handler());
    let r = send(&svc, "-").await;
    assert_eq!(
        r.headers()["ratelimit-policy"],
        r#""conc";q=2;qu="concurrent-requests""#
    );
    drop(r);
    handle.set_max(7).unwrap();
    let r = send(&svc, "-").await;
    assert_eq!(
        r.headers()["ratelimit-policy"],
        r#""conc";q=7;qu="concurrent-requests""#
    );
}

mod shaping {
    use std::time::Duration;

    use tokio::time::Instant;
    use tollgate::{Quota, ShapeLayer, Shaper};

    const MS: Duration = Duration::from_millis(1);

    /// Departure times (ms from `start`) of slots taken in order.
    async fn departures(slots: Vec<tollgate::shape::Slot>, start: Instant) -> Vec<u128> {
        let mut tasks = Vec::new();
        for slot in slots {
            tasks.push(tokio::spawn(async move {
                slot.await;
                start.elapsed().as_millis()
            }));
        }
        let mut at = Vec::new();
        for t in tasks {
            at.push(t.await.unwrap());
        }
        at
    }

    #[tokio::test(start_paused = true)]
    async fn a_faster_rate_keeps_the_head_in_place_and_spaces_the_rest_at_the_new_interval() {
        let shaper = Shaper::<u64>::new(Quota::per_second(1));
        let start = Instant::now();
        let slots: Vec<_> = (0..4).map(|_| shaper.until_slot(&1)).collect();
        let run = tokio::spawn(departures(slots, start));
        tokio::time::sleep(500 * MS).await;
        shaper.clone().set_quota(Quota::per_second(10)).unwrap();
        // The first left at 0; the head (due at 1 s) keeps its time; then 100 ms apart.
        assert_eq!(run.await.unwrap(), [0, 1000, 1100, 1200]);
        // A newcomer after the queue drained: one new interval after the last.
        let next = shaper.until_slot(&1);
        next.await;
        assert_eq!(start.elapsed(), 1300 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slower_rate_spaces_waiters_further_apart_without_reordering_them() {
        let shaper = Shaper::<u64>::new(Quota::per_second(10));
        let start = Instant::now();
        let slots: Vec<_> = (0..4).map(|_| shaper.until_slot(&1)).collect();
        let run = tokio::spawn(departures(slots, start));
        tokio::time::sleep(50 * MS).await;
        shaper.set_quota(Quota::per_second(2)).unwrap();
        assert_eq!(run.await.unwrap(), [0, 100, 600, 1100]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_queue_bound_keeps_the_waiters_and_refuses_newcomers() {
        let shaper = Shaper::<u64>::builder(Quota::per_second(10))
            .max_waiting(5)
            .build();
        let start = Instant::now();
        let slots: Vec<_> = (0..5).map(|_| shaper.reserve(&1).unwrap()).collect();
        shaper.set_queue(Some(2), None).unwrap();
        let full = shaper.reserve(&1).unwrap_err();
        // Four wait (the first leaves at once), more than the new bound of two: refused, and
        // told to come back when the first waiter leaves, as for any full queue.
        assert_eq!(full.retry_after(), 100 * MS);
        assert_eq!(departures(slots, start).await, [0, 100, 200, 300, 400]);
        assert!(shaper.reserve(&1).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_handle_changes_the_shaper_and_the_policy_field() {
        let layer = ShapeLayer::new(Quota::per_second(10)).max_waiting(4);
        let handle = layer.handle().unwrap();
        handle.set_quota(Quota::per_second(2)).unwrap();
        handle
            .set_queue(Some(1), Some(Duration::from_secs(1)))
            .unwrap();
        let shaper = layer.shaper().unwrap();
        assert_eq!(shaper.quota(), Quota::per_second(2));
        assert!(handle.set_quota(Quota::per_second(1).burst(1)).is_ok());
        assert!(format!("{shaper:?}").contains("max_queue: Some(1)"));
    }
}
