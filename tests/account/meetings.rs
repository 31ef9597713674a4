//! Where the account of a key, the bound on tracked keys and the penalty box meet, in memory:
//! refunds and settlements after live quota changes, on a full table and under a ban. Each
//! case on the manual clock, with exact numbers. A debt through a burst flip, a debt that
//! bans, and a client that waits as told with every kind run over both stores
//! (`tests/common/stores.rs`); `meetings_redis.rs` has where leases and the Redis key's life
//! meet.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change", "One bound per
//! layer", "The penalty box punishes the client's own traffic").

use crate::common;

use std::time::Duration;

use crate::common::stores::{self, Memory, Store};
use common::account::rig::{manual, settles, Handler, Reply, Rig, FAILED, OK};
use http::StatusCode;
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::store::OnFull;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::Layer;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// One policy `p` of `quota`, keyed by `x-key`, costing `x-cost`; a `200` does not count, and
/// a response that counts settles the cost it reports.
fn layer(quota: Quota, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(Policy::new("p", quota))
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .cost(stores::x_cost)
        .count_if(|res| res.status != StatusCode::OK)
        .settle(ActualCost::of)
}

macro_rules! rig {
    ($l:expr) => {{
        let l = $l.clone();
        Rig::new(move |h| l.layer(h))
    }};
}

/// Admits and answers one request of `cost` for `key` with `reply`; whether it was admitted.
async fn one<S>(rig: &mut Rig<S>, key: &str, cost: u32, reply: Reply) -> bool
where
    S: tower::Service<
        http::Request<()>,
        Response = http::Response<http_body_util::Full<bytes::Bytes>>,
        Error = std::convert::Infallible,
    >,
{
    match rig.send(key, cost).await {
        Some(id) => {
            rig.answer(id, reply).await;
            true
        }
        None => false,
    }
}

// ---- a widened window meets the bounded table ----

/// A sliding log widened from 1 s to 10 s: the entries of 0 s count until 10 s. A zero
/// reservation of a new key on the full table at 2 s makes room, and must not drop a key
/// whose entries still count (its stored idle time, 1 s, was measured under the old width).
#[tokio::test]
async fn a_zero_reservation_on_a_full_table_after_a_widened_log_drops_no_key_that_counts() {
    for on_full in [OnFull::EvictNearestIdle, OnFull::RejectNewKeys] {
        let (clock, time) = manual();
        let l = layer(Quota::sliding_log(2, S), &clock)
            .max_keys(2)
            .on_full(on_full);
        let mut rig = rig!(l);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "b", 1, FAILED).await);
        time.advance(500 * MS);
        l.handle()
            .unwrap()
            .apply(&Policy::new("p", Quota::sliding_log(2, 10 * S)))
            .unwrap();
        time.advance(1_500 * MS);
        // A cost-0 request of a new key: it needs a place (a settlement may charge it).
        one(&mut rig, "c", 0, OK).await;
        // "a" holds 2 entries of 0 s inside the 10 s window.
        assert!(!one(&mut rig, "a", 1, FAILED).await, "{on_full:?}");
    }
}

/// The same widened log, met by a settlement of a new key on the full table.
#[tokio::test]
async fn a_settled_charge_on_a_full_table_after_a_widened_log_drops_no_key_that_counts() {
    for on_full in [OnFull::EvictNearestIdle, OnFull::RejectNewKeys] {
        let (clock, time) = manual();
        let l = layer(Quota::sliding_log(2, S), &clock)
            .max_keys(2)
            .on_full(on_full);
        let mut rig = rig!(l);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "b", 1, OK).await);
        time.advance(500 * MS);
        l.handle()
            .unwrap()
            .apply(&Policy::new("p", Quota::sliding_log(2, 10 * S)))
            .unwrap();
        time.advance(1_500 * MS);
        one(
            &mut rig,
            "c",
            0,
            Reply {
                status: 401,
                actual: Some(1),
            },
        )
        .await;
        assert!(!one(&mut rig, "a", 1, FAILED).await, "{on_full:?}");
    }
}

