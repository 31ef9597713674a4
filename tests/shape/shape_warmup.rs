//! Shaping with warm-up: after idleness a key's queue drains slowly and speeds up to the
//! quota's rate over the warm-up period (Sentinel's warm-up with queue), along the curve of
//! `tollgate::warmup`. Every test runs on tokio's paused clock.
//!
//! Guava's example throughout: 2 per second (`T` = 500 ms), warm-up 3 s, cold factor 3. From
//! cold, departures are spaced 1 333.33 ms, 1 000 ms, 666.67 ms, then 500 ms.
//!
//! Pins docs/design.md section 1 ("Shaping", "Other kinds": warm-up).

use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate::{ConfigError, Quota};
use tollgate::{ShapeLayer, Shaper};
use tower::{service_fn, Layer, ServiceExt};

fn guava() -> Shaper<u8> {
    Shaper::builder(Quota::per_second(2))
        .warm_up(Duration::from_secs(3), 3)
        .build()
}

/// Takes `n` slots of `key` one after another; returns when each was reached, in µs since
/// `start` (tokio's timer fires on whole milliseconds, so a slot at 1 333.33 ms is reached at
/// 1 334 ms).
async fn departures(shaper: &Shaper<u8>, key: u8, n: usize, start: Instant) -> Vec<u128> {
    let mut out = Vec::new();
    for _ in 0..n {
        shaper.until_slot(&key).await;
        out.push(start.elapsed().as_micros());
    }
    out
}

/// Seven departures of key 1 from cold: the last at 4.5 s, the next slot at 5.0 s, and every
/// stored permit spent (the six an idle key stores, then one fresh).
async fn warm_up_fully(shaper: &Shaper<u8>, start: Instant) {
    let got = departures(shaper, 1, 7, start).await;
    assert_eq!(ms(&got), [0, 1_334, 2_334, 3_000, 3_500, 4_000, 4_500]);
}

