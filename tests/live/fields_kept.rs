//! How far back the layer answers a request with the fields of the policy that judged it: a
//! request admitted under `per_second(4)` and held by its handler while the policy changes
//! 1, 7, 8 or 9 times (through the layer's handle, or on the tier's limiter itself, mixed),
//! then answered as a counted failure (settled at its cost) or as a success that `count_if`
//! gives back. The layer keeps the policies of its last seven changes beside the one in force
//! (`RateLimitHandle`'s docs): over at most seven changes the fields are `q=4` beside the
//! decision's `r=3`; over eight or more, those of the policy in force. A change made on the
//! limiter itself is one the layer never sees: it keeps no policy for it, so it takes no place
//! among those kept, and a request its quotas judged gets the fields of the policy in force.
//! Two stacked layers of one policy name (one state per key on Redis), each changed apart:
//! each layer answers with its own policy by the same rule. On memory and on Redis.
//!
//! Pins docs/design.md section 2 (`RateLimit-Policy` and `RateLimit`) and section 3 ("A live
//! quota change").

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tollgate::Quota;
use tower::ServiceExt;

use crate::common::account::rig::manual;
use crate::common::race::Handled;
use crate::common::stores::{Boxed, Store};

crate::over_both_stores!(
    a_request_held_over_at_most_seven_changes_gets_the_fields_of_its_own_policy,
    a_request_held_over_eight_changes_or_more_gets_the_fields_of_the_policy_in_force,
    a_request_given_back_after_changes_gets_the_fields_of_the_quotas_in_force,
    changes_made_on_the_limiter_itself_take_no_place_among_the_policies_kept,
    a_request_judged_by_quotas_set_on_the_limiter_itself_gets_the_fields_in_force,
    stacked_layers_of_one_name_each_answer_with_the_policy_that_judged_the_request,
);

/// A change of the policy to `per_second(n)`.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Through the layer's handle.
    Handle(u32),
    /// On the tier's limiter itself.
    Limiter(u32),
}

use Change::{Handle, Limiter};

/// A counted failure, settled at its cost.
const FAILED: StatusCode = StatusCode::UNAUTHORIZED;