/// The same widened log, met by the penalty box: a strike needs a place in the bound the
/// box shares with the quota state, and the quota table, asked for idle entries, must judge
/// them by the widened window too.
#[tokio::test]
async fn a_strike_on_a_full_shared_bound_after_a_widened_log_drops_no_key_that_counts() {
    let (clock, time) = manual();
    let l = layer(Quota::sliding_log(2, S), &clock)
        .max_keys(4)
        .on_full(OnFull::RejectNewKeys)
        .penalty_box(PenaltyBox::new(3, 60 * S, 10 * S));
    let mut rig = rig!(l);
    assert!(one(&mut rig, "a", 1, FAILED).await);
    assert!(one(&mut rig, "a", 1, FAILED).await);
    assert!(one(&mut rig, "b", 1, FAILED).await);
    assert!(one(&mut rig, "c", 1, FAILED).await);
    time.advance(500 * MS);
    l.handle()
        .unwrap()
        .apply(&Policy::new("p", Quota::sliding_log(2, 10 * S)))
        .unwrap();
    time.advance(1_500 * MS);
    assert!(one(&mut rig, "d", 1, FAILED).await);
    // The bound is full; "a" is refused (2 entries of 0 s in 10 s), a strike that needs room.
    assert!(!one(&mut rig, "a", 1, FAILED).await);
    assert!(!one(&mut rig, "a", 1, FAILED).await);
    assert!(!one(&mut rig, "b", 2, FAILED).await);
}

// ---- the penalty box's Retry-After with window kinds, debts and changes ----

pub(crate) mod told {
    use super::*;
    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::Full;
    use proptest::prelude::*;
    use std::convert::Infallible;
    use tower::{Service, ServiceExt};

    /// A request of `cost` for key `k` whose response reports `actual`.
    pub(crate) fn req(cost: u32, actual: u32) -> Request<()> {
        Request::get("/")
            .header("x-key", "k")
            .header("x-cost", cost.to_string())
            .header("x-actual", actual.to_string())
            .body(())
            .unwrap()
    }

    pub(crate) async fn handler(r: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
        let actual = r.headers()["x-actual"].clone();
        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
        resp.headers_mut().insert("x-actual", actual);
        Ok(resp)
    }

    /// The status and the Retry-After (whole seconds) of one request.
    pub(super) async fn send<S>(svc: &mut S, cost: u32, actual: u32) -> (u16, Option<u64>)
    where
        S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible>,
    {
        let (status, retry, _) = seen(svc, cost, actual).await;
        (status, retry.map(|r| r.parse().unwrap()))
    }

