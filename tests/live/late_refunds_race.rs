//! Refunds and settlements of reservations made before the clock moved and the quota changed,
//! arriving late, on other threads, while new requests of the same key are admitted and the
//! layer's handle changes the quota and is refused every change of kind: a policy of one quota
//! of each kind (GCRA's one word; a fixed window, a sliding counter and warm-up in two words
//! under a sequence number; the sliding log's path of its own), on memory and on Redis.
//!
//! The reservations are made at one instant (a request of cost 2 that settles 1, two of cost 1
//! given back, and a fourth the limit of 4 refuses), then the clock moves and the race starts:
//! two tasks send requests that count while their reservations come back and the quota flips
//! between a limit of 4 and 6 (same width and interval) and ends at 6. Where the reservations
//! still count when their answers arrive (half a window later; half an interval for GCRA),
//! the one unit the settled request kept stays and the rest comes back; once they no longer
//! count (sixty windows later), nothing comes back. Either way, whatever the order, the new requests
//! never pass what the larger limit leaves beside what still counts, and afterwards the key
//! holds exactly what they took and what was kept: no refund gives back more than its own
//! request took, and none is lost to a racing admission. A change of kind is refused through
//! the handle and changes nothing.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change").

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::watch;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{ConfigError, Quota};
use tower::{Service, ServiceExt};

use crate::common::account::rig::manual;
use crate::common::race::Handled;
use crate::common::stores::{Boxed, Store};

/// Every window; a Redis key's time to live runs on the server's clock while the manual one
/// stands, so the windows are long enough that no key of a case expires during it.
const W: Duration = Duration::from_secs(60);

crate::over_both_stores!(
    late_answers_half_a_window_on_give_back_all_but_what_was_kept(
        flavor = "multi_thread",
        worker_threads = 3
    ),
    late_answers_sixty_windows_on_give_back_nothing(flavor = "multi_thread", worker_threads = 3),
);

/// The kinds a policy of one quota is decided by, each on a path of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gcra,
    Fixed,
    Log,
    Counter,
    WarmUp,
}

const KINDS: [Kind; 5] = [
    Kind::Gcra,
    Kind::Fixed,
    Kind::Log,
    Kind::Counter,
    Kind::WarmUp,
];

/// A quota of `kind` with a limit (or burst) of `n`: every window `W`; every interval a
/// quarter of it, so that `n` changes the burst and nothing else.
fn quota(kind: Kind, n: u32) -> Quota {
    match kind {
        Kind::Gcra => Quota::new(1, W / 4).burst(n),
        Kind::Fixed => Quota::fixed_window(n, W),
        Kind::Log => Quota::sliding_log(n, W),
        Kind::Counter => Quota::sliding_window(n, W),
        Kind::WarmUp => Quota::new(1, W / 4).burst(n).warm_up(2 * W, 3),
    }
}

/// The handler: answers with the status in `x-status` (200 is given back by the layer's
/// `count_if`) and the actual cost in `x-actual`; a request with `x-hold: n` waits until the
/// test has released `n` held requests. Counts the requests it was handed (admitted).
#[derive(Clone)]
struct Held {
    entered: Arc<AtomicU32>,
    release: watch::Receiver<u32>,
}

impl Service<Request<()>> for Held {
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
                .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
        };
        let status = number("x-status").unwrap_or(401);
        let actual = number("x-actual");
        let hold = number("x-hold");
        let mut release = self.release.clone();
        self.entered.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if let Some(n) = hold {
                let _ = release.wait_for(|released| *released >= n).await;
            }
            let mut resp = Response::new(Full::new(Bytes::from_static(b"done")));
            *resp.status_mut() = StatusCode::from_u16(status as u16).unwrap();
            if let Some(n) = actual {
                resp.extensions_mut().insert(ActualCost(n));
            }
            Ok(resp)
        })
    }
}

fn request(cost: u32, status: u16, actual: Option<u32>, hold: Option<u32>) -> Request<()> {
    let mut b = Request::post("/")
        .header("x-key", "k")
        .header("x-cost", cost.to_string())
        .header("x-status", status.to_string());
    if let Some(n) = actual {
        b = b.header("x-actual", n.to_string());
    }
    if let Some(n) = hold {
        b = b.header("x-hold", n.to_string());
    }
    b.body(()).unwrap()
}

