//! The renamed settings where they meet a running layer: the former names of a shaping
//! queue (`max_queue`, `max_delay`, `set_bounds`, and the same words in a settings file)
//! bound a layer that already serves, its handle and a bare `Shaper` exactly as the new
//! ones do; a memory bound set before a Redis store stops the layer with an error that says
//! so, whichever way the layer is used.
//!
//! Pins docs/design.md section 5 (one name for each concept) and section 3 ("Redis").

use std::time::Duration;

#[cfg(any(feature = "serde", feature = "redis"))]
use std::convert::Infallible;

#[cfg(any(feature = "serde", feature = "redis"))]
use bytes::Bytes;
#[cfg(any(feature = "serde", feature = "redis"))]
use http::{Request, Response};
#[cfg(any(feature = "serde", feature = "redis"))]
use tower::{service_fn, Layer};

use tollgate::{Quota, Shaper};

/// Three requests at once at 1 per second through `layer`'s services.
#[cfg(feature = "serde")]
async fn three_at_once(layer: &tollgate::ShapeLayer) -> Vec<http::StatusCode> {
    use tower::ServiceExt;
    let inner =
        service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(Bytes::new())) });
    let svc = layer.layer(inner);
    let (a, b, c) = tokio::join!(
        svc.clone().oneshot(Request::new(())),
        svc.clone().oneshot(Request::new(())),
        svc.clone().oneshot(Request::new(())),
    );
    [a, b, c].into_iter().map(|r| r.unwrap().status()).collect()
}

#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn the_former_queue_names_bound_a_running_shaper_as_the_new_ones_do() {
    use http::StatusCode;
    use tollgate::settings::ShapeSettings;
    use tollgate::ShapeLayer;
    let bounded = [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    let unbounded = [StatusCode::OK; 3];
    let short = Duration::from_millis(1500);
    for way in 0..6 {
        // Room for ten, so that only the change below bounds it.
        let layer = ShapeLayer::new(Quota::per_second(1)).max_waiting(10);
        let handle = layer.handle().unwrap();
        assert_eq!(three_at_once(&layer).await, unbounded, "way {way}");
        tokio::time::sleep(Duration::from_secs(10)).await;
        #[allow(deprecated)]
        match way {
            0 => handle.set_queue(Some(1), None).unwrap(),
            1 => handle.set_bounds(Some(1), None).unwrap(),
            2 => handle.set_queue(None, Some(short)).unwrap(),
            3 => handle.set_bounds(None, Some(short)).unwrap(),
            _ => {
                let text = if way == 4 {
                    r#"{ "rate": { "count": 1, "per": "1s" }, "max_queue": 1 }"#
                } else {
                    r#"{ "rate": { "count": 1, "per": "1s" }, "max_delay": "1500ms" }"#
                };
                let settings: ShapeSettings = serde_json::from_str(text).unwrap();
                handle.apply(&settings).unwrap();
                // The layer a settings file builds is bounded the same way.
                assert_eq!(three_at_once(&settings.layer()).await, bounded, "way {way}");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
        assert_eq!(three_at_once(&layer).await, bounded, "way {way}");
        tokio::time::sleep(Duration::from_secs(10)).await;
        // A rate alone leaves the bounds as they are, whichever words set them.
        let rate: ShapeSettings =
            serde_json::from_str(r#"{ "rate": { "count": 1, "per": "1s" } }"#).unwrap();
        handle.apply(&rate).unwrap();
        assert_eq!(three_at_once(&layer).await, bounded, "way {way}");
        tokio::time::sleep(Duration::from_secs(10)).await;
        // And both kinds of bound are lifted by the former name as by the new one.
        #[allow(deprecated)]
        if way % 2 == 1 {
            handle.set_bounds(None, None).unwrap();
        } else {
            handle.set_queue(None, None).unwrap();
        }
        assert_eq!(three_at_once(&layer).await, unbounded, "way {way}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_bare_shaper_built_or_changed_with_the_former_names_refuses_the_same_wait() {
    let q = || Quota::per_second(1);
    #[allow(deprecated)]
    let shapers: [Shaper<u8>; 4] = [
        Shaper::builder(q()).max_waiting(1).build(),
        Shaper::builder(q()).max_queue(1).build(),
        Shaper::builder(q())
            .max_wait(Duration::from_millis(1500))
            .build(),
        Shaper::builder(q())
            .max_delay(Duration::from_millis(1500))
            .build(),
    ];
    let mut refused = Vec::new();
    for shaper in &shapers {
        let first = shaper.reserve(&7).unwrap();
        let second = shaper.reserve(&7).unwrap();
        refused.push(shaper.reserve(&7).err().map(|full| full.retry_after()));
        drop((first, second));
    }
    // By count: a place frees when the first leaves, in 1 s. By time: the third would wait
    // 2 s, 0.5 s more than it may.
    let (count, time) = (Duration::from_secs(1), Duration::from_millis(500));
    assert_eq!(refused, [Some(count), Some(count), Some(time), Some(time)]);

    // Changed while in use: the former name and the new one give the same answers.
    let mut answers = Vec::new();
    for former in [false, true] {
        let shaper: Shaper<u8> = Shaper::new(q());
        #[allow(deprecated)]
        if former {
            shaper.set_bounds(Some(0), None).unwrap();
        } else {
            shaper.set_queue(Some(0), None).unwrap();
        }
        let first = shaper.reserve(&7).unwrap();
        answers.push(shaper.reserve(&7).err().map(|full| full.retry_after()));
        drop(first);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], Some(Duration::from_secs(1)));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn max_keys_set_before_a_redis_store_stops_every_use_of_the_layer_naming_the_setting() {
    use tollgate::key::Header;
    use tollgate::redis::RedisStore;
    use tollgate::{ConfigError, Policy, RateLimitLayer};
    let store = RedisStore::open("redis://127.0.0.1:1").unwrap();
    let policy = || Policy::new("api", Quota::per_second(1));
    let layer = RateLimitLayer::new(policy())
        .max_keys(10)
        .key(Header::new("x-client"))
        .store(store.clone());
    let err = ConfigError::MemoryOnly("max_keys");
    assert_eq!(layer.limiter("api").unwrap_err(), err);
    assert_eq!(layer.handle().unwrap_err(), err);
    assert_eq!(layer.clone().validate().unwrap_err(), err);
    assert_eq!(
        err.to_string(),
        "max_keys applies to the memory store only; Redis expires idle keys itself"
    );
    // Applied, it stops at once with the same words (the rule of the crate docs).
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let inner = service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Bytes::new()))
        });
        layer.layer(inner)
    }));
    let Err(panic) = applied else {
        panic!("a layer with a memory bound on Redis must not serve");
    };
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains("max_keys applies to the memory store only"),
        "{message}"
    );
    // The bound set on the memory layer and the store replaced by memory again serves.
    let back = RateLimitLayer::new(policy())
        .max_keys(10)
        .store(store)
        .store(tollgate::store::Memory);
    assert!(back.validate().is_ok());
}
