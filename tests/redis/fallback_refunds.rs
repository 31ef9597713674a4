//! Where a give-back goes when the store that admitted the request is not the one answering:
//! a reservation Redis made goes back to Redis only (given back during an outage, it frees
//! nothing in the local fallback's state), and a reservation the local fallback made goes
//! back to the fallback's state, at once, even once Redis is back (Redis's key is left
//! alone). Against a real `redis-server`, paused (SIGSTOP) for the outages.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis": fall back locally) and the
//! rule in `src/rate_limit/settle.rs` ("A request admitted while Redis is down ...").
#![cfg(feature = "redis")]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::watch;
use tollgate::redis::{FailMode, RedisStore};
use tollgate::Quota;
use tower::{Layer, Service, ServiceExt};

use crate::common::account::rig::manual;
use crate::common::redis_server::RedisServer;
use crate::common::stores::{layer, Boxed};

/// Answers with the status in `x-status` once the test has released `x-hold` requests;
/// counts the requests it was handed.
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
        let hold = number("x-hold").unwrap_or(0);
        let mut release = self.release.clone();
        self.entered.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let _ = release.wait_for(|released| *released >= hold).await;
            let mut resp = Response::new(Full::new(Bytes::new()));
            *resp.status_mut() = StatusCode::from_u16(status as u16).unwrap();
            Ok(resp)
        })
    }
}

struct Client {
    app: Boxed,
    entered: Arc<AtomicU32>,
    go: watch::Sender<u32>,
}

impl Client {
    /// Sends a request held until `hold` is released, answered `status` (200 is given back):
    /// its task when admitted, `None` when refused.
    async fn send(&self, hold: u32, status: u16) -> Option<tokio::task::JoinHandle<StatusCode>> {
        let before = self.entered.load(Ordering::SeqCst);
        let req = Request::post("/")
            .header("x-key", "k")
            .header("x-hold", hold.to_string())
            .header("x-status", status.to_string())
            .body(())
            .unwrap();
        let task = tokio::spawn({
            let app = self.app.clone();
            async move { app.oneshot(req).await.unwrap().status() }
        });
        loop {
            if self.entered.load(Ordering::SeqCst) > before {
                return Some(task);
            }
            if task.is_finished() {
                let status = task.await.unwrap();
                assert_ne!(status, StatusCode::OK);
                return None;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Releases the held requests up to `n`, and waits for the answer of `task`.
    async fn answer(&self, n: u32, task: tokio::task::JoinHandle<StatusCode>) -> StatusCode {
        let _ = self.go.send(n);
        task.await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_goes_to_the_store_that_admitted_the_request() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        // Long enough that no call to a live server times out on a loaded machine (one that
        // did before the outage was decided locally and spent the fallback's burst); every
        // call during an outage waits it.
        .timeout(Duration::from_secs(1))
        .on_failure(FailMode::local(0.5));
    let (clock, _time) = manual();
    // 8 a minute, burst 8: the local share is 4 a minute, burst 4.
    let l = layer(&[Quota::per_minute(8)], "home", &clock).store(store);
    let lim = l.limiter("home").unwrap().unwrap();
    let (go, release) = watch::channel(0u32);
    let entered = Arc::new(AtomicU32::new(0));
    let client = Client {
        app: Boxed::new(l.layer(Boxed::new(Held {
            entered: entered.clone(),
            release,
        }))),
        entered,
        go,
    };
    let key: Box<[u8]> = b"k"[..].into();
    // Redis admits four: two of them will be given back during the outage.
    let a1 = client.send(1, 200).await.unwrap();
    let a2 = client.send(2, 200).await.unwrap();
    let mut kept = vec![
        client.send(100, 401).await.unwrap(),
        client.send(100, 401).await.unwrap(),
    ];
    assert_eq!(lim.check_n(&key, 0).await.remaining(), 4);

    server.pause();
    // The fallback admits its burst of 4, then refuses; one of its four is given back later.
    let l1 = client.send(3, 200).await.unwrap();
    for _ in 0..3 {
        kept.push(client.send(100, 401).await.unwrap());
    }
    assert!(client.send(100, 401).await.is_none());
    // Redis's reservations given back while it does not answer: nothing of the fallback's
    // state frees.
    assert_eq!(client.answer(1, a1).await, StatusCode::OK);
    assert_eq!(client.answer(2, a2).await, StatusCode::OK);
    assert!(client.send(100, 401).await.is_none());
    let d = lim.check_n(&key, 0).await;
    assert!(d.is_local());
    assert_eq!(d.remaining(), 0);

    server.resume();
    // Redis decides again, from its state (the calls that timed out were on the connection:
    // Redis ran them once resumed, as `fallback.rs` pins).
    let d = lim.check_n(&key, 0).await;
    assert!(!d.is_degraded(), "{d:?}");
    let left = d.remaining();
    // The fallback's reservation goes back to the fallback, not to Redis.
    assert_eq!(client.answer(3, l1).await, StatusCode::OK);
    let d = lim.check_n(&key, 0).await;
    assert!(!d.is_degraded(), "{d:?}");
    assert_eq!(d.remaining(), left);

    server.pause();
    // The fallback's state has one place: exactly one more is admitted locally.
    kept.push(client.send(100, 401).await.unwrap());
    assert!(client.send(100, 401).await.is_none());
    server.resume();
    let _ = client.go.send(100);
    for t in kept {
        assert_eq!(t.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
}
