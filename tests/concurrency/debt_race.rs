//! A lower maximum against everything that can happen in one instant: requests arriving,
//! responses given back, waiters going away and the maximum changing, in any order and with
//! no task run in between, then everything settling. A request starts only when, counting
//! itself, no more than the maximum in force are in flight (docs/design.md section 1: a
//! lower maximum lets the requests in flight finish and starts nobody until fewer than it
//! are in flight), globally and per key, and nothing is left in flight or tracked at the end.
//!
//! Responses are held by the test itself, so giving one back hands its place to a waiter
//! that has not run yet, and a waiter that goes away in that instant (its task aborted)
//! hands it on inside the queue: the race a place must pay a debt in.
//!
//! Pins docs/design.md section 1 ("Concurrency limit").

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use proptest::prelude::*;
use tokio::sync::mpsc;
use tollgate::key::Header;
use tollgate::ConcurrencyLimitLayer;
use tower::{Layer, ServiceExt};

type Boxed = tower::util::BoxCloneService<
    Request<()>,
    Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// What a layer still holds: requests in flight, keys tracked.
type Left = Box<dyn Fn() -> (usize, usize)>;

#[derive(Debug, Clone)]
enum Op {
    /// A request arrives (its task is spawned, not run).
    Arrive,
    /// The response held longest is given back, if any.
    GiveBack,
    /// The waiter that arrived `n`-th among those still waiting goes away.
    GoAway(usize),
    /// The maximum becomes this.
    SetMax(usize),
    /// Every task runs until nothing moves.
    Settle,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => Just(Op::Arrive),
        2 => Just(Op::GiveBack),
        1 => (0usize..4).prop_map(Op::GoAway),
        2 => (1usize..4).prop_map(Op::SetMax),
        2 => Just(Op::Settle),
    ];
    prop::collection::vec(op, 1..60)
}

/// What went wrong, if anything: a request that started with more in flight than the
/// maximum in force, or what was left at the end.
async fn run(ops: Vec<Op>, keyed: bool) -> Result<(), String> {
    let flying = Arc::new(AtomicUsize::new(0));
    let max_now = Arc::new(AtomicUsize::new(2));
    let over = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (flying, max_now, over) = (flying.clone(), max_now.clone(), over.clone());
        tower::service_fn(move |_: Request<()>| {
            let n = flying.fetch_add(1, Ordering::SeqCst) + 1;
            if n > max_now.load(Ordering::SeqCst) {
                over.fetch_add(1, Ordering::SeqCst);
            }
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
        })
    };
    let layer = ConcurrencyLimitLayer::new(2).queue(4, Duration::from_secs(3_600));
    let (svc, handle, left): (Boxed, _, Left) = if keyed {
        let layer = layer.key(Header::new("x-key"));
        let handle = layer.handle().unwrap();
        let svc = Boxed::new(layer.clone().layer(handler));
        (svc, handle, Box::new(move || (0, layer.tracked_keys())))
    } else {
        let handle = layer.handle().unwrap();
        let svc = Boxed::new(layer.clone().layer(handler));
        (svc, handle, Box::new(move || (layer.in_flight(), 0)))
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut held = std::collections::VecDeque::new();
    let mut waiting: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    for op in ops {
        match op {
            Op::Arrive => {
                let (svc, tx) = (svc.clone(), tx.clone());
                waiting.push(tokio::spawn(async move {
                    let req = Request::get("/").header("x-key", "k").body(()).unwrap();
                    let Ok(resp) = svc.oneshot(req).await;
                    if resp.status() == 200 {
                        let _ = tx.send(resp);
                    }
                }));
            }
            Op::GiveBack => {
                while let Ok(resp) = rx.try_recv() {
                    held.push_back(resp);
                }
                if let Some(resp) = held.pop_front() {
                    flying.fetch_sub(1, Ordering::SeqCst);
                    drop(resp);
                }
            }
            Op::GoAway(n) => {
                waiting.retain(|t| !t.is_finished());
                if !waiting.is_empty() {
                    waiting.remove(n % waiting.len()).abort();
                }
            }
            Op::SetMax(max) => {
                handle.set_max(max).unwrap();
                max_now.store(max, Ordering::SeqCst);
            }
            Op::Settle => {
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    // Give everything back, letting every waiter in turn.
    handle.set_max(3).unwrap();
    max_now.store(3, Ordering::SeqCst);
    for _ in 0..64 {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        while let Ok(resp) = rx.try_recv() {
            held.push_back(resp);
        }
        while let Some(resp) = held.pop_front() {
            flying.fetch_sub(1, Ordering::SeqCst);
            drop(resp);
        }
        waiting.retain(|t| !t.is_finished());
        if waiting.is_empty() {
            break;
        }
    }
    let over = over.load(Ordering::SeqCst);
    if over > 0 {
        return Err(format!(
            "{over} request(s) started over the maximum in force"
        ));
    }
    if !waiting.is_empty() {
        return Err(format!(
            "{} request(s) still waiting at the end",
            waiting.len()
        ));
    }
    let (in_flight, keys) = left();
    if in_flight != 0 || keys != 0 {
        return Err(format!("left: {in_flight} in flight, {keys} keys"));
    }
    Ok(())
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_request_starts_over_the_maximum_in_force_whatever_happens_in_one_instant(
        ops in ops(),
        keyed in any::<bool>(),
    ) {
        prop_assert_eq!(paused().block_on(run(ops, keyed)), Ok(()));
    }
}