fn ms(v: &[u128]) -> Vec<u128> {
    v.iter().map(|us| us.div_ceil(1_000)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_cold_key_drains_at_a_third_of_the_rate_then_speeds_up_like_guava() {
    let shaper = guava();
    let start = Instant::now();
    let got = departures(&shaper, 1, 7, start).await;
    // Ideal slots: 0, 1 333.33, 2 333.33, 3 000, 3 500, 4 000, 4 500 ms.
    assert_eq!(ms(&got), [0, 1_334, 2_334, 3_000, 3_500, 4_000, 4_500]);
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_spaced_at_join_by_the_warm_up_curve() {
    // Six join at once: their slots follow the curve, whatever the order they are polled in.
    let shaper = guava();
    let start = Instant::now();
    let slots: Vec<_> = (0..6).map(|_| shaper.until_slot(&1)).collect();
    let handles: Vec<_> = slots
        .into_iter()
        .map(|slot| {
            tokio::spawn(async move {
                slot.await;
                start.elapsed().as_micros()
            })
        })
        .collect();
    let mut got = Vec::new();
    for h in handles {
        got.push(h.await.unwrap());
    }
    assert_eq!(ms(&got), [0, 1_334, 2_334, 3_000, 3_500, 4_000]);
}

#[tokio::test(start_paused = true)]
async fn a_warm_key_idle_for_less_than_half_the_period_stays_warm() {
    let shaper = guava();
    let start = Instant::now();
    warm_up_fully(&shaper, start).await;
    // Idle from 5.0 s: 1.5 s of idleness regains 3 permits, up to the threshold.
    tokio::time::sleep_until(start + Duration::from_millis(6_500)).await;
    let t0 = Instant::now();
    let got = departures(&shaper, 1, 3, t0).await;
    assert_eq!(ms(&got), [0, 500, 1_000]);
}

#[tokio::test(start_paused = true)]
async fn idle_after_partial_warm_up_resumes_part_way_up_the_curve() {
    let shaper = guava();
    let start = Instant::now();
    warm_up_fully(&shaper, start).await;
    // 2.25 s idle: 4.5 permits stored, 1.5 above the threshold. The next departures cost
    // 833.33 ms (the strip from 1.5 to 0.5 above), 541.67 ms (from 0.5 to 0), then 500 ms.
    tokio::time::sleep_until(start + Duration::from_millis(7_250)).await;
    let t0 = Instant::now();
    let got = departures(&shaper, 1, 4, t0).await;
    assert_eq!(ms(&got), [0, 834, 1_375, 1_875]);
}

#[tokio::test(start_paused = true)]
async fn a_key_idle_for_the_whole_period_is_cold_again() {
    let shaper = guava();
    let start = Instant::now();
    warm_up_fully(&shaper, start).await;
    tokio::time::sleep_until(start + Duration::from_millis(8_000)).await;
    let t0 = Instant::now();
    assert_eq!(ms(&departures(&shaper, 1, 3, t0).await), [0, 1_334, 2_334]);
}

#[tokio::test(start_paused = true)]
async fn a_flood_then_quiet_cools_the_key_and_the_next_flood_starts_slow() {
    let shaper = Shaper::<u8>::builder(Quota::per_second(100))
        .warm_up(Duration::from_secs(1), 4)
        .max_waiting(1_000)
        .build();
    let start = Instant::now();
    // A flood of 300: the first second drains slowly, then 100/s.
    let got = departures(&shaper, 1, 300, start).await;
    let in_first_second = got.iter().filter(|&&t| t < 1_000_000).count();
    let in_third_second = got
        .iter()
        .filter(|&&t| (2_000_000..3_000_000).contains(&t))
        .count();
    assert!(
        in_first_second < 60,
        "cold: {in_first_second} left in the first second"
    );
    assert_eq!(in_third_second, 100, "warm: the full rate");
    // Quiet for the whole period, then the same flood: the same slow start.
    let quiet = start + Duration::from_micros(*got.last().unwrap() as u64) + Duration::from_secs(2);
    tokio::time::sleep_until(quiet).await;
    let again = departures(&shaper, 1, 300, Instant::now()).await;
    let first_again = again.iter().filter(|&&t| t < 1_000_000).count();
    assert_eq!(first_again, in_first_second);
}

#[tokio::test(start_paused = true)]
async fn cold_factor_1_is_plain_shaping() {
    let plain = Shaper::<u8>::new(Quota::per_second(4));
    let flat = Shaper::<u8>::builder(Quota::per_second(4))
        .warm_up(Duration::from_secs(10), 1)
        .build();
    let start = Instant::now();
    let a = departures(&plain, 1, 8, start).await;
    let start = Instant::now();
    let b = departures(&flat, 1, 8, start).await;
    assert_eq!(a, b);
    assert_eq!(ms(&b), [0, 250, 500, 750, 1_000, 1_250, 1_500, 1_750]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_gives_back_its_spacing() {
    let shaper = guava();
    let start = Instant::now();
    let first = shaper.until_slot(&1); // leaves at 0, costs 1 333.33 ms
    let second = shaper.until_slot(&1); // slot 1 333.33, costs 1 000 ms
    let third = shaper.until_slot(&1); // slot 2 333.33
    first.await;
    drop(second);
    // The third moves up into the second's slot.
    third.await;
    assert_eq!(start.elapsed().as_millis(), 1_334);
    // The next newcomer follows the third's own price (666.67 ms after 1 333.33 is 2 000; the
    // warm-up the cancelled one brought is kept).
    shaper.until_slot(&1).await;
    assert_eq!(start.elapsed().as_millis(), 2_000);
}

#[tokio::test(start_paused = true)]
async fn each_key_warms_up_on_its_own() {
    let shaper = guava();
    let start = Instant::now();
    warm_up_fully(&shaper, start).await;
    // Key 1 is warm; key 2 was never seen: cold.
    let t0 = Instant::now();
    assert_eq!(ms(&departures(&shaper, 2, 2, t0).await), [0, 1_334]);
}

#[tokio::test(start_paused = true)]
async fn a_warming_key_is_kept_until_it_is_cold_again_then_forgotten() {
    let shaper = guava();
    let start = Instant::now();
    warm_up_fully(&shaper, start).await;
    // At 7.999 s the key is not yet fully cold: forgetting it would make it colder than it is.
    tokio::time::sleep_until(start + Duration::from_millis(7_999)).await;
    assert_eq!(shaper.evict_idle(), 1);
    // From 8.0 s it is the same as a key never seen.
    tokio::time::sleep_until(start + Duration::from_millis(8_000)).await;
    assert_eq!(shaper.evict_idle(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_http_layer_forwards_slowly_after_idle_and_refuses_beyond_max_delay() {
    let start = Instant::now();
    let inner = service_fn(move |_req: Request<Body>| async move {
        Ok::<_, std::convert::Infallible>(Response::new(Body::from(
            start.elapsed().as_millis().to_string(),
        )))
    });
    let layer = ShapeLayer::new(Quota::per_second(2))
        .warm_up(Duration::from_secs(3), 3)
        .max_wait(Duration::from_millis(2_500));
    let svc = layer.layer(inner);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let resp = svc
                    .oneshot(Request::get("/").body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), 64).await.unwrap();
                (status, String::from_utf8(body.to_vec()).unwrap())
            })
        })
        .collect();
    let mut got = Vec::new();
    for c in calls {
        got.push(c.await.unwrap());
    }
    // Slots 0, 1 333.33 and 2 333.33 ms fit within 2.5 s; the fourth (3 000 ms) does not.
    assert_eq!(got[0], (StatusCode::OK, "0".to_owned()));
    assert_eq!(got[1], (StatusCode::OK, "1334".to_owned()));
    assert_eq!(got[2], (StatusCode::OK, "2334".to_owned()));
    assert_eq!(got[3].0, StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn invalid_warm_up_settings_are_reported_when_built() {
    let zero = Shaper::<u8>::builder(Quota::per_second(2))
        .warm_up(Duration::ZERO, 3)
        .try_build();
    assert_eq!(
        zero.err(),
        Some(ConfigError::InvalidWarmUpPeriod(Duration::ZERO))
    );
    let cold0 = Shaper::<u8>::builder(Quota::per_second(2))
        .warm_up(Duration::from_secs(1), 0)
        .try_build();
    assert_eq!(cold0.err(), Some(ConfigError::InvalidColdFactor(0)));
    let layer = ShapeLayer::new(Quota::per_second(2)).warm_up(Duration::from_secs(1), 0);
    assert!(layer.validate().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_shaper_with_warm_up_refuses_another_rate_and_keeps_its_curve() {
    let shaper = guava();
    let start = Instant::now();
    let got = departures(&shaper, 1, 2, start).await;
    assert_eq!(ms(&got), [0, 1_334]);
    // Another rate would move the curve under the waiters' prices: refused, on every clone.
    let clone = shaper.clone();
    assert!(matches!(
        clone.set_quota(Quota::per_second(4)),
        Err(ConfigError::NotChangeable(_))
    ));
    assert_eq!(shaper.quota(), Quota::per_second(2));
    // The same rate under another name, and new bounds, are accepted.
    assert!(clone
        .set_quota(Quota::per_second(2).named("renamed"))
        .is_ok());
    assert!(clone.set_queue(Some(3), None).is_ok());
    // The key goes on along the same curve, as if nothing had been asked.
    let more = departures(&shaper, 1, 5, start).await;
    assert_eq!(ms(&more), [2_334, 3_000, 3_500, 4_000, 4_500]);
}
