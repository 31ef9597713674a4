//! The fields of a request whose decision and response are apart while the layer's handle
//! changes its policy: a layer that settles renders `RateLimit-Policy` and `RateLimit` when
//! the response comes, so the handler holding the request lets the test make changes between
//! the decision and the fields. Whatever was changed meanwhile, the fields are those of the
//! quotas that decided the request: `q` the limit its decision reports beside `r`. On memory
//! and on Redis.
//!
//! Pins docs/design.md section 2 (`RateLimit-Policy` and `RateLimit`) and section 3 ("A live
//! quota change").

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tollgate::Quota;
use tower::ServiceExt;

use crate::common::account::rig::manual;
use crate::common::race::Handled;
use crate::common::stores::{Boxed, Store};

crate::over_both_stores!(
    a_settled_request_over_one_change_gets_the_fields_of_the_policy_that_decided_it,
    a_settled_request_over_a_change_back_gets_the_fields_of_the_policy_that_decided_it,
);

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

/// A request of cost 1 admitted under `per_second(4)` and held by the handler while the
/// quotas become each of `changes` in turn; then answered with a counted 401 that settles at
/// its cost. Returns (q, r) of its fields.
async fn over<S: Store>(s: &S, name: &str, changes: &[u32]) -> (u64, u64)
where
    S::Layer: Handled,
{
    let (clock, _time) = manual();
    let l = s.layer(&[Quota::per_second(4)], name, &clock);
    let handle = l.handle_of();
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
                *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
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
    for &n in changes {
        handle.set_default_quotas([Quota::per_second(n)]).unwrap();
    }
    gate.add_permits(1);
    let resp = task.await.unwrap().unwrap();
    assert_eq!(resp.status(), http::StatusCode::UNAUTHORIZED);
    (
        number(&resp, "ratelimit-policy", "q="),
        number(&resp, "ratelimit", "r="),
    )
}

async fn a_settled_request_over_one_change_gets_the_fields_of_the_policy_that_decided_it<S: Store>(
    s: &S,
) where
    S::Layer: Handled,
{
    assert_eq!(over(s, "one", &[8]).await, (4, 3));
}

/// Changed to 8, then back to 4: the policy in force decided it.
async fn a_settled_request_over_a_change_back_gets_the_fields_of_the_policy_that_decided_it<
    S: Store,
>(
    s: &S,
) where
    S::Layer: Handled,
{
    assert_eq!(over(s, "back", &[8, 4]).await, (4, 3));
}

/// Changed to 8, then to 16 (or to 8 again): neither the policy in force nor the one it
/// replaced decided the request, and its fields must still be those of the one that did.
async fn a_settled_request_over_two_changes_gets_the_fields_of_the_policy_that_decided_it<
    S: Store,
>(
    s: &S,
) where
    S::Layer: Handled,
{
    assert_eq!(
        over(s, "two", &[8, 16]).await,
        (4, 3),
        "changed to 8, then 16"
    );
    assert_eq!(
        over(s, "again", &[8, 8]).await,
        (4, 3),
        "changed to 8, then 8 again"
    );
}

/// [`a_settled_request_over_two_changes_gets_the_fields_of_the_policy_that_decided_it`] on
/// each store: the layer keeps the policies of the last changes and answers a decision with
/// the one whose generation judged it (q=4 beside r=3, not the q=16 in force).
mod two_changes {
    #[tokio::test]
    async fn memory() {
        super::a_settled_request_over_two_changes_gets_the_fields_of_the_policy_that_decided_it(
            &crate::common::stores::Memory,
        )
        .await;
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redis() {
        super::a_settled_request_over_two_changes_gets_the_fields_of_the_policy_that_decided_it(
            &crate::common::stores::OnRedis::start().await,
        )
        .await;
    }
}
