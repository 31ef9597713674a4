//! A policy of four of the five kinds on one key (GCRA, a fixed window, a sliding log, a
//! sliding counter, GCRA with warm-up; a policy holds at most four quotas, so each round
//! leaves out another one), or of one kind alone every third round (each a shape of its own
//! in memory), decided all or nothing while several tasks send
//! requests of costs 1 to 3 that are refunded (`count_if`), kept, settled lower or higher
//! (debts), and the layer's handle changes every quota's limit, burst or width and is refused
//! every change of kind: on memory and on Redis, enforcing and in dry-run, keyed by a header
//! (a table) and, in memory, on the one key of a layer without a key extractor (one slot).
//!
//! The clock stands for the whole race, so what each quota holds is what the requests hold,
//! whatever the order: GCRA `tat − now = held × T`, a window's count, the log's entries. So,
//! at the two points the test stops (every reservation held; then every answer given, among
//! new requests and more changes), every quota but warm-up has exactly
//! `limit.saturating_sub(held)` left under the quotas in force then, with `held` the units the
//! admitted requests took, minus what their answers gave back, plus their debts. That pins:
//! * a refused request took nothing from any quota (nor did a dry run's would-be refusal,
//!   whatever its answer says), and an admitted one took its cost from each;
//! * a refund or a lower settlement gives back exactly what its request took, none twice;
//! * without debts, `held` never passes the most generous limit any quota had in force;
//! * warm-up's time is at least the plain interval per held unit (a surcharge only adds), so
//!   it has at most `burst − held` left.
//!
//! Pins docs/design.md sections 1 ("Several quotas on one key", "Other kinds") and 3 ("An
//! account per key", "A live quota change"); dry-run as `RateLimitLayer::dry_run` documents.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::watch;
use tollgate::observe::DryRunRejection;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{ConfigError, Policy, Quota, RateLimitHandle, RateLimitLayer, RateLimiter};
use tower::{Service, ServiceExt};

use crate::common::account::rig::manual;
use crate::common::race::{Handled, Rng};
use crate::common::stores::{self, Boxed, Memory, Store};

/// Every window; a Redis key's time to live runs on the server's clock while the manual one
/// stands, so windows are long enough that no key expires during a round.
const W: Duration = Duration::from_secs(60);

crate::over_both_stores!(
    five_kinds_on_one_key_hold_exactly_what_racing_requests_took_and_kept(
        flavor = "multi_thread",
        worker_threads = 3
    ),
    five_kinds_in_dry_run_hold_only_what_the_admitted_requests_took(
        flavor = "multi_thread",
        worker_threads = 3
    ),
);

/// The kinds of a round's policy, as indices into [`quota`]'s: every third round one kind
/// alone (a shape of its own in memory: one GCRA word, two words, the log's path), else
/// every kind but one (a policy holds at most four quotas). Warm-up, when present, is last.
fn shape(round: u64) -> Vec<usize> {
    if round % 3 == 0 {
        vec![(round / 3 % 5) as usize]
    } else {
        (0..5).filter(|&k| k != (round % 5) as usize).collect()
    }
}

/// The quota of kind `k` (0 GCRA, 1 fixed window, 2 sliding log, 3 sliding counter, 4
/// warm-up) in the setting drawn by the bits of `b`; `tight` makes warm-up's burst the
/// smallest, so that it is the quota that refuses.
fn quota(k: usize, b: u64, tight: bool) -> Quota {
    let bit = |i: u32| b >> i & 1 == 1;
    let pick = |i: u32, x: u32, y: u32| if bit(i) { y } else { x };
    let width = |i: u32| if bit(i) { 2 * W } else { W };
    match k {
        0 => Quota::new(1, W / 4).burst(pick(0, 5, 7)),
        1 => Quota::fixed_window(pick(1, 4, 6), width(5)),
        2 => Quota::sliding_log(pick(2, 4, 6), width(6)),
        3 => Quota::sliding_window(pick(3, 4, 6), width(7)),
        _ => {
            let warm = if tight {
                pick(4, 4, 5)
            } else {
                pick(4, 14, 16)
            };
            Quota::new(1, W / 4).burst(warm).warm_up(2 * W, 2)
        }
    }
}