/// The number after `k=` in the response's field `name`.
fn number(resp: &Response<Full<Bytes>>, name: &str, k: &str) -> u64 {
    let value = resp.headers()[name].to_str().unwrap();
    let at = value.find(k).unwrap_or_else(|| panic!("{k} in {value}")) + k.len();
    let digits: String = value[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// `before` made first; then a request of cost 1 admitted and held by the handler while
/// `during` are made in turn; then answered with `status` (401 counts and settles at its
/// cost, 200 is given back). Returns (q, r) of its fields.
async fn over<S: Store>(
    s: &S,
    name: &str,
    before: &[Change],
    during: &[Change],
    status: StatusCode,
) -> (u64, u64)
where
    S::Layer: Handled,
{
    let (clock, _time) = manual();
    let l = s.layer(&[Quota::per_second(4)], name, &clock);
    let handle = l.handle_of();
    let limiter = s.limiter(&l, name);
    let change = |c: Change| match c {
        Handle(n) => handle.set_default_quotas([Quota::per_second(n)]).unwrap(),
        Limiter(n) => s.set_quotas(&limiter, vec![Quota::per_second(n)]),
    };
    before.iter().copied().for_each(change);
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicBool::new(false));
    let handler = {
        let (gate, entered) = (gate.clone(), entered.clone());
        tower::service_fn(move |_: Request<()>| {
            let (gate, entered) = (gate.clone(), entered.clone());
            async move {
                entered.store(true, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                let mut resp = Response::new(Full::new(Bytes::new()));
                *resp.status_mut() = status;
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let app = s.around(&l, Boxed::new(handler));
    let req = Request::post("/").header("x-key", "k").body(()).unwrap();
    let task = tokio::spawn(app.oneshot(req));
    while !entered.load(Ordering::SeqCst) {
        tokio::task::yield_now().await;
    }
    during.iter().copied().for_each(change);
    gate.add_permits(1);
    let resp = task.await.unwrap().unwrap();
    assert_eq!(resp.status(), status);
    (
        number(&resp, "ratelimit-policy", "q="),
        number(&resp, "ratelimit", "r="),
    )
}

/// `n` handle changes to 5, 6, 7, ...
fn handle_changes(n: u32) -> Vec<Change> {
    (0..n).map(|i| Handle(5 + i)).collect()
}

async fn a_request_held_over_at_most_seven_changes_gets_the_fields_of_its_own_policy<S: Store>(
    s: &S,
) where
    S::Layer: Handled,
{
    for n in [1, 6, 7] {
        let got = over(s, &format!("own{n}"), &[], &handle_changes(n), FAILED).await;
        assert_eq!(got, (4, 3), "over {n} change(s)");
    }
}

async fn a_request_held_over_eight_changes_or_more_gets_the_fields_of_the_policy_in_force<
    S: Store,
>(
    s: &S,
) where
    S::Layer: Handled,
{
    for n in [8, 9] {
        let (q, _) = over(s, &format!("force{n}"), &[], &handle_changes(n), FAILED).await;
        assert_eq!(q, u64::from(4 + n), "over {n} changes");
    }
}

/// A success that `count_if` gives back is settled at 0: its fields are those of the
/// settlement, judged by the quotas in force when it is answered (`r` all of the new limit,
/// the request's unit back), however many changes it was held over.
async fn a_request_given_back_after_changes_gets_the_fields_of_the_quotas_in_force<S: Store>(s: &S)
where
    S::Layer: Handled,
{
    for n in [1, 7, 8, 9] {
        let name = format!("back{n}");
        let got = over(s, &name, &[], &handle_changes(n), StatusCode::OK).await;
        assert_eq!(
            got,
            (u64::from(4 + n), u64::from(4 + n)),
            "over {n} change(s)"
        );
    }
}

/// Seven handle changes and any number made on the limiter itself between them: the policy
/// that judged the request is still among those kept.
async fn changes_made_on_the_limiter_itself_take_no_place_among_the_policies_kept<S: Store>(s: &S)
where
    S::Layer: Handled,
{
    let during = [
        Limiter(20),
        Handle(5),
        Limiter(21),
        Limiter(22),
        Handle(6),
        Handle(7),
        Limiter(23),
        Handle(8),
        Handle(9),
        Handle(10),
        Limiter(24),
        Handle(11),
    ];
    let got = over(s, "mixed", &[], &during, FAILED).await;
    assert_eq!(got, (4, 3));
    // Decided after a change on the limiter that a handle change then followed: by then the
    // tier is in step again, and the request's own policy is the handle's.
    let got = over(
        s,
        "after",
        &[Limiter(20), Handle(4)],
        &[Handle(9), Limiter(30), Handle(10)],
        FAILED,
    )
    .await;
    assert_eq!(got, (4, 3));
}

/// A request judged by `per_second(6)` set on the limiter itself: the layer never saw that
/// policy, so its fields are those of the policy in force when it is answered.
async fn a_request_judged_by_quotas_set_on_the_limiter_itself_gets_the_fields_in_force<S: Store>(
    s: &S,
) where
    S::Layer: Handled,
{
    let (q, _) = over(s, "unseen", &[Limiter(6)], &[], FAILED).await;
    assert_eq!(q, 4, "no change since: the policy the handle last set");
    let (q, _) = over(s, "unseen2", &[Limiter(6)], &[Handle(9)], FAILED).await;
    assert_eq!(q, 9, "a handle change since: the policy in force");
}

/// Two stacked layers of one policy name (on Redis one state per key, judged by each layer's
/// own quotas), a request held while each layer's handle changes its policy `outer` and
/// `inner` times, the changes interleaved: each layer's items (the inner layer's first) are
/// those of its own policy that judged the request when that layer changed at most seven
/// times, else those of its policy in force.
async fn stacked_layers_of_one_name_each_answer_with_the_policy_that_judged_the_request<S: Store>(
    s: &S,
) where
    S::Layer: Handled,
{
    for (round, (outer, inner)) in [(7, 0), (0, 7), (7, 7), (8, 1), (1, 8), (9, 9)]
        .into_iter()
        .enumerate()
    {
        let (clock, _time) = manual();
        let name = format!("shared{round}");
        let l_out = s.on(crate::common::stores::layer(
            &[Quota::per_second(4)],
            &name,
            &clock,
        ));
        let l_in = s.on(crate::common::stores::layer(
            &[Quota::per_second(6)],
            &name,
            &clock,
        ));
        let (h_out, h_in) = (l_out.handle_of(), l_in.handle_of());
        let gate = Arc::new(Semaphore::new(0));
        let entered = Arc::new(AtomicBool::new(false));
        let handler = {
            let (gate, entered) = (gate.clone(), entered.clone());
            tower::service_fn(move |_: Request<()>| {
                let (gate, entered) = (gate.clone(), entered.clone());
                async move {
                    entered.store(true, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                    let mut resp = Response::new(Full::new(Bytes::new()));
                    *resp.status_mut() = FAILED;
                    Ok::<_, Infallible>(resp)
                }
            })
        };
        let app = s.around(&l_out, s.around(&l_in, Boxed::new(handler)));
        let req = Request::post("/").header("x-key", "k").body(()).unwrap();
        let task = tokio::spawn(app.oneshot(req));
        while !entered.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
        for i in 0..outer.max(inner) {
            if i < outer {
                h_out
                    .set_default_quotas([Quota::per_second(10 + i)])
                    .unwrap();
            }
            if i < inner {
                h_in.set_default_quotas([Quota::per_second(30 + i)])
                    .unwrap();
            }
        }
        gate.add_permits(1);
        let resp = task.await.unwrap().unwrap();
        assert_eq!(resp.status(), FAILED);
        let policies: Vec<String> = resp
            .headers()
            .get_all("ratelimit-policy")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        let q = |v: &str| -> u64 {
            let at = v.find("q=").unwrap() + 2;
            v[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap()
        };
        let got: Vec<u64> = policies.iter().map(|v| q(v)).collect();
        let own = |changes: u32, first: u64, base: u32| {
            if changes <= 7 {
                first
            } else {
                u64::from(base + changes - 1)
            }
        };
        assert_eq!(
            got,
            vec![own(inner, 6, 30), own(outer, 4, 10)],
            "outer changed {outer} times, inner {inner}: {policies:?}"
        );
    }
}