/// Sends a held request: `Some(task)` when the layer admitted it (the handler holds it until
/// released), `None` when it was refused.
async fn send_held(
    app: &Boxed,
    entered: &AtomicU32,
    req: Request<()>,
) -> Option<tokio::task::JoinHandle<StatusCode>> {
    let before = entered.load(Ordering::SeqCst);
    let task = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(req).await.unwrap().status() }
    });
    loop {
        if entered.load(Ordering::SeqCst) > before {
            return Some(task);
        }
        if task.is_finished() {
            assert_eq!(task.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// Runs the race for `kind`: the reservations made at one instant, the clock moved by
/// `later`, then their answers racing new requests and changes. Returns how many new requests
/// were admitted; the caller checks the key.
async fn race<S: Store>(s: &S, kind: Kind, name: &str, later: Duration) -> (u64, S::Limiter)
where
    S::Layer: Handled,
{
    let (clock, time) = manual();
    let l = s.layer(&[quota(kind, 4)], name, &clock);
    let handle = l.handle_of();
    let lim = s.limiter(&l, name);
    let (go, release) = watch::channel(0u32);
    let entered = Arc::new(AtomicU32::new(0));
    let app = s.around(
        &l,
        Boxed::new(Held {
            entered: entered.clone(),
            release,
        }),
    );
    // The reservations: 2 settling 1, two of 1 given back; the limit of 4 refuses a fifth
    // unit (a cold warm-up key may admit fewer).
    let a = send_held(&app, &entered, request(2, 401, Some(1), Some(1))).await;
    let b = send_held(&app, &entered, request(1, 200, None, Some(2))).await;
    let c = send_held(&app, &entered, request(1, 200, None, Some(3))).await;
    let d = send_held(&app, &entered, request(1, 401, None, Some(4))).await;
    if kind != Kind::WarmUp {
        assert!(a.is_some() && b.is_some() && c.is_some(), "{kind:?}");
        assert!(d.is_none(), "{kind:?}: a fifth unit past the limit of 4");
    }
    let held: Vec<_> = [a, b, c, d].into_iter().flatten().collect();
    s.keep(&lim, "k").await;
    time.advance(later);

    let admitted = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (app, admitted, done) = (app.clone(), admitted.clone(), done.clone());
            tokio::spawn(async move {
                // Until the answers and the changes are over, and a few after.
                let mut after = 0;
                while after < 4 {
                    after += u32::from(done.load(Ordering::SeqCst));
                    let st = app.clone().oneshot(request(1, 401, None, None)).await;
                    if st.unwrap().status() == StatusCode::UNAUTHORIZED {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let changer = tokio::spawn({
        let handle = handle.clone();
        async move {
            for i in 0..60u32 {
                handle
                    .set_default_quotas([quota(kind, if i % 2 == 0 { 6 } else { 4 })])
                    .unwrap();
                let other = KINDS[(i as usize) % KINDS.len()];
                if other != kind {
                    assert!(
                        matches!(
                            handle.set_default_quotas([quota(other, 6)]),
                            Err(ConfigError::NotChangeable(_))
                        ),
                        "{kind:?} changed to {other:?}"
                    );
                }
                tokio::task::yield_now().await;
            }
            handle.set_default_quotas([quota(kind, 6)]).unwrap();
        }
    });
    // The answers, one at a time among the new requests and the changes.
    for n in 1..=4 {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let _ = go.send(n);
    }
    for h in held {
        let st = h.await.unwrap();
        assert!(
            st == StatusCode::OK || st == StatusCode::UNAUTHORIZED,
            "{st}"
        );
    }
    changer.await.unwrap();
    done.store(true, Ordering::SeqCst);
    for t in senders {
        t.await.unwrap();
    }
    assert_eq!(handle.policies()[0].quotas(), [quota(kind, 6)]);
    s.keep(&lim, "k").await;
    (u64::from(admitted.load(Ordering::SeqCst)), lim)
}

async fn late_answers_half_a_window_on_give_back_all_but_what_was_kept<S: Store>(s: &S)
where
    S::Layer: Handled,
{
    // Half a window, for a counter half a window into the next one (the reservations weigh
    // as the previous window's); half an interval for GCRA. Warm-up's price of a reservation
    // depends on how cold the key was: sixty windows on is its case.
    for (kind, later) in [
        (Kind::Gcra, W / 8),
        (Kind::Fixed, W / 2),
        (Kind::Log, W / 2),
        (Kind::Counter, 3 * W / 2),
    ] {
        for round in 0..S::CASES / 10 {
            let name = format!("half-{kind:?}-{round}");
            let (admitted, lim) = race(s, kind, &name, later).await;
            // One unit kept (GCRA: the half interval still ahead of now) weighs beside the new
            // requests under the final limit of 6.
            assert!(admitted <= 5, "{kind:?}: {admitted} admitted");
            let d = s.peek(&lim, "k").await;
            assert_eq!(
                d.states()[0].remaining(),
                5 - admitted,
                "{kind:?}: {admitted} admitted"
            );
        }
    }
}

async fn late_answers_sixty_windows_on_give_back_nothing<S: Store>(s: &S)
where
    S::Layer: Handled,
{
    for kind in KINDS {
        for round in 0..S::CASES / 10 {
            let name = format!("far-{kind:?}-{round}");
            let (admitted, lim) = race(s, kind, &name, 60 * W).await;
            assert!(admitted <= 6, "{kind:?}: {admitted} admitted");
            let d = s.peek(&lim, "k").await;
            if kind == Kind::WarmUp {
                // As a new key that admitted as many, one by one, under the final quota.
                let (clock, time) = manual();
                time.advance(60 * W);
                let twin = s.build(&[quota(kind, 6)], &format!("twin-{name}"), &clock);
                for _ in 0..admitted {
                    assert!(s.check(&twin, "k").await.is_allowed(), "{kind:?}");
                }
                let t = s.peek(&twin, "k").await;
                assert_eq!(d.states()[0].remaining(), t.states()[0].remaining());
                assert_eq!(d.reset_after(), t.reset_after(), "{kind:?}");
            } else {
                assert_eq!(
                    d.states()[0].remaining(),
                    6 - admitted,
                    "{kind:?}: {admitted} admitted"
                );
            }
        }
    }
}
