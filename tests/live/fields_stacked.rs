//! `RateLimit-Policy` and `RateLimit` agree with the decisions a request carries, through two
//! stacked layers whose handles change their policies while other threads are served: an
//! outer layer of GCRA and a fixed window, an inner one of a sliding log and a sliding
//! counter, each flipping between two policies that differ in every limit. Requests of costs 1
//! to 3 come from keys never seen, so each quota reports its limit less the cost.
//!
//! For every response, each layer's field values (the inner layer's first, as it answers
//! first) hold one item per quota, in policy order, named as the policy names them, and item
//! by item: `q` is the limit of the quota whose state the layer's decision (`Decisions`,
//! outermost first) reports, `w` its window, `r` its remaining and `t` its time until reset
//! in whole seconds, rounded up; and a layer's items are all of one policy, the old or the
//! new, never a mix. On memory and on Redis (the layers under names of their own).
//!
//! Two races: each change flips a layer to its other policy; and some changes put in force
//! the policy already in force, so that a request overlapping two changes was decided by
//! neither the policy in force nor the one it replaced (`fields_overlap.rs` makes such a
//! request at will).
//!
//! Pins docs/design.md section 2 (`RateLimit-Policy` and `RateLimit`, one list item per
//! quota) and section 3 ("A live quota change", "Stacked layers").

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::key::Header;
use tollgate::{Decisions, Policy, Quota, RateLimitLayer};
use tower::ServiceExt;

use crate::common::account::rig::manual;
use crate::common::race::Handled;
use crate::common::stores::{x_cost, Boxed, Store};

crate::over_both_stores!(
    stacked_layers_flipped_while_serving_send_the_fields_of_the_decisions_they_made(
        flavor = "multi_thread",
        worker_threads = 3
    ),
);

const S: Duration = Duration::from_secs(1);

/// A server with no request in flight.
const IDLE: u64 = u64::MAX;

/// The most changes a request overlaps: fewer than the policies a layer keeps (the one in
/// force and the last seven it replaced, see `RateLimitHandle`).
const OVERLAP: u64 = 6;

/// The outer policy, `a` or `b`: GCRA (4 or 8 a second) and a fixed window of 2 s (10 or 20).
fn outer(b: bool) -> Policy {
    let (g, f) = if b { (8, 20) } else { (4, 10) };
    Policy::new("outer", Quota::per_second(g).named("o-rate"))
        .quota(Quota::fixed_window(f, 2 * S).named("o-window"))
}

/// The inner policy, `a` or `b`: a sliding log of 1 s (5 or 9) and a sliding counter of 3 s
/// (6 or 12).
fn inner(b: bool) -> Policy {
    let (l, c) = if b { (9, 12) } else { (5, 6) };
    Policy::new("inner", Quota::sliding_log(l, S).named("i-log"))
        .quota(Quota::sliding_window(c, 3 * S).named("i-counter"))
}

/// (q, w) of each quota of each policy of a layer.
fn figures(outer_layer: bool, b: bool) -> [(u64, u64); 2] {
    match (outer_layer, b) {
        (true, false) => [(4, 1), (10, 2)],
        (true, true) => [(8, 1), (20, 2)],
        (false, false) => [(5, 1), (6, 3)],
        (false, true) => [(9, 1), (12, 3)],
    }
}

/// Answers with what each decision reports per quota: `limit remaining reset_ns;` per quota,
/// `|` between decisions, outermost first.
async fn handler(r: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let all = Decisions::from_extensions(r.extensions());
    let body: Vec<String> = all
        .iter()
        .map(|d| {
            d.states()
                .iter()
                .map(|s| {
                    format!(
                        "{} {} {}",
                        s.limit(),
                        s.remaining(),
                        s.reset_after().as_nanos()
                    )
                })
                .collect::<Vec<_>>()
                .join(";")
        })
        .collect();
    Ok(Response::new(Full::new(Bytes::from(body.join("|")))))
}

