//! The fields of a request the local fallback decided while Redis was unreachable, held by
//! its handler while the layer's handle changes the policy: the fallback counts its changes
//! with the Redis limiter, so the request is answered with the scaled fields of the policy
//! that judged it over at most seven changes, and with those of the policy in force over
//! eight or more, as a request Redis decided is (`RateLimitHandle`'s docs).
//!
//! Pins docs/design.md section 2 (`RateLimit-Policy` and `RateLimit`) and section 3
//! ("Redis": fall back locally as configured; "A live quota change").
#![cfg(feature = "redis")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tollgate::redis::{FailMode, RedisStore};
use tollgate::Quota;
use tower::{Layer, ServiceExt};

use crate::common::account::rig::manual;
use crate::common::race::Handled;
use crate::common::redis_server::free_port;
use crate::common::stores::{layer, Boxed};

/// (q, r) of a request of cost 1 decided by the fallback at half of `per_minute(8)`, held
/// while the policy becomes `per_minute(16 + 2 i)` for each of `changes` changes, then
/// answered with a counted failure.
async fn over(changes: u32) -> (String, String) {
    let (clock, _time) = manual();
    let store = RedisStore::open(&format!("redis://127.0.0.1:{}", free_port()))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .on_failure(FailMode::local(0.5));
    let l = layer(&[Quota::per_minute(8)], "api", &clock).store(store);
    let handle = l.handle_of();
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicBool::new(false));
    let handler = {
        let (gate, entered) = (gate.clone(), entered.clone());
        tower::service_fn(move |_: Request<()>| {
            let (gate, entered) = (gate.clone(), entered.clone());
            async move {
                entered.store(true, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                let mut resp = Response::new(Full::new(Bytes::new()));
                *resp.status_mut() = StatusCode::UNAUTHORIZED;
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let app = Boxed::new(l.layer(handler));
    let req = Request::post("/").header("x-key", "k").body(()).unwrap();
    let task = tokio::spawn(app.oneshot(req));
    while !entered.load(Ordering::SeqCst) {
        tokio::task::yield_now().await;
    }
    for i in 0..changes {
        handle
            .set_default_quotas([Quota::per_minute(16 + 2 * i)])
            .unwrap();
    }
    gate.add_permits(1);
    let resp = task.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let field = |name: &str| resp.headers()[name].to_str().unwrap().to_owned();
    (field("ratelimit-policy"), field("ratelimit"))
}

#[tokio::test]
async fn a_request_the_fallback_decided_keeps_the_scaled_fields_of_its_policy_over_seven_changes() {
    for n in [0, 1, 3, 7] {
        assert_eq!(
            over(n).await,
            ("\"api\";q=4;w=60".to_owned(), "\"api\";r=3;t=15".to_owned()),
            "over {n} change(s)"
        );
    }
}

#[tokio::test]
async fn a_request_the_fallback_decided_gets_the_scaled_fields_in_force_over_eight_changes() {
    for n in [8, 9] {
        let (policy, _) = over(n).await;
        let q = 8 + n - 1;
        assert_eq!(policy, format!("\"api\";q={q};w=60"), "over {n} changes");
    }
}