/// The policy of `kinds` in the setting `b`.
fn quotas(b: u64, tight: bool, kinds: &[usize]) -> Vec<Quota> {
    kinds.iter().map(|&k| quota(k, b, tight)).collect()
}

/// The most a key may hold without debts: the smallest, over the policy's quotas, of the
/// largest limit each has in any setting.
fn most(kinds: &[usize], tight: bool) -> u64 {
    kinds
        .iter()
        .map(|&k| match k {
            0 => 7,
            4 if tight => 5,
            4 => 16,
            _ => 6,
        })
        .min()
        .unwrap_or(0)
}

/// The limit (burst) of each quota of a setting.
fn limits(q: &[Quota]) -> Vec<u64> {
    q.iter().map(|q| u64::from(q.burst_size())).collect()
}

/// What the handler saw of request `x-id`: whether the layer took its cost (not a dry run's
/// would-be refusal).
type Seen = Arc<Mutex<HashMap<u64, bool>>>;

/// Answers with `x-status` (200 is given back by `count_if`) and the actual cost `x-actual`;
/// a request with `x-hold` waits until the test releases the held ones.
#[derive(Clone)]
struct Handler {
    seen: Seen,
    release: watch::Receiver<bool>,
}

impl Service<Request<()>> for Handler {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, r: Request<()>) -> Self::Future {
        let number = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        };
        let status = number("x-status").unwrap_or(401) as u16;
        let actual = number("x-actual");
        let hold = number("x-hold").is_some();
        let took = DryRunRejection::first(r.extensions()).is_none();
        if let Some(id) = number("x-id") {
            self.seen.lock().unwrap().insert(id, took);
        }
        let mut release = self.release.clone();
        Box::pin(async move {
            if hold {
                let _ = release.wait_for(|r| *r).await;
            }
            let mut resp = Response::new(Full::new(Bytes::from_static(b"done")));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            if let Some(n) = actual {
                resp.extensions_mut().insert(ActualCost(n as u32));
            }
            Ok(resp)
        })
    }
}

/// How a held request is answered.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// 200: not counted, all given back.
    Refund,
    /// 401: kept at its cost.
    Keep,
    /// 401 settling this many units.
    Settle(u32),
}

impl Reply {
    /// The units a request of `cost` that took its cost holds once answered.
    fn holds(self, cost: u32) -> u64 {
        u64::from(match self {
            Reply::Refund => 0,
            Reply::Keep => cost,
            Reply::Settle(n) => n,
        })
    }
}

fn request(id: u64, cost: u32, reply: Reply, hold: bool) -> Request<()> {
    let (status, actual) = match reply {
        Reply::Refund => (200, None),
        Reply::Keep => (401, None),
        Reply::Settle(n) => (401, Some(n)),
    };
    let mut b = Request::post("/")
        .header("x-key", "k")
        .header("x-id", id.to_string())
        .header("x-cost", cost.to_string())
        .header("x-status", status.to_string());
    if let Some(n) = actual {
        b = b.header("x-actual", n.to_string());
    }
    if hold {
        b = b.header("x-hold", "1");
    }
    b.body(()).unwrap()
}

/// Sends a request and waits until the handler holds it or it was refused: `Some((task,
/// took))` when it reached the handler, `None` when the layer refused it (429).
async fn send(
    app: &Boxed,
    seen: &Seen,
    id: u64,
    req: Request<()>,
) -> Option<(tokio::task::JoinHandle<StatusCode>, bool)> {
    let task = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(req).await.unwrap().status() }
    });
    loop {
        if let Some(&took) = seen.lock().unwrap().get(&id) {
            return Some((task, took));
        }
        if task.is_finished() {
            // The handler may have answered between the two reads.
            if let Some(&took) = seen.lock().unwrap().get(&id) {
                return Some((task, took));
            }
            assert_eq!(task.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// The changes of one race: `n` settings drawn from `rng`, each followed by a refused change
/// of kind (two quotas swapped), then `last`.
fn changes(rng: &mut Rng, n: usize, last: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).map(|_| rng.next()).collect();
    v.push(last);
    v
}

/// Applies `settings` through the handle, one at a time among the other tasks; every change
/// of one quota's kind is refused and changes nothing.
fn changer(
    handle: RateLimitHandle,
    settings: Vec<u64>,
    tight: bool,
    kinds: Vec<usize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for (i, b) in settings.into_iter().enumerate() {
            let q = quotas(b, tight, &kinds);
            handle.set_default_quotas(q.clone()).unwrap();
            let at = i % kinds.len();
            let other = if kinds[at] == 1 { 2 } else { 1 };
            let mut changed = q.clone();
            changed[at] = quota(other, b, tight);
            assert!(
                matches!(
                    handle.set_default_quotas(changed),
                    Err(ConfigError::NotChangeable(_))
                ),
                "a change of kind at position {at} of {kinds:?}"
            );
            assert_eq!(handle.policies()[0].quotas(), q);
            tokio::task::yield_now().await;
        }
    })
}