/// The items of a field value: (name, [(parameter, number)]).
fn items(value: &str) -> Vec<(String, Vec<(String, u64)>)> {
    value
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_owned(), v.parse().unwrap())
                })
                .collect();
            (name, params)
        })
        .collect()
}

fn param(item: &(String, Vec<(String, u64)>), k: &str) -> u64 {
    item.1
        .iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("{k} in {item:?}"))
        .1
}

/// Checks one response: its fields against the decisions the handler read. Returns how many
/// layers sent the `RateLimit-Policy` of another policy than the one that decided.
async fn check(resp: Response<Full<Bytes>>) -> u32 {
    let mut other = 0;
    assert_eq!(resp.status(), StatusCode::OK);
    let values = |name: &str| -> Vec<String> {
        resp.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let (policies, limits) = (values("ratelimit-policy"), values("ratelimit"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let decisions: Vec<Vec<[u64; 3]>> = std::str::from_utf8(&body)
        .unwrap()
        .split('|')
        .map(|d| {
            d.split(';')
                .map(|s| {
                    let n: Vec<u64> = s.split(' ').map(|x| x.parse().unwrap()).collect();
                    [n[0], n[1], n[2]]
                })
                .collect()
        })
        .collect();
    assert_eq!(decisions.len(), 2, "one decision per layer");
    assert_eq!(policies.len(), 2, "{policies:?}");
    assert_eq!(limits.len(), 2, "{limits:?}");
    // The inner layer answers first: its values come first; the decisions, outermost first.
    for (layer, (p, r)) in [
        (false, (&policies[0], &limits[0])),
        (true, (&policies[1], &limits[1])),
    ] {
        let name = if layer { "outer" } else { "inner" };
        let d = &decisions[usize::from(!layer)];
        let (p, r) = (items(p), items(r));
        assert_eq!(p.len(), 2, "{name}: {p:?}");
        assert_eq!(r.len(), 2, "{name}: {r:?}");
        let names = if layer {
            ["o-rate", "o-window"]
        } else {
            ["i-log", "i-counter"]
        };
        let one_policy = [false, true].into_iter().any(|b| {
            figures(layer, b)
                .iter()
                .zip(&p)
                .all(|(&(q, w), i)| param(i, "q") == q && param(i, "w") == w)
        });
        assert!(one_policy, "{name}: {p:?} is not one policy's");
        // The policy's items are one policy's: the first item's `q` tells which.
        other += u32::from(param(&p[0], "q") != d[0][0]);
        for j in 0..2 {
            assert_eq!(p[j].0, names[j], "{name}: {p:?}");
            assert_eq!(r[j].0, names[j], "{name}: {r:?}");
            let [limit, remaining, reset_ns] = d[j];
            assert!(
                param(&p[j], "q") == limit || other > 0,
                "{name} {j}: q against the decision {d:?}"
            );
            assert_eq!(param(&r[j], "r"), remaining, "{name} {j}: r against {d:?}");
            assert_eq!(
                param(&r[j], "t"),
                reset_ns.div_ceil(1_000_000_000),
                "{name} {j}: t against {d:?}"
            );
        }
    }
    other
}

/// Two threads serve new keys through both layers while each layer's handle changes its
/// policy 200 times; with `again`, some changes put in force the policy already in force,
/// else each change flips to the other policy. Every response is checked; returns how many
/// responses sent a layer's `RateLimit-Policy` of another policy than its decision's.
async fn race<S: Store>(s: &S, again: bool) -> u32
where
    S::Layer: Handled,
{
    let (clock, _time) = manual();
    let layer = |p: Policy| {
        s.on(RateLimitLayer::new(p)
            .key(Header::new("x-key"))
            .clock(clock.clone())
            .cost(x_cost))
    };
    let (o, i) = (layer(outer(false)), layer(inner(false)));
    let (oh, ih) = (o.handle_of(), i.handle_of());
    let app = s.around(&o, s.around(&i, Boxed::new(tower::service_fn(handler))));
    let done = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    // How many changes were made, and per server the count when its request in flight began
    // (`IDLE` between requests): the layer answers a decision with the policy that judged
    // it for as many changes as it keeps, so no request may overlap more of them.
    let changes = Arc::new(AtomicU64::new(0));
    let began: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(IDLE), AtomicU64::new(IDLE)]);
    let servers: Vec<_> = (0..2)
        .map(|i| {
            let (app, done, next) = (app.clone(), done.clone(), next.clone());
            let (changes, began) = (changes.clone(), began.clone());
            tokio::spawn(async move {
                let (mut served, mut other) = (0u32, 0u32);
                while !done.load(Ordering::Relaxed) || served < 4 {
                    began[i].store(changes.load(Ordering::SeqCst), Ordering::SeqCst);
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let req = Request::get("/")
                        .header("x-key", format!("k{n}"))
                        .header("x-cost", (1 + n % 3).to_string())
                        .body(())
                        .unwrap();
                    other += check(app.clone().oneshot(req).await.unwrap()).await;
                    began[i].store(IDLE, Ordering::SeqCst);
                    served += 1;
                    tokio::task::yield_now().await;
                }
                (served, other)
            })
        })
        .collect();
    for n in 0..200u64 {
        // A request that began `OVERLAP` changes ago ends before the next change.
        while began
            .iter()
            .any(|b| b.load(Ordering::SeqCst).saturating_add(OVERLAP) <= n)
            && !servers.iter().any(|s| s.is_finished())
        {
            tokio::task::yield_now().await;
        }
        let at = next.load(Ordering::Relaxed);
        if again {
            // Outer: b a . a b . b a . a …; inner: b . a a . b b . a …
            if n % 3 != 2 {
                oh.apply(&outer(n % 2 == 0)).unwrap();
            }
            if n % 3 != 1 {
                ih.apply(&inner(n % 4 < 2)).unwrap();
            }
        } else {
            oh.apply(&outer(n % 2 == 0)).unwrap();
            ih.apply(&inner(n % 2 == 0)).unwrap();
        }
        changes.store(n + 1, Ordering::SeqCst);
        // Each policy serves a request or two before the next change.
        while next.load(Ordering::Relaxed) < at + 2 && !servers.iter().any(|s| s.is_finished()) {
            tokio::task::yield_now().await;
        }
    }
    done.store(true, Ordering::Relaxed);
    let (mut served, mut other) = (0, 0);
    for t in servers {
        let (s, o) = t.await.unwrap();
        served += s;
        other += o;
    }
    assert!(served >= 200, "{served} served");
    other
}

async fn stacked_layers_flipped_while_serving_send_the_fields_of_the_decisions_they_made<S: Store>(
    s: &S,
) where
    S::Layer: Handled,
{
    let other = race(s, false).await;
    assert_eq!(
        other, 0,
        "responses whose RateLimit-Policy is another policy's"
    );
}

/// The same with changes that put in force the policy already in force: a request that
/// overlaps such a change and one before it must still get its decision's fields.
async fn stacked_layers_changed_again_while_serving_send_the_fields_of_the_decisions_they_made<
    S: Store,
>(
    s: &S,
) where
    S::Layer: Handled,
{
    let other = race(s, true).await;
    assert_eq!(
        other, 0,
        "responses whose RateLimit-Policy is another policy's"
    );
}

/// A request decided by one policy over which two changes were made (the second putting
/// back the policy already in force, or a third one) gets the fields of the policy that
/// decided it, the rule docs/design.md section 2 states: the decision carries the
/// generation of its quotas, and the layer keeps the policies of its last changes.
mod overlapping {
    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn memory() {
        super::stacked_layers_changed_again_while_serving_send_the_fields_of_the_decisions_they_made(
            &crate::common::stores::Memory,
        )
        .await;
    }

    #[cfg(feature = "redis")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn redis() {
        super::stacked_layers_changed_again_while_serving_send_the_fields_of_the_decisions_they_made(
            &crate::common::stores::OnRedis::start().await,
        )
        .await;
    }
}
