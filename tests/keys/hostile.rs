#![cfg(feature = "axum")]
//! Hostile input through the HTTP layer: spoofed forwarding headers, garbage header bytes,
//! floods of distinct keys.
//!
//! Pins docs/design.md section 2 and section 3 ("Keyed state").

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use http::{HeaderValue, Request, Response};
use proptest::prelude::*;
use tollgate::key::{ClientIp, Header};
use tollgate::{Clock, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn from_peer(peer: &str, headers: &[(&'static str, &[u8])]) -> Request<Body> {
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{peer}:4000").parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            req.headers_mut().append(*name, v);
        }
    }
    req
}

#[tokio::test(start_paused = true)]
async fn spoofed_forwarding_headers_from_an_untrusted_peer_change_nothing() {
    let layer = RateLimitLayer::new(Quota::per_minute(3))
        .key(ClientIp::new().trust_proxy("10.0.0.0/8"))
        .clock(Clock::tokio());
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let mut statuses = Vec::new();
    for i in 0..6u8 {
        let xff = format!("198.51.100.{i}");
        let fwd = format!("for=203.0.113.{i}");
        let req = from_peer(
            "192.0.2.1",
            &[
                ("x-forwarded-for", xff.as_bytes()),
                ("forwarded", fwd.as_bytes()),
                ("x-real-ip", xff.as_bytes()),
            ],
        );
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        statuses.push(resp.status().as_u16());
    }
    // Every request counted against the untrusted peer itself.
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);

    // From a trusted proxy, each forwarded client has its own bucket.
    for i in 0..6u8 {
        let xff = format!("198.51.100.{i}");
        let req = from_peer("10.0.0.1", &[("x-forwarded-for", xff.as_bytes())]);
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_distinct_keys_stays_under_the_bound() {
    let layer = RateLimitLayer::new(Quota::per_hour(1))
        .key(Header::new("x-api-key"))
        .max_keys(500)
        .clock(Clock::tokio());
    let limiter = layer
        .clone()
        .validate()
        .unwrap()
        .limiter("1-per-1h")
        .unwrap()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    for i in 0..20_000u32 {
        let req = Request::get("/")
            .header("x-api-key", i.to_string())
            .body(Body::empty())
            .unwrap();
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    // The bound is split evenly over shards (rounded up per shard).
    assert!(limiter.len() <= 500 + 256, "{} keys tracked", limiter.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any bytes in the headers extractors read: never a 500, never a panic.
    #[test]
    fn garbage_headers_never_cause_a_server_error(
        xff in prop::collection::vec(any::<u8>(), 0..300),
        fwd in prop::collection::vec(any::<u8>(), 0..300),
        real in prop::collection::vec(any::<u8>(), 0..60),
        api in prop::collection::vec(any::<u8>(), 0..100),
        trusted in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let by_ip = RateLimitLayer::new(Quota::per_second(5))
                .key(ClientIp::new().trust_loopback().trust_private());
            let by_key = RateLimitLayer::new(Quota::per_second(5)).key(Header::new("x-api-key"));
            let svc = ServiceBuilder::new().layer(by_ip).layer(by_key).service_fn(ok);
            let peer = if trusted { "127.0.0.1" } else { "192.0.2.1" };
            let req = from_peer(
                peer,
                &[
                    ("x-forwarded-for", &xff),
                    ("forwarded", &fwd),
                    ("x-real-ip", &real),
                    ("x-api-key", &api),
                ],
            );
            let status = svc.oneshot(req).await.unwrap().status();
            prop_assert!(
                [200, 400, 429].contains(&status.as_u16()),
                "status {}", status
            );
            Ok(())
        })?;
    }
}