    /// The status, the Retry-After and the RateLimit fields of one request.
    pub(crate) async fn seen<S>(
        svc: &mut S,
        cost: u32,
        actual: u32,
    ) -> (u16, Option<String>, Option<String>)
    where
        S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible>,
    {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(req(cost, actual))
            .await
            .unwrap();
        let field = |n: &str| {
            resp.headers()
                .get(n)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (
            resp.status().as_u16(),
            field("retry-after"),
            field("ratelimit"),
        )
    }

    #[derive(Debug, Clone)]
    pub(super) enum Op {
        /// A request of `cost`, settled at `actual` if admitted.
        Request {
            cost: u32,
            actual: u32,
        },
        Wait {
            ms: u64,
        },
        /// The quota's count (or burst) becomes this.
        Change {
            count: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (1u32..4, 0u32..9).prop_map(|(cost, actual)| Op::Request { cost, actual }),
            2 => (0u64..4_000).prop_map(|ms| Op::Wait { ms }),
            1 => (3u32..8).prop_map(|count| Op::Change { count }),
        ]
    }

    fn quota(kind: u8, count: u32) -> Quota {
        match kind {
            0 => Quota::new(count, 4 * S).burst(count),
            1 => Quota::fixed_window(count, 4 * S),
            2 => Quota::sliding_log(count, 4 * S),
            _ => Quota::sliding_window(count, 4 * S),
        }
    }

    /// Runs `ops` on `s`, the policy named `name`; on every ban (429 with a Retry-After),
    /// waits exactly as told and sends the same request again, which must be admitted.
    /// Returns how many bans were waited out. `raise_only`: changes only raise the count (a
    /// lowered count may refuse what a wait told before the change promised).
    pub(super) async fn run(
        s: &impl Store,
        name: &str,
        kind: u8,
        ops: Vec<Op>,
        raise_only: bool,
    ) -> Result<u32, String> {
        let (clock, time) = manual();
        let mut count = 3;
        let l = s.on(
            RateLimitLayer::new(Policy::new(name.to_owned(), quota(kind, count)))
                .key(Header::new("x-key"))
                .clock(clock.clone())
                .cost(stores::x_cost)
                .settle(ActualCost::header("x-actual"))
                .penalty_box(PenaltyBox::new(1, 60 * S, S)),
        );
        let limiter = s.limiter(&l, name);
        let mut svc = l.clone().layer(Handler::default());
        let mut waited = 0;
        let mut ops = ops.into_iter().peekable();
        while let Some(op) = ops.next() {
            match op {
                Op::Request { cost, actual } => {
                    let (status, retry) = send(&mut svc, cost, actual).await;
                    if status == 429 {
                        let retry = retry.ok_or("a 429 without Retry-After")?;
                        // A change that comes next comes during the ban, half way.
                        time.advance(Duration::from_millis(retry * 500));
                        if let Some(Op::Change { count: c }) = ops.peek().cloned() {
                            ops.next();
                            if !(raise_only && c < count) {
                                count = c;
                                s.apply(&l, Policy::new(name.to_owned(), quota(kind, count)));
                            }
                        }
                        time.advance(Duration::from_millis(retry * 500));
                        let (again, _) = send(&mut svc, cost, actual).await;
                        if again != 200 {
                            return Err(format!(
                                "waited {retry} s as told for cost {cost}: {again}"
                            ));
                        }
                        waited += 1;
                    }
                }
                Op::Wait { ms } => time.advance(Duration::from_millis(ms)),
                Op::Change { count: c } => {
                    if raise_only && c < count {
                        continue;
                    }
                    count = c;
                    s.apply(&l, Policy::new(name.to_owned(), quota(kind, count)));
                }
            }
            s.keep(&limiter, "k").await;
        }
        Ok(waited)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every kind, with settled debts and raised counts: a client banned on its first
        /// refusal that waits as told is admitted.
        #[test]
        fn a_client_that_waits_as_told_is_admitted_with_every_kind_and_debts(
            kind in 0u8..4,
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let r = rt.block_on(run(&Memory, "p", kind, ops, true));
            prop_assert!(r.is_ok(), "{:?}", r);
        }
    }

    /// The same property on a real redis-server: one server for every case, a policy of its
    /// own per case; some case waits out a ban.
    #[cfg(feature = "redis")]
    #[test]
    fn a_client_that_waits_as_told_is_admitted_on_redis() {
        use crate::common::stores::OnRedis;
        use proptest::test_runner::{Config, TestRunner};

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let redis = rt.block_on(OnRedis::start());
        let case = std::cell::Cell::new(0u32);
        let waited = std::cell::Cell::new(0u32);
        let strategy = (0u8..4, prop::collection::vec(op(), 1..40));
        TestRunner::new(Config::with_cases(48))
            .run(&strategy, |(kind, ops)| {
                case.set(case.get() + 1);
                let name = format!("told{}", case.get());
                let r = rt.block_on(async {
                    let r = run(&redis, &name, kind, ops, true).await;
                    redis.judge(Ok(r)).await
                })?;
                prop_assert!(r.is_ok(), "{:?}", r);
                waited.set(waited.get() + r.unwrap_or(0));
                Ok(())
            })
            .unwrap();
        assert!(waited.get() > 0);
    }
}

/// A wait told under one quota is a promise of that quota: lowered during the ban, the
/// quota refuses the retry, which is a strike of the key's own (the ban escalates), and the
/// new Retry-After is again when a retry is admitted, under the quota in force.
#[tokio::test]
async fn a_quota_lowered_during_a_ban_refuses_the_told_retry_and_tells_the_new_time() {
    let (clock, time) = manual();
    let l = RateLimitLayer::new(Policy::new("p", Quota::per_second(1).burst(3)))
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .penalty_box(PenaltyBox::new(1, 60 * S, S));
    let mut svc = l.clone().layer(tower::service_fn(told::handler));
    for _ in 0..3 {
        assert_eq!(told::send(&mut svc, 1, 1).await, (200, None));
    }
    // Full: retry in 1 s, and banned for 1 s.
    assert_eq!(told::send(&mut svc, 1, 1).await, (429, Some(1)));
    time.advance(500 * MS);
    l.handle()
        .unwrap()
        .apply(&Policy::new("p", Quota::per_second(1).burst(1)))
        .unwrap();
    time.advance(500 * MS);
    // At 1 s the key is 2 s ahead, over the new burst's 1 s: refused, banned again (2 s),
    // and told 2 s, when the quota admits it.
    assert_eq!(told::send(&mut svc, 1, 1).await, (429, Some(2)));
    time.advance(2 * S);
    assert_eq!(told::send(&mut svc, 1, 1).await.0, 200);
}

/// A debt settled above every kind's count, then a request: banned, told when the debt lets
/// a retry through, and admitted then.
async fn a_debt_bans_with_every_kind_and_the_told_retry_is_admitted(s: &impl Store) {
    use told::Op::Request;
    // GCRA's debt (8 intervals) outlasts the retry's; a window's debt ends with its window
    // (fixed), its entry (log), or weighs in the next window (counter).
    for (kind, bans) in [(0, 2), (1, 1), (2, 1), (3, 2)] {
        let ops = vec![
            Request { cost: 1, actual: 8 },
            Request { cost: 1, actual: 1 },
            Request { cost: 2, actual: 2 },
        ];
        let name = format!("debt{kind}");
        let told = told::run(s, &name, kind, ops, true).await;
        assert_eq!(told, Ok(bans), "kind {kind}");
    }
}

// ---- the bound, idle drops and live changes, on random interleavings ----

mod bounded {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    pub(super) enum Op {
        Send(usize, u32),
        Answer(usize, Option<Option<u32>>),
        Wait(u64),
        /// The policy becomes variant `v` (widths and counts widen and narrow).
        Change(bool),
        EvictIdle,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..4, 0u32..3).prop_map(|(k, c)| Op::Send(k, c)),
            4 => (0usize..8, prop::option::of(prop::option::of(0u32..6)))
                .prop_map(|(i, r)| Op::Answer(i, r)),
            3 => (0u64..1_500).prop_map(Op::Wait),
            1 => any::<bool>().prop_map(Op::Change),
            1 => Just(Op::EvictIdle),
        ]
    }

    fn policy(kind: u8, wide: bool) -> Policy {
        let (n, w) = if wide { (3, 4 * S) } else { (2, S) };
        let q = match kind {
            0 => Quota::new(n, w).burst(n),
            1 => Quota::fixed_window(n, w),
            2 => Quota::sliding_log(n, w),
            _ => Quota::sliding_window(n, w),
        };
        Policy::new("p", q)
    }

    const KEYS: [&str; 4] = ["a", "b", "c", "d"];

    /// A layer of at most 3 keys (quota state and strike records together, new keys
    /// refused when full) against one without a bound or a penalty box: the same decision
    /// for every request of a tracked key, whatever the idle drops, changes, zero
    /// reservations and settlements; a request the bounded layer refuses and the other
    /// admits is a new key on a full table (the other then gives it back at once).
    pub(super) async fn run(kind: u8, ops: Vec<Op>) -> Result<(), String> {
        let (clock, time) = manual();
        let bounded = layer_of(policy(kind, false), &clock)
            .max_keys(3)
            .on_full(OnFull::RejectNewKeys)
            .penalty_box(PenaltyBox::new(1_000, 60 * S, S));
        let free = layer_of(policy(kind, false), &clock);
        let lim = bounded.limiter("p").unwrap().unwrap();
        let penalties = bounded.penalties().unwrap().unwrap();
        let tracked = || lim.len() + penalties.len();
        let mut b = rig!(bounded);
        let mut f = rig!(free);
        let mut flying: Vec<(u64, u64, u32)> = Vec::new();
        for op in ops {
            match op {
                Op::Send(k, cost) => {
                    let full = tracked() >= 3;
                    let (x, y) = (b.send(KEYS[k], cost).await, f.send(KEYS[k], cost).await);
                    match (x, y) {
                        (Some(x), Some(y)) => flying.push((x, y, cost)),
                        (None, None) => {}
                        (None, Some(y)) if full => {
                            f.answer(y, OK).await;
                        }
                        _ => {
                            return Err(format!(
                                "{} cost {cost}: bounded {:?}, free {:?}",
                                KEYS[k],
                                x.is_some(),
                                y.is_some()
                            ))
                        }
                    }
                }
                Op::Answer(i, reply) => {
                    if flying.is_empty() {
                        continue;
                    }
                    let (x, y, cost) = flying.remove(i % flying.len());
                    let reply = match reply {
                        None => OK,
                        Some(None) => FAILED,
                        // A charge of a key without an entry on a full table under
                        // `RejectNewKeys` is not kept (README, "Memory"): charges are made
                        // here only while the bound has a free place.
                        Some(Some(n)) if n > cost && tracked() >= 3 => FAILED,
                        Some(Some(n)) => Reply {
                            status: 401,
                            actual: Some(n),
                        },
                    };
                    b.answer(x, reply).await;
                    f.answer(y, reply).await;
                }
                Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Op::Change(wide) => {
                    bounded
                        .handle()
                        .unwrap()
                        .apply(&policy(kind, wide))
                        .unwrap();
                    free.handle().unwrap().apply(&policy(kind, wide)).unwrap();
                }
                Op::EvictIdle => {
                    lim.evict_idle();
                }
            }
            if tracked() > 3 {
                return Err(format!("{} keys tracked, max_keys 3", tracked()));
            }
        }
        Ok(())
    }

    fn layer_of(p: Policy, clock: &Clock) -> RateLimitLayer<Header> {
        RateLimitLayer::new(p)
            .key(Header::new("x-key"))
            .clock(clock.clone())
            .cost(stores::x_cost)
            .count_if(|res| res.status != StatusCode::OK)
            .settle(ActualCost::of)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Forgetting idle keys (by `evict_idle`, by sweeps, by a table or a penalty box
        /// making room) changes no decision, under every kind and any live change.
        #[test]
        fn forgetting_idle_keys_on_a_full_bound_changes_no_decision(
            kind in 0u8..4,
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let r = rt.block_on(run(kind, ops));
            prop_assert!(r.is_ok(), "{:?}", r);
        }
    }
}

