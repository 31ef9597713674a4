#![cfg(feature = "serde")]
//! Quotas, policies and layer settings read from and written to configuration files.
//!
//! Pins docs/design.md section 5 (configuration-file settings).

use std::time::Duration;

use tollgate::settings::{duration, ConcurrencySettings, QueueSettings, ShapeSettings};
use tollgate::{Policy, Quota};

#[test]
fn durations_read_every_unit_and_combinations_largest_first() {
    let ok = |s: &str| duration::parse(s).unwrap();
    assert_eq!(ok("1ns"), Duration::from_nanos(1));
    assert_eq!(ok("250us"), Duration::from_micros(250));
    assert_eq!(ok("500ms"), Duration::from_millis(500));
    assert_eq!(ok("1s"), Duration::from_secs(1));
    assert_eq!(ok("5m"), Duration::from_secs(300));
    assert_eq!(ok("1h30m"), Duration::from_secs(5400));
    assert_eq!(ok("1d"), Duration::from_secs(86_400));
    assert_eq!(ok("1s500ms"), Duration::from_millis(1500));
    for bad in [
        "", "1", "s", "1 s", "1.5s", "1w", "30m1h", "1s1s", "-1s", "1S",
    ] {
        assert!(duration::parse(bad).is_err(), "{bad:?}");
    }
    // The largest units that fit, and back.
    for d in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1500),
        Duration::from_secs(5400),
        Duration::from_secs(86_400 * 3 + 1),
        Duration::new(7, 123_456_789),
    ] {
        assert_eq!(duration::parse(&duration::format(d)).unwrap(), d);
    }
    assert_eq!(duration::format(Duration::from_secs(5400)), "1h30m");
    assert_eq!(duration::format(Duration::from_millis(1500)), "1s500ms");
    // Overflow is an error, not a wrap.
    assert!(duration::parse("99999999999999999999999d").is_err());
}

#[test]
fn quotas_round_trip_through_toml_and_json() {
    for q in [
        Quota::per_second(10),
        Quota::per_second(10).burst(25),
        Quota::per_day(10_000).named("daily"),
        Quota::new(250, Duration::from_millis(500)).burst(1),
        Quota::fixed_window(100, Duration::from_secs(60)),
        Quota::sliding_log(5, Duration::from_secs(1)).named("log"),
        Quota::sliding_window(1000, Duration::from_secs(3600)),
    ] {
        let json = serde_json::to_string(&q).unwrap();
        assert_eq!(serde_json::from_str::<Quota>(&json).unwrap(), q, "{json}");
        #[derive(serde::Serialize, serde::Deserialize)]
        struct W {
            q: Quota,
        }
        let text = toml::to_string(&W { q: q.clone() }).unwrap();
        assert_eq!(toml::from_str::<W>(&text).unwrap().q, q, "{text}");
    }
    assert_eq!(
        serde_json::to_string(&Quota::per_second(10).burst(25)).unwrap(),
        r#"{"count":10,"per":"1s","burst":25}"#
    );
}

