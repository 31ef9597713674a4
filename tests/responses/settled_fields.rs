//! The `RateLimit` field of a layer that settles, against the account model
//! (`tests/common/account.rs`), on both stores: a policy of GCRA, a fixed window, a sliding
//! log and a sliding counter, requests of costs 0 to 3 answered at once (given back by
//! `count_if`, kept, or settled at any cost, debts included), the clock moving, live changes
//! of every limit and width, and idle keys evicted. Every response (admitted or refused) has
//! one `RateLimit` item per quota whose `r` is what the model says the quota has left once
//! the request is settled: the state after settling when the cost changed, after the
//! reservation otherwise (then the same), as `src/rate_limit/settle.rs` says; and its
//! `RateLimit-Policy` is the policy in force.
//!
//! Pins docs/design.md section 2 (`RateLimit-Policy` and `RateLimit`) and section 3 ("An
//! account per key").

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::rate_limit::settle::ActualCost;
use tower::ServiceExt;

use crate::common::account::rig::manual;
use crate::common::account::{Account, Kind, Taken};
use crate::common::stores::{Boxed, Memory, Store};

const MS: u64 = 1_000_000;

/// The quotas of variant `v` (0 or 1 per position).
fn kinds(v: [bool; 4]) -> Vec<Kind> {
    let p = |i: usize, a: u64, b: u64| if v[i] { b } else { a };
    vec![
        Kind::Gcra {
            interval: 200 * MS,
            burst: p(0, 5, 3),
        },
        Kind::Fixed {
            limit: p(1, 6, 4),
            width: p(1, 2_000, 700) * MS,
        },
        Kind::Log {
            limit: p(2, 5, 7),
            width: p(2, 1_500, 3_000) * MS,
        },
        Kind::Counter {
            limit: p(3, 6, 4),
            width: p(3, 1_000, 2_500) * MS,
        },
    ]
}

/// `(q, w)` of each quota of `kinds` in `RateLimit-Policy` (see `tollgate::headers`).
fn policy_items(kinds: &[Kind]) -> Vec<(u64, u64)> {
    kinds
        .iter()
        .map(|k| {
            let q = k.quota();
            tollgate::headers::policy_window(u64::from(q.burst_size()), q.count(), q.period())
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost` answered at once: 200 (given back), 401 kept, or 401 settling `n`.
    Send(u32, Option<Option<u32>>),
    Wait(u64),
    Change([bool; 4]),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..4, prop::option::of(prop::option::of(0u32..9)))
            .prop_map(|(c, r)| Op::Send(c, r)),
        3 => (0u64..1_200).prop_map(Op::Wait),
        1 => any::<[bool; 4]>().prop_map(Op::Change),
        1 => Just(Op::Evict),
    ]
}

async fn handler(r: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let number = |name: &str| -> Option<u32> { r.headers().get(name)?.to_str().ok()?.parse().ok() };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::from_u16(number("x-status").unwrap_or(401) as u16).unwrap();
    if let Some(n) = number("x-actual") {
        resp.extensions_mut().insert(ActualCost(n));
    }
    Ok(resp)
}

/// The numbers after `k=` in each item of the response's field `name`.
fn numbers(resp: &Response<Full<Bytes>>, name: &str, k: &str) -> Vec<u64> {
    let value = resp.headers().get(name).map_or("", |v| v.to_str().unwrap());
    value
        .split(", ")
        .filter_map(|item| {
            item.split(';')
                .find_map(|p| p.strip_prefix(k))
                .map(|n| n.parse().unwrap())
        })
        .collect()
}

async fn the_fields_report_the_settled_account<S: Store>(
    s: &S,
    name: &str,
    ops: Vec<Op>,
) -> Result<(), TestCaseError>
where
    S::Layer: HandleChange,
{
    let (clock, time) = manual();
    let mut v = [false; 4];
    let quotas: Vec<_> = kinds(v).iter().map(Kind::quota).collect();
    let l = s.layer(&quotas, name, &clock);
    let lim = s.limiter(&l, name);
    let app = s.around(&l, Boxed::new(tower::service_fn(handler)));
    let mut model = Account::new(kinds(v));
    let mut now = 1_000_000_000_001u64;
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Send(cost, reply) => {
                let (said, taken) = model.admit(now, cost);
                let (status, actual) = match reply {
                    None => (200, None),
                    Some(None) => (401, None),
                    Some(Some(n)) => (401, Some(n)),
                };
                let mut req = Request::post("/")
                    .header("x-key", "k")
                    .header("x-cost", cost.to_string())
                    .header("x-status", status.to_string());
                if let Some(n) = actual {
                    req = req.header("x-actual", n.to_string());
                }
                let resp = app.clone().oneshot(req.body(()).unwrap()).await.unwrap();
                if said.allowed {
                    prop_assert_eq!(resp.status().as_u16(), status, "op {}", i);
                    let t = taken.unwrap_or(Taken::nothing());
                    let paid = match status {
                        200 => 0,
                        _ => actual.unwrap_or(cost),
                    };
                    model.settle(now, &t, paid);
                } else {
                    prop_assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "op {}", i);
                }
                let left = model.peek(now).remaining;
                prop_assert_eq!(numbers(&resp, "ratelimit", "r="), left, "op {}: r", i);
                let items = policy_items(&kinds(v));
                let q: Vec<u64> = items.iter().map(|x| x.0).collect();
                let w: Vec<u64> = items.iter().map(|x| x.1).collect();
                prop_assert_eq!(numbers(&resp, "ratelimit-policy", "q="), q, "op {}: q", i);
                prop_assert_eq!(numbers(&resp, "ratelimit-policy", "w="), w, "op {}: w", i);
            }
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * MS;
            }
            Op::Change(to) => {
                v = to;
                l.handle_change(kinds(v).iter().map(Kind::quota).collect());
                model.set_quotas(now, kinds(v));
            }
            Op::Evict => s.evict_idle(&lim),
        }
        s.keep(&lim, "k").await;
    }
    Ok(())
}

/// The layer's handle, on either store: changes the default policy's quotas.
trait HandleChange {
    fn handle_change(&self, quotas: Vec<tollgate::Quota>);
}

impl HandleChange for tollgate::RateLimitLayer<tollgate::key::Header> {
    fn handle_change(&self, quotas: Vec<tollgate::Quota>) {
        self.handle().unwrap().set_default_quotas(quotas).unwrap();
    }
}

#[cfg(feature = "redis")]
impl HandleChange for tollgate::RateLimitLayer<tollgate::key::Header, tollgate::redis::RedisStore> {
    fn handle_change(&self, quotas: Vec<tollgate::Quota>) {
        self.handle().unwrap().set_default_quotas(quotas).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(Memory::CASES))]

    /// On the memory store.
    #[test]
    fn a_settled_responses_fields_report_the_settled_account_in_memory(
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(the_fields_report_the_settled_account(&Memory, "p", ops))?;
    }
}

/// On a real redis-server: one server for every case, a policy name of its own per case.
#[cfg(feature = "redis")]
#[test]
fn a_settled_responses_fields_report_the_settled_account_on_redis() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&prop::collection::vec(op(), 1..60), |ops| {
            case.set(case.get() + 1);
            let name = format!("fields{}", case.get());
            // A case in which the server expired a key on its own clock is void.
            rt.block_on(async {
                let outcome = the_fields_report_the_settled_account(&redis, &name, ops).await;
                redis.judge(outcome).await
            })
        })
        .unwrap();
}