/// Where a race runs: reads what its one key has left per quota.
#[allow(async_fn_in_trait)]
trait Target {
    async fn left(&self) -> Vec<u64>;
}

/// Key `k` of a layer keyed by a header, on a store.
struct OnStore<'a, S: Store> {
    s: &'a S,
    lim: S::Limiter,
}

impl<S: Store> Target for OnStore<'_, S> {
    async fn left(&self) -> Vec<u64> {
        self.s.keep(&self.lim, "k").await;
        let d = self.s.peek(&self.lim, "k").await;
        d.states().iter().map(|s| s.remaining()).collect()
    }
}

/// The one key of a layer without a key extractor, in memory.
struct Global(RateLimiter<()>);

impl Target for Global {
    async fn left(&self) -> Vec<u64> {
        let d = self.0.peek(&());
        d.states().iter().map(|s| s.remaining()).collect()
    }
}

/// Checks what the key has left under `q` against `held`, the units its requests hold.
async fn check(target: &impl Target, q: &[Quota], held: u64, most: Option<u64>, at: &str) {
    let left = target.left().await;
    let limit = limits(q);
    let warm = q.last().and_then(Quota::warm_up_settings).is_some();
    let exact = if warm { q.len() - 1 } else { q.len() };
    for i in 0..exact {
        assert_eq!(
            left[i],
            limit[i].saturating_sub(held),
            "{at}: quota {i} of {q:?} holds {held}; left {left:?}"
        );
    }
    if warm {
        assert!(
            left[exact] <= limit[exact].saturating_sub(held),
            "{at}: warm-up holds {held}; left {left:?}"
        );
    }
    if let Some(most) = most {
        assert!(held <= most, "{at}: {held} held, past every limit");
    }
}

/// The race of one round on a store: the layer keyed by `x-key`, on `s`.
async fn race<S: Store>(s: &S, round: u64, dry: bool)
where
    S::Layer: Handled,
{
    let name = format!("five-{dry}-{round}");
    race_on(round, dry, |q, clock, handler| {
        let l = s.on(stores::layer(q, &name, clock).dry_run(dry));
        let app = s.around(&l, handler);
        let lim = s.limiter(&l, &name);
        (app, l.handle_of(), OnStore { s, lim })
    })
    .await;
}

/// The race of one round in memory, on the one key of a layer without a key extractor.
async fn race_global(round: u64, dry: bool) {
    race_on(round, dry, |q, clock, handler| {
        let policy = q[1..]
            .iter()
            .fold(Policy::new("global", q[0].clone()), |p, q| {
                p.quota(q.clone())
            });
        let l = RateLimitLayer::new(policy)
            .clock(clock.clone())
            .cost(stores::x_cost)
            .count_if(|res| res.status != StatusCode::OK)
            .settle(ActualCost::of)
            .dry_run(dry);
        let lim = l.limiter("global").unwrap().unwrap();
        (
            stores::around(&l, handler),
            l.handle().unwrap(),
            Global(lim),
        )
    })
    .await;
}