#[test]
fn invalid_quotas_are_errors_that_name_the_field() {
    let err = |s: &str| serde_json::from_str::<Quota>(s).unwrap_err().to_string();
    assert!(err(r#"{"count":0,"per":"1s"}"#).starts_with("count:"));
    assert!(err(r#"{"count":1,"per":"0s"}"#).starts_with("per:"));
    assert!(err(r#"{"count":5,"per":"1s","burst":0}"#).starts_with("burst:"));
    assert!(err(r#"{"count":5,"per":"1s","name":"a\"b"}"#).starts_with("name:"));
    assert!(err(r#"{"count":5,"per":"soon"}"#).contains("invalid duration"));
    assert!(err(r#"{"count":5}"#).contains("missing field `per`"));
    assert!(err(r#"{"count":5,"per":"1s","brust":3}"#).contains("unknown field `brust`"));
    assert!(err(r#"{"kind":"fixed_window","count":5,"per":"1s","burst":3}"#).starts_with("burst:"));
    assert!(err(r#"{"kind":"leaky","count":5,"per":"1s"}"#).contains("unknown variant"));
    assert_eq!(
        serde_json::to_string(&Quota::sliding_window(5, Duration::from_secs(1))).unwrap(),
        r#"{"kind":"sliding_window","count":5,"per":"1s"}"#
    );
    // TOML says where.
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct W {
        api: Policy,
    }
    let e = toml::from_str::<W>("[api]\nname = \"api\"\nquotas = [{ count = 0, per = \"1s\" }]")
        .unwrap_err()
        .to_string();
    assert!(e.contains("count:"), "{e}");
    assert!(e.contains("line 3"), "{e}");
}

#[test]
fn policies_round_trip_and_need_a_quota_and_a_valid_name() {
    let p = Policy::new("free", Quota::per_second(10)).quota(Quota::per_day(10_000));
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(
        json,
        r#"{"name":"free","quotas":[{"count":10,"per":"1s"},{"count":10000,"per":"1d"}]}"#
    );
    let back: Policy = serde_json::from_str(&json).unwrap();
    assert_eq!(back.name(), "free");
    assert_eq!(back.quotas(), p.quotas());
    let err = |s: &str| serde_json::from_str::<Policy>(s).unwrap_err().to_string();
    assert!(err(r#"{"name":"x","quotas":[]}"#).starts_with("quotas:"));
    assert!(err(r#"{"name":"bad\"name","quotas":[{"count":1,"per":"1s"}]}"#).contains("policy"));
    let five = r#"{"count":1,"per":"1s"}"#;
    let too_many = format!(r#"{{"name":"x","quotas":[{five},{five},{five},{five},{five}]}}"#);
    assert!(err(&too_many).contains("at most 4"));
}

#[test]
fn layer_settings_round_trip() {
    let c = ConcurrencySettings {
        max: 100,
        queue: Some(QueueSettings {
            max_waiting: 50,
            max_wait: Duration::from_millis(1500),
        }),
    };
    let text = toml::to_string(&c).unwrap();
    assert_eq!(toml::from_str::<ConcurrencySettings>(&text).unwrap(), c);
    assert!(text.contains("max_wait = \"1s500ms\""), "{text}");
    let bare: ConcurrencySettings = toml::from_str("max = 3").unwrap();
    assert_eq!(
        bare,
        ConcurrencySettings {
            max: 3,
            queue: None
        }
    );

    let s = ShapeSettings {
        rate: Quota::per_second(2),
        max_waiting: Some(4),
        max_wait: Some(Duration::from_secs(3)),
    };
    let text = toml::to_string(&s).unwrap();
    assert_eq!(toml::from_str::<ShapeSettings>(&text).unwrap(), s);
    let bare: ShapeSettings = toml::from_str("rate = { count = 2, per = \"1s\" }").unwrap();
    assert_eq!(bare.max_waiting, None);
    assert_eq!(bare.max_wait, None);
    let e = toml::from_str::<ShapeSettings>("rate = { count = 2, per = \"1s\" }\nmax_wait = 3")
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_wait"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn settings_applied_through_handles_change_the_running_layers() {
    let c = ConcurrencySettings {
        max: 4,
        queue: None,
    };
    let layer = c.layer();
    let handle = layer.handle().unwrap();
    handle
        .apply(&ConcurrencySettings {
            max: 2,
            queue: None,
        })
        .unwrap();
    assert_eq!(layer.limit(), 2);
    // A queue cannot be added to a layer built without one; nothing changes.
    let with_queue = ConcurrencySettings {
        max: 9,
        queue: Some(QueueSettings {
            max_waiting: 1,
            max_wait: Duration::from_secs(1),
        }),
    };
    assert!(handle.apply(&with_queue).is_err());
    assert_eq!(layer.limit(), 2);

    let s = ShapeSettings {
        rate: Quota::per_second(2),
        max_waiting: None,
        max_wait: None,
    };
    let shape = s.layer();
    let sh = shape.handle().unwrap();
    sh.apply(&ShapeSettings {
        rate: Quota::per_second(8),
        ..s
    })
    .unwrap();
    assert_eq!(shape.shaper().unwrap().quota(), Quota::per_second(8));
}