// ---- count_if refunds racing a burst flip, on threads ----

mod racing {
    use super::*;
    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::Full;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;

    async fn handler(r: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
        let status: u16 = r.headers()["x-status"].to_str().unwrap().parse().unwrap();
        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok(resp)
    }

    /// Eight tasks send 400 logins for one key, every other one failing, while another task
    /// flips the burst between 10 and 5 two hundred times, on a stopped clock: the failures
    /// counted never pass the larger burst, and the successes (refunded) take nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn refunds_racing_a_burst_flip_never_count_more_than_the_larger_burst() {
        for kind in 0..4u8 {
            let (clock, _time) = manual();
            let quota = move |n: u32| match kind {
                0 => Quota::per_second(1).burst(n),
                1 => Quota::fixed_window(n, 100 * S),
                2 => Quota::sliding_log(n, 100 * S),
                _ => Quota::sliding_window(n, 100 * S),
            };
            let l = RateLimitLayer::new(Policy::new("p", quota(10)))
                .key(Header::new("x-key"))
                .clock(clock.clone())
                .count_if(|res| res.status != StatusCode::OK);
            let svc = l.clone().layer(tower::service_fn(handler));
            let failed = Arc::new(AtomicU64::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let handle = l.handle().unwrap();
            let flipper = {
                let done = done.clone();
                tokio::spawn(async move {
                    for i in 0..200 {
                        let n = if i % 2 == 0 { 5 } else { 10 };
                        handle.apply(&Policy::new("p", quota(n))).unwrap();
                        tokio::task::yield_now().await;
                    }
                    done.store(true, Ordering::SeqCst);
                })
            };
            let mut tasks = tokio::task::JoinSet::new();
            for t in 0..8u64 {
                let svc = svc.clone();
                let failed = failed.clone();
                tasks.spawn(async move {
                    for i in 0..50u64 {
                        let status = if (t + i) % 2 == 0 { 401 } else { 200 };
                        let req = Request::get("/")
                            .header("x-key", "login")
                            .header("x-status", status.to_string())
                            .body(())
                            .unwrap();
                        let resp = svc.clone().oneshot(req).await.unwrap();
                        if resp.status() == StatusCode::UNAUTHORIZED {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                    }
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.unwrap();
            }
            flipper.await.unwrap();
            assert!(done.load(Ordering::SeqCst));
            let failed = failed.load(Ordering::SeqCst);
            assert!(failed <= 10, "kind {kind}: {failed} failures counted");
            // Nothing else is left held: the key's count is exactly its failures.
            let lim = l.limiter("p").unwrap().unwrap();
            let k: Box<[u8]> = b"login".as_slice().into();
            let used = 10 - lim.peek(&k).states()[0].remaining();
            assert_eq!(used, failed, "kind {kind}");
        }
    }
}

// ---- dry run with a penalty box and settlements ----

/// In a dry run every request reaches the handler; an admitted one reserves and settles as
/// when enforced (its debt stands in the state), a would-be rejection let through reserves
/// and settles nothing, and no refusal is a strike.
#[tokio::test]
async fn a_dry_run_settles_only_what_it_admitted_and_records_no_strike() {
    for quota in [Quota::fixed_window(2, 60 * S), Quota::per_minute(2)] {
        let (clock, _time) = manual();
        let l = layer(quota.clone(), &clock)
            .dry_run(true)
            .penalty_box(PenaltyBox::new(1, 60 * S, 10 * S));
        let mut rig = rig!(l);
        let charged = Reply {
            status: 401,
            actual: Some(3),
        };
        for _ in 0..5 {
            assert!(one(&mut rig, "k", 1, charged).await, "{quota:?}");
        }
        let lim = l.limiter("p").unwrap().unwrap();
        let k: Box<[u8]> = b"k".as_slice().into();
        let d = lim.peek(&k);
        assert_eq!(d.states()[0].remaining(), 0, "{quota:?}");
        // One admission settled at 3: a fixed window counts 3 of 2 until it ends; GCRA is
        // 3 intervals (90 s) ahead.
        let expect = if quota == Quota::per_minute(2) {
            90 * S
        } else {
            60 * S
        };
        assert_eq!(d.reset_after(), expect, "{quota:?}");
        assert_eq!(l.penalties().unwrap().unwrap().len(), 0);
    }
}

// ---- refunds of a key whose quota state was evicted meanwhile ----

/// GCRA 3 per 10 s on a table of one key that evicts: "a" has one slow success in flight;
/// a new key "c" takes its place, and "a" starts again from a full burst (3 failures). Its
/// late refund then gives back the part of its own slice still ahead (3.33 s) from the new
/// state: one failure more. Four against a limit of 3: the eviction loosened "a" by less
/// than its burst, as `OnFull::EvictNearestIdle` says.
#[tokio::test]
async fn a_refund_of_an_evicted_key_loosens_it_by_at_most_one_burst() {
    let (clock, _time) = manual();
    let l = layer(Quota::new(3, 10 * S), &clock).max_keys(1);
    let mut rig = rig!(l);
    let slow = rig.send("a", 1).await.unwrap();
    assert!(one(&mut rig, "c", 1, FAILED).await);
    let mut counted = 0;
    for _ in 0..4 {
        counted += usize::from(one(&mut rig, "a", 1, FAILED).await);
    }
    assert_eq!(counted, 3);
    assert_eq!(rig.answer(slow, OK).await, 200);
    for _ in 0..4 {
        counted += usize::from(one(&mut rig, "a", 1, FAILED).await);
    }
    assert_eq!(counted, 4);
}

/// A key refused on a full bound shared with a penalty box: its strike needs a place, and
/// quota state is evicted first, from a random sample of shards. The state evicted may be
/// the struck key's own, whose next request then starts from a full burst: its refusal freed
/// it. Two keys, 200 runs: the refused key must be refused again every time, since the key
/// asking for room is never the one evicted for it.
#[tokio::test]
async fn a_strike_never_evicts_its_own_keys_quota_state() {
    let mut freed = 0;
    for _ in 0..200 {
        let (clock, _time) = manual();
        let l = layer(Quota::new(3, 10 * S), &clock)
            .max_keys(2)
            .penalty_box(PenaltyBox::new(1_000, 60 * S, S));
        let mut rig = rig!(l);
        let _slow = rig.send("a", 1).await.unwrap();
        for _ in 0..3 {
            assert!(one(&mut rig, "b", 1, FAILED).await);
        }
        assert!(!one(&mut rig, "b", 1, FAILED).await);
        freed += usize::from(one(&mut rig, "b", 1, FAILED).await);
    }
    assert_eq!(freed, 0);
}

// ---- a debt, then a burst flip; stacked layers giving back after a change ----

/// Tokens per minute 100: a response settles 250 (150 s ahead); the burst goes down to 50
/// and back up to 100: the debt stands through both, and the next request fits the burst in
/// force (60 s) once 150.6 s - 60 s have passed.
async fn a_debt_stands_through_a_burst_flip(s: &impl Store) {
    let (clock, _time) = manual();
    let l = s.layer(&[Quota::per_minute(100)], "flip", &clock);
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("api", 1).await.unwrap();
    rig.answer(id, settles(250)).await;
    s.apply(&l, Policy::new("flip", Quota::per_minute(100).burst(50)));
    s.apply(&l, Policy::new("flip", Quota::per_minute(100)));
    let d = s.check(&s.limiter(&l, "flip"), "api").await;
    assert_eq!(d.reset_after(), 150 * S);
    assert_eq!(d.retry_after(), Some(90_600 * MS));
}

crate::over_both_stores!(
    a_debt_stands_through_a_burst_flip,
    a_debt_bans_with_every_kind_and_the_told_retry_is_admitted,
);

/// Two layers, each counting failures only: GCRA 60 per minute outside, a fixed window of 5
/// per minute inside. Five slow successes are held while both change (5 per minute; a 1 s
/// window from the key's next window); their refunds give back to each layer what the
/// request took there (1 s of GCRA each, 5 of the open window, which empties and so ends):
/// five failures then pass both, in a new window of 1 s inside, and a sixth is refused.
#[tokio::test]
async fn stacked_layers_give_back_what_each_took_after_a_change() {
    let (clock, _time) = manual();
    let outer = layer(Quota::per_minute(60), &clock);
    let inner = RateLimitLayer::new(Policy::new("in", Quota::fixed_window(5, 60 * S)))
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .count_if(|res| res.status != StatusCode::OK);
    let mut rig = {
        let (o, i) = (outer.clone(), inner.clone());
        Rig::new(move |h| o.layer(i.layer(h)))
    };
    let mut slow = Vec::new();
    for _ in 0..5 {
        slow.push(rig.send("k", 1).await.unwrap());
    }
    assert_eq!(rig.send("k", 1).await, None);
    outer
        .handle()
        .unwrap()
        .apply(&Policy::new("p", Quota::per_minute(5)))
        .unwrap();
    inner
        .handle()
        .unwrap()
        .apply(&Policy::new("in", Quota::fixed_window(5, S)))
        .unwrap();
    for id in slow {
        assert_eq!(rig.answer(id, OK).await, 200);
    }
    let mut counted = 0;
    for _ in 0..6 {
        counted += usize::from(one(&mut rig, "k", 1, FAILED).await);
    }
    assert_eq!(counted, 5);
    let k: Box<[u8]> = b"k".as_slice().into();
    // Outside: 5 of 5, 60 s ahead. Inside: 5 of a window of the new width.
    let o = outer.limiter("p").unwrap().unwrap().peek(&k);
    assert_eq!(o.reset_after(), 60 * S);
    let i = inner.limiter("in").unwrap().unwrap().peek(&k);
    assert_eq!(i.reset_after(), S);
    assert_eq!(i.states()[0].remaining(), 0);
}
