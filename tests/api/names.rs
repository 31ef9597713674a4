//! The public names: the same setting has the same name on every layer, the former names
//! still work (deprecated) and do the same, and a bad setting comes out as a `ConfigError`
//! by the one rule of the crate docs ("Bad settings").
//!
//! Pins docs/design.md section 5 (one place, and one name, for each concept).

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::key::Metadata;
use tollgate::{ConcurrencyLimitLayer, ConfigError, MissingKey, Quota, ShapeLayer};
use tower::{service_fn, Layer, ServiceExt};

fn ok_service(
) -> impl tower::Service<Request<()>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

async fn policy_field(layer: ConcurrencyLimitLayer) -> String {
    let svc = layer.layer(ok_service());
    let res = svc.oneshot(Request::new(())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_concurrency_limit_is_named_with_name_and_the_former_policy_header_does_the_same() {
    let named = policy_field(ConcurrencyLimitLayer::new(8).name("db")).await;
    assert_eq!(named, r#""db";q=8;qu="concurrent-requests""#);
    #[allow(deprecated)]
    let former = policy_field(ConcurrencyLimitLayer::new(8).policy_header("db")).await;
    assert_eq!(former, named);
}

/// Three requests at once at 1 per second: the first leaves now, the second waits 1 s, the
/// third would be the second waiting and would wait 2 s.
async fn statuses(layer: ShapeLayer) -> Vec<StatusCode> {
    let inner = service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(bytes::Bytes::new()))
    });
    let svc = layer.layer(inner);
    let (a, b, c) = tokio::join!(
        svc.clone().oneshot(Request::new(())),
        svc.clone().oneshot(Request::new(())),
        svc.clone().oneshot(Request::new(())),
    );
    [a, b, c].into_iter().map(|r| r.unwrap().status()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_shaping_queue_is_bounded_by_the_words_of_a_concurrency_queue() {
    let expected = [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    let rate = || ShapeLayer::new(Quota::per_second(1));
    let long = Duration::from_secs(10);
    let short = Duration::from_millis(1500);

    // At most one waiting.
    assert_eq!(statuses(rate().queue(1, long)).await, expected);
    assert_eq!(statuses(rate().max_waiting(1)).await, expected);
    // None waiting longer than 1.5 s.
    assert_eq!(statuses(rate().queue(5, short)).await, expected);
    assert_eq!(statuses(rate().max_wait(short)).await, expected);
    // The former names set the same bounds.
    #[allow(deprecated)]
    let (by_count, by_time) = (rate().max_queue(1), rate().max_delay(short));
    assert_eq!(statuses(by_count).await, expected);
    assert_eq!(statuses(by_time).await, expected);
}

#[cfg(feature = "serde")]
#[test]
fn shape_settings_read_the_queue_words_and_the_former_field_names() {
    use tollgate::settings::ShapeSettings;
    let new: ShapeSettings = serde_json::from_str(
        r#"{ "rate": { "count": 5, "per": "1s" }, "max_waiting": 3, "max_wait": "2s" }"#,
    )
    .unwrap();
    let former: ShapeSettings = serde_json::from_str(
        r#"{ "rate": { "count": 5, "per": "1s" }, "max_queue": 3, "max_delay": "2s" }"#,
    )
    .unwrap();
    assert_eq!(new.max_waiting, Some(3));
    assert_eq!(new.max_wait, Some(Duration::from_secs(2)));
    assert_eq!(former, new);
    // Written back in the new words.
    let written = serde_json::to_string(&former).unwrap();
    assert!(written.contains(r#""max_waiting":3"#), "{written}");
    assert!(written.contains(r#""max_wait":"2s""#), "{written}");
}

#[test]
fn a_bad_metadata_name_is_a_config_error_naming_it() {
    assert_eq!(
        Metadata::try_new("x-key-bin").unwrap_err(),
        ConfigError::InvalidMetadataName("x-key-bin".into())
    );
    assert_eq!(
        Metadata::try_new("bad name").unwrap_err(),
        ConfigError::InvalidMetadataName("bad name".into())
    );
    assert!(Metadata::try_new("x-tenant").is_ok());
}

#[test]
fn the_panicking_form_panics_with_the_error_the_try_form_returns() {
    let err = MissingKey::<()>::try_reject(200).unwrap_err();
    assert_eq!(err, ConfigError::InvalidStatus(200));
    let panic = std::panic::catch_unwind(|| MissingKey::<()>::reject(200)).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert_eq!(*message, format!("tollgate: {err}"));

    let err = Metadata::try_new("x-key-bin").unwrap_err();
    let panic = std::panic::catch_unwind(|| Metadata::new("x-key-bin")).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert_eq!(*message, format!("tollgate: {err}"));
}

#[test]
fn a_layer_setter_never_panics_and_validate_names_the_setting() {
    // Each of these would panic when applied; built and validated, they return the error.
    let layer = ConcurrencyLimitLayer::new(0).name("db");
    assert_eq!(
        layer.validate().unwrap_err(),
        ConfigError::InvalidConcurrency(0)
    );
    let layer = ConcurrencyLimitLayer::new(1).name("not \"quoted\"");
    assert!(matches!(
        layer.validate().unwrap_err(),
        ConfigError::InvalidName(_)
    ));
    let layer = ShapeLayer::new(Quota::per_second(1)).max_keys(0);
    assert_eq!(layer.validate().unwrap_err(), ConfigError::ZeroMaxKeys);
}

#[test]
fn every_handle_applies_its_settings_with_apply_and_the_former_set_policy_does_the_same() {
    use tollgate::{Policy, RateLimitLayer};
    let layer = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
        .tier(Policy::new("pro", Quota::per_second(100)));
    let handle = layer.handle().unwrap();
    handle
        .apply(&Policy::new("pro", Quota::per_second(50).burst(200)))
        .unwrap();
    assert_eq!(
        handle.policy("pro").unwrap().quotas(),
        [Quota::per_second(50).burst(200)]
    );
    #[allow(deprecated)]
    handle
        .set_policy(Policy::new("free", Quota::per_second(20)))
        .unwrap();
    assert_eq!(
        handle.policy("free").unwrap().quotas(),
        [Quota::per_second(20)]
    );
    // An unknown tier changes nothing, by either name.
    let gold = Policy::new("gold", Quota::per_second(1));
    assert_eq!(
        handle.apply(&gold).unwrap_err(),
        ConfigError::UnknownTier("gold".into())
    );
    #[allow(deprecated)]
    let former = handle.set_policy(gold).unwrap_err();
    assert_eq!(former, ConfigError::UnknownTier("gold".into()));
    assert_eq!(handle.policies().len(), 2);
}