/// One race, round `round`: `build` puts the layer (dry-run when `dry`) of quotas `q` on the
/// clock around the handler, and says where its key is read.
async fn race_on<T: Target>(
    round: u64,
    dry: bool,
    build: impl FnOnce(&[Quota], &tollgate::Clock, Boxed) -> (Boxed, RateLimitHandle, T),
) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (round + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let debts = round % 2 == 1;
    let tight = round % 3 == 2;
    let kinds = shape(round);
    let most = most(&kinds, tight);
    let (clock, _time) = manual();
    let first = rng.next();
    let seen: Seen = Arc::default();
    let (go, release) = watch::channel(false);
    let (app, handle, target) = build(
        &quotas(first, tight, &kinds),
        &clock,
        Boxed::new(Handler {
            seen: seen.clone(),
            release,
        }),
    );
    let ids = Arc::new(AtomicU64::new(0));

    // Phase 1: three tasks reserve, every admitted request held; the quotas change meanwhile.
    let mid = rng.next();
    let changes1 = changer(
        handle.clone(),
        changes(&mut rng, 6, mid),
        tight,
        kinds.clone(),
    );
    let senders: Vec<_> = (0..3)
        .map(|_| {
            let plan: Vec<(u32, Reply)> = (0..4)
                .map(|_| {
                    let cost = 1 + rng.below(3) as u32;
                    let reply = match rng.below(if debts { 5 } else { 4 }) {
                        0 => Reply::Refund,
                        1 => Reply::Keep,
                        2 => Reply::Settle(cost - 1),
                        3 => Reply::Settle(rng.below(u64::from(cost)) as u32),
                        _ => Reply::Settle(cost + 1 + rng.below(3) as u32),
                    };
                    (cost, reply)
                })
                .collect();
            let (app, seen, ids) = (app.clone(), seen.clone(), ids.clone());
            tokio::spawn(async move {
                let mut held = Vec::new();
                for (cost, reply) in plan {
                    let id = ids.fetch_add(1, Ordering::SeqCst);
                    if let Some((task, took)) =
                        send(&app, &seen, id, request(id, cost, reply, true)).await
                    {
                        held.push((task, took, cost, reply));
                    }
                }
                held
            })
        })
        .collect();
    let mut held = Vec::new();
    for t in senders {
        held.extend(t.await.unwrap());
    }
    changes1.await.unwrap();
    if !dry {
        assert!(
            held.iter().all(|h| h.1),
            "an enforcing layer's admission took its cost"
        );
    }
    let reserved: u64 = held.iter().filter(|h| h.1).map(|h| u64::from(h.2)).sum();
    check(
        &target,
        &quotas(mid, tight, &kinds),
        reserved,
        Some(most),
        "reserved",
    )
    .await;

    // Phase 2: the answers arrive among new requests of cost 1 that count, and more changes.
    let last = rng.next();
    let changes2 = changer(
        handle.clone(),
        changes(&mut rng, 6, last),
        tight,
        kinds.clone(),
    );
    let news: Vec<_> = (0..2)
        .map(|_| {
            let (app, seen, ids) = (app.clone(), seen.clone(), ids.clone());
            tokio::spawn(async move {
                let mut took = 0u64;
                for _ in 0..6 {
                    let id = ids.fetch_add(1, Ordering::SeqCst);
                    let req = request(id, 1, Reply::Keep, false);
                    if let Some((task, t)) = send(&app, &seen, id, req).await {
                        assert_eq!(task.await.unwrap(), StatusCode::UNAUTHORIZED);
                        took += u64::from(t);
                    }
                    tokio::task::yield_now().await;
                }
                took
            })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let _ = go.send(true);
    let mut kept = 0;
    for (task, took, cost, reply) in held {
        let st = task.await.unwrap();
        let want = if matches!(reply, Reply::Refund) {
            200
        } else {
            401
        };
        assert_eq!(st.as_u16(), want);
        if took {
            kept += reply.holds(cost);
        }
    }
    for t in news {
        kept += t.await.unwrap();
    }
    changes2.await.unwrap();
    let most = (!debts).then_some(most);
    check(
        &target,
        &quotas(last, tight, &kinds),
        kept,
        most,
        "answered",
    )
    .await;
}

async fn five_kinds_on_one_key_hold_exactly_what_racing_requests_took_and_kept<S: Store>(s: &S)
where
    S::Layer: Handled,
{
    for round in 0..u64::from(S::CASES) / 2 {
        race(s, round, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn five_kinds_on_the_one_key_of_a_global_layer_hold_exactly_what_racing_requests_took_and_kept(
) {
    for round in 0..u64::from(Memory::CASES) / 2 {
        race_global(round, round % 4 == 3).await;
    }
}

async fn five_kinds_in_dry_run_hold_only_what_the_admitted_requests_took<S: Store>(s: &S)
where
    S::Layer: Handled,
{
    for round in 0..u64::from(S::CASES) / 2 {
        race(s, round, true).await;
    }
}
