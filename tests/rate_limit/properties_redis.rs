//! The Redis store against the reference model on random inputs (the body `properties.rs`
//! runs on memory too, here with quotas and requests the scripts' microseconds decide
//! exactly).
//!
//! Pins docs/design.md section 1 ("GCRA decision", "Other kinds") and section 3 ("Redis").
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use super::properties::agrees_with_the_reference_model;
use common::stores::{OnRedis, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::Quota;

/// Quotas whose emission interval is a whole number of milliseconds, so that the script's
/// microsecond arithmetic and the model's nanoseconds agree exactly.
fn quota() -> impl Strategy<Value = Quota> {
    (1u32..10, 1u64..300, 1u32..10).prop_map(|(count, ms_per_request, burst)| {
        Quota::new(
            count,
            Duration::from_millis(u64::from(count) * ms_per_request),
        )
        .burst(burst)
    })
}

/// (gap before the request in µs, key, cost, evict idle keys first: nothing on Redis)
fn requests() -> impl Strategy<Value = Vec<(u64, u8, u32, bool)>> {
    prop::collection::vec(
        (0u64..300_000, 0u8..3, 0u32..6, prop::bool::weighted(0.05)),
        1..60,
    )
}

#[test]
fn redis_store_agrees_with_the_reference_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(
            &(prop::collection::vec(quota(), 1..=4), requests()),
            |(quotas, reqs)| {
                case_no.set(case_no.get() + 1);
                rt.block_on(async {
                    let name = format!("prop-{}", case_no.get());
                    let outcome =
                        agrees_with_the_reference_model(&redis, &name, &quotas, &reqs).await;
                    redis.judge(outcome).await
                })
            },
        )
        .unwrap();
}
