//! Traffic shaping: requests wait in a first-in-first-out queue and leave at a fixed rate.
//!
//! Where [`RateLimitLayer`](crate::RateLimitLayer) answers 429 as soon as a client goes too
//! fast, shaping *delays* requests so that the service behind sees a smooth stream at the
//! quota's rate, and only refuses when the queue is full. It is a leaky bucket used as a queue
//! (nginx `limit_req` without `nodelay`).
//!
//! * [`ShapeLayer`]: for HTTP servers. Per key (the crate's [key extractors](crate::key)), a
//!   bounded queue; when full, `429 Too Many Requests` with `Retry-After`.
//! * [`PoliteLayer`]: for outbound calls through any Tower service, any request type. Calls
//!   wait their turn and are never refused, so the caller never exceeds a partner's limit.
//! * [`Shaper`]: the same queues without Tower, for queue consumers and jobs:
//!   `shaper.until_slot(&key).await`.
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tollgate::{Quota, ShapeLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // Forward 10 requests per second to the handler; up to 3 wait, the rest get 429.
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(ShapeLayer::new(Quota::per_second(10)).max_waiting(3));
//!
//! let start = tokio::time::Instant::now();
//! let calls: Vec<_> = (0..5)
//!     .map(|_| {
//!         let app = app.clone();
//!         tokio::spawn(async move {
//!             let req = Request::get("/").body(Body::empty()).unwrap();
//!             let resp = app.oneshot(req).await.unwrap();
//!             (resp.status(), start.elapsed())
//!         })
//!     })
//!     .collect();
//! let mut results = Vec::new();
//! for call in calls {
//!     results.push(call.await.unwrap());
//! }
//! let ms = |status, ms| (status, Duration::from_millis(ms));
//! assert_eq!(results, [
//!     ms(StatusCode::OK, 0),    // leaves at once
//!     ms(StatusCode::OK, 100),  // then one every 100 ms
//!     ms(StatusCode::OK, 200),
//!     ms(StatusCode::OK, 300),
//!     ms(StatusCode::TOO_MANY_REQUESTS, 0), // a fourth would wait: refused at once
//! ]);
//! # }
//! ```
//!
//! # Behaviour
//!
//! * **Rate.** The [`Quota`](crate::Quota) gives the rate: one request per emission interval
//!   `T = period / count`. Its burst is not used; shaping exists to space requests out.
//! * **Schedule.** Each key has a "next free slot" time, like GCRA's theoretical arrival time.
//!   A request arriving at `now` gets slot `max(now, next)` and `next` moves on by `T`; it
//!   waits until its slot, then is forwarded. No background task: each waiter sleeps on
//!   tokio's timer (only the head of each queue has a timer armed).
//! * **Order.** First in, first out, per key: the order in which `call` was invoked.
//! * **No-delay burst** (default 0). With [`ShapeLayer::no_delay_burst`]`(n)`, an idle key's
//!   first `n + 1` requests go at once and the rest are spaced out, like nginx `delay=n`.
//! * **Bounds.** [`ShapeLayer::max_waiting`] (requests waiting) and [`ShapeLayer::max_wait`]
//!   (the longest wait a request may be given). Default: one period's worth, i.e. an idle key
//!   may send `count` requests at once. A request that would break a bound is refused with
//!   `429`, `Retry-After` (seconds until a place frees up, rounded up, at least 1) and the
//!   `RateLimit` fields, through the crate's shared rejection response
//!   ([`RejectionKind::QueueFull`](crate::response::RejectionKind::QueueFull), replaceable
//!   with [`ShapeLayer::on_reject`]).
//! * **Per key.** Each key has its own queue and its own rate. A key with nobody waiting and
//!   its next slot in the past is exactly like an absent one; such entries are dropped as the
//!   table grows, and the number of tracked keys is bounded ([`ShapeLayer::max_keys`]).
//!
//! ## Mapping from nginx
//!
//! | nginx `limit_req` (`rate=r`) | tollgate |
//! |---|---|
//! | `burst=B` | `ShapeLayer::new(r).max_waiting(B)` |
//! | `burst=B delay=D` | `ShapeLayer::new(r).no_delay_burst(D).max_waiting(B - D)` |
//! | `burst=B nodelay` | not shaping: [`RateLimitLayer`](crate::RateLimitLayer) with burst `B + 1` |
//!
//! # Guarantees
//!
//! Per key, with `n` the no-delay burst:
//!
//! * **Exact rate.** While requests are waiting, one leaves per `T`. Slots are ideal times
//!   (`start + k·T`), not "when the last one woke up + `T`", so a coarse timer (tokio's ticks
//!   are 1 ms) releases the requests whose slots have passed together and the average does not
//!   drift: at 5 000/s, about five leave per tick.
//! * **Never above the rate.** In any interval of length `w`, at most
//!   `n + 1 + (w + C) / T` requests leave, where `C = 20 ms` is how late a departure may be
//!   and still be caught up (tokio's timer ticks are 1 ms, and a loaded machine delays tasks by
//!   a few more). A queue that fell further behind (a stalled runtime) forfeits the older slots
//!   instead of releasing them as a burst. Against a partner that counts strictly over short
//!   windows, shape a little below its limit.
//! * **Cancellation.** A waiter whose future is dropped (the client went away, a timeout)
//!   leaves the queue at once and consumes nothing. Everyone behind it moves up one slot; if
//!   it was at the head, the next waiter takes over its departure time. So a dropped waiter
//!   never leaves a hole: as long as live requests are waiting, one leaves per `T`. A request
//!   counts once it has left the queue, i.e. when its future has been polled at its slot (the
//!   HTTP and polite layers call the inner service in that same poll).
//!
//! # Headers
//!
//! Like every layer of the crate, the responses carry the IETF fields (see
//! [`headers`](crate::headers)): `RateLimit-Policy: "NAME";q=C;w=W`, where `q` is how many
//! requests an idle client may send at once without being refused (one leaves, the others
//! wait) and `w` the seconds it takes to forward them, so `q/w` is the rate (when that is not a
//! whole number of seconds, `q/w` states the rate alone, as for a rate limit: see
//! [`headers`](crate::headers)); and
//! `RateLimit: "NAME";r=R;t=S`, with `R` the requests that would still be accepted now and `S`
//! the seconds until the key's queue is empty and idle. The fields are appended, so that those
//! of other layers on the same response are kept. `NAME` is the layer's name, else the
//! quota's, else `shape-` and the rate (e.g. `"shape-10-per-1s"`).
//!
//! # Time
//!
//! Shapers read tokio's clock ([`Clock::tokio`](crate::Clock::tokio)) and wait with
//! `tokio::time::sleep_until`, so they need a tokio runtime with the timer enabled, and tests
//! under `#[tokio::test(start_paused = true)]` run in no real time.

mod future;
pub(crate) mod handle;
pub(crate) mod layer;
pub(crate) mod polite;
mod queue;
mod service;
pub(crate) mod shaper;

pub use future::{PoliteFuture, ResponseFuture};
pub use polite::{CallKey, Polite};
pub use service::Shape;
pub use shaper::{QueueFull, ShaperBuilder, Slot};

// Public at the crate root; here for the crate's own paths and this module's docs.
#[allow(unused_imports)]
pub(crate) use crate::{PoliteLayer, ShapeHandle, ShapeLayer, Shaper};
