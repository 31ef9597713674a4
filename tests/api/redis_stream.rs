//! The Redis Stream consumer example against a real redis-server: a consumer that stops
//! mid-way loses no message, and re-reads its pending ones first on restart.
//!
//! Pins docs/design.md section 1 ("GCRA decision") and section 3 ("Redis").
#![cfg(feature = "stream")]

use crate::common;

#[allow(dead_code)]
#[path = "../../examples/redis_stream.rs"]
mod example;

use common::redis_server::{connection, RedisServer};
use example::{consume, create_group, pending, Consumer, Step};
use redis::AsyncCommands;
use tollgate::{Quota, RateLimiter};

fn job(m: &redis::streams::StreamId) -> u32 {
    m.get::<String>("job")
        .and_then(|s| s.parse().ok())
        .unwrap_or(u32::MAX)
}

#[tokio::test]
async fn a_consumer_stopped_mid_way_loses_nothing_and_rereads_its_pending_messages_first() {
    let server = RedisServer::start();
    let mut con = connection(&server).await;
    create_group(&mut con, "jobs", "workers").await.unwrap();
    create_group(&mut con, "jobs", "workers").await.unwrap(); // twice is fine
    for i in 0..25u32 {
        let _: String = con.xadd("jobs", "*", &[("job", i)]).await.unwrap();
    }
    let consumer = Consumer {
        stream: "jobs".into(),
        group: "workers".into(),
        name: "w1".into(),
        block: None,
    };
    // Fast enough that the test does not wait; the pacing itself is tested in tests/shape/stream.rs.
    let limiter = || RateLimiter::<()>::new(Quota::per_second(10_000).burst(100));

    // First run: stops at job 7 (read in the first batch of ten, not acknowledged).
    let mut first = Vec::new();
    let acked = consume(con.clone(), consumer.clone(), limiter(), |m| {
        if job(m) == 7 {
            return Step::Stop;
        }
        first.push(job(m));
        Step::Ack
    })
    .await
    .unwrap();
    assert_eq!(acked, 7);
    assert_eq!(first, (0..7).collect::<Vec<_>>());
    // Jobs 7, 8, 9 were delivered and are pending.
    assert_eq!(pending(&mut con, "jobs", "workers").await.unwrap(), 3);

    // Restart: the pending three come first, then the rest, each once.
    let mut second = Vec::new();
    let acked = consume(con.clone(), consumer, limiter(), |m| {
        second.push(job(m));
        Step::Ack
    })
    .await
    .unwrap();
    assert_eq!(acked, 18);
    assert_eq!(second, (7..25).collect::<Vec<_>>());
    // What the example prints last: `pending now: 0`.
    assert_eq!(pending(&mut con, "jobs", "workers").await.unwrap(), 0);
}

#[tokio::test]
async fn a_second_consumer_does_not_take_the_stopped_ones_pending_messages() {
    let server = RedisServer::start();
    let mut con = connection(&server).await;
    create_group(&mut con, "jobs", "workers").await.unwrap();
    for i in 0..12u32 {
        let _: String = con.xadd("jobs", "*", &[("job", i)]).await.unwrap();
    }
    let named = |name: &str| Consumer {
        stream: "jobs".into(),
        group: "workers".into(),
        name: name.into(),
        block: None,
    };
    let limiter = || RateLimiter::<()>::new(Quota::per_second(10_000).burst(100));
    let acked = consume(con.clone(), named("w1"), limiter(), |m| {
        if job(m) == 2 {
            Step::Stop
        } else {
            Step::Ack
        }
    })
    .await
    .unwrap();
    assert_eq!(acked, 2);
    // w2 sees only what was never delivered: jobs 10 and 11 (w1 holds 2..=9).
    let mut seen = Vec::new();
    consume(con.clone(), named("w2"), limiter(), |m| {
        seen.push(job(m));
        Step::Ack
    })
    .await
    .unwrap();
    assert_eq!(seen, vec![10, 11]);
    // w1 comes back and finishes its own.
    let mut rest = Vec::new();
    consume(con.clone(), named("w1"), limiter(), |m| {
        rest.push(job(m));
        Step::Ack
    })
    .await
    .unwrap();
    assert_eq!(rest, (2..10).collect::<Vec<_>>());
}
