//! Concurrency limits for HTTP services: at most `max` requests in flight at once.
//!
//! [`ConcurrencyLimitLayer`] gives each request a permit before the inner service sees it, and
//! the request keeps it **until its response body is finished or dropped**, not only until the
//! headers are ready: a slow download or a long stream counts for as long as it runs.
//! ([`release_on_headers`](ConcurrencyLimitLayer::release_on_headers) gives tower's behaviour.)
//!
//! * **Global** (`ConcurrencyLimitLayer::new(max)`): one limit across everything the layer value
//!   wraps. Over it, clients get `503 Service Unavailable`: the server is busy, not the client
//!   at fault.
//! * **Per key** ([`key`](ConcurrencyLimitLayer::key)): at most `max` per key, e.g. per client
//!   address or API key. Over it, clients get `429 Too Many Requests`. A key that cannot be
//!   extracted is handled by [`MissingKey`](crate::MissingKey), as for rate limits.
//! * **Rejections** carry `Retry-After` (1 s unless [`retry_after`] says otherwise) and are
//!   built by the shared [`OnReject`](crate::response::OnReject) hook when one is set, with
//!   [`RejectionKind::Concurrency`](crate::response::RejectionKind::Concurrency) or
//!   [`QueueFull`](crate::response::RejectionKind::QueueFull).
//! * **Waiting** ([`queue`](ConcurrencyLimitLayer::queue)): instead of rejecting at once, let a
//!   bounded number of requests wait, first in first out, for a bounded time.
//!
//! [`retry_after`]: ConcurrencyLimitLayer::retry_after
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tollgate::{key, ConcurrencyLimitLayer};
//!
//! async fn report() -> &'static str { "a heavy report" }
//! async fn items() -> &'static str { "[]" }
//!
//! let app: Router = Router::new()
//!     // At most 8 reports are built at once; 32 more may wait up to 2 s for their turn.
//!     .route("/report", get(report).layer(
//!         ConcurrencyLimitLayer::new(8).queue(32, Duration::from_secs(2)),
//!     ))
//!     .route("/api/items", get(items))
//!     // And no API key has more than 4 requests in flight, on any route.
//!     .layer(ConcurrencyLimitLayer::new(4).key(key::Header::new("x-api-key")));
//! ```
//!
//! What a client sees, driven by hand through `tower`:
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tollgate::ConcurrencyLimitLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limit = ConcurrencyLimitLayer::new(1);
//! let svc = ServiceBuilder::new().layer(limit.clone()).service(service_fn(|_: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("hello"))))
//! }));
//!
//! let first = svc.clone().oneshot(Request::new(())).await.unwrap();
//! assert_eq!(limit.in_flight(), 1); // the body has not been sent yet
//!
//! let second = svc.clone().oneshot(Request::new(())).await.unwrap();
//! assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(second.headers()["retry-after"], "1");
//!
//! drop(first); // sent (or the client went away): the place is free again
//! assert_eq!(limit.in_flight(), 0);
//! # }
//! ```
//!
//! # Waiting
//!
//! With [`queue(max_waiting, max_wait)`](ConcurrencyLimitLayer::queue), a request over the
//! limit waits for a permit in a first-in-first-out queue (tokio's fair semaphore):
//!
//! * at most `max_waiting` requests wait at once (per key for a keyed limit); the bound is
//!   exact, however many requests race for the last place. A request that finds the queue
//!   full is rejected at once as `QueueFull`.
//! * a request that waited `max_wait` without getting a permit is rejected as `Concurrency`,
//!   the same as a request over the limit without a queue: it was the limit that turned it
//!   away, not the queue.
//! * the order is the order in which requests start waiting: the first poll of their response
//!   future, which servers do right after `call`.
//!
//! **Cancellation safety.** Everything a request holds is released when it is dropped. A
//! waiting request whose response future is dropped (the client disconnected, a timeout layer
//! fired) leaves the queue at once, and a permit handed to it in that instant goes to the next
//! waiter. A permit held by a response is given back when its body ends, fails or is dropped,
//! whichever comes first. No permit can leak.
//!
//! # Slow clients and upgrades
//!
//! "Until the body is finished" is when the server has *taken* the last frame, which is not
//! when the client has received it:
//!
//! * **A body of one frame** (`Full`, a `String`, a 64 MiB `Vec<u8>`) gives its permit back
//!   as soon as the server takes that frame, before writing it: a client that stops reading
//!   holds no place; the server's write buffer holds the bytes.
//! * **A streamed body** holds its permit until the server takes its last frame, or drops the
//!   body when the connection closes. A server does not poll the body of a client that stopped
//!   reading, and `axum::serve` has no write timeout, so such a client keeps its place for as
//!   long as it keeps the connection open: a few of them can hold a global limit full
//!   indefinitely. [`max_hold`](ConcurrencyLimitLayer::max_hold) bounds this: after that long
//!   the permit is given back (by a timer task on tokio's clock) **and the body keeps
//!   streaming**, no longer counted.
//! * **An HTTP upgrade** (a WebSocket's `101 Switching Protocols`) answers with an empty body:
//!   its permit is given back with the `101`, and upgraded connections are never counted.
//!   Bound them inside the upgraded handler (e.g. a `tokio::sync::Semaphore` permit moved into
//!   the WebSocket task).
//!
//! # Keys
//!
//! A keyed limit keeps one semaphore per key, created with the key's first request and dropped
//! as soon as the key has nothing in flight and nobody waiting, so memory is bounded by the
//! requests in flight and waiting, however many distinct keys clients invent.
//! [`tracked_keys`](ConcurrencyLimitLayer::tracked_keys) reports how many there are. Keys are
//! hashed with a per-process random seed. For a global limit *and* one per key, stack two
//! layers.
//!
//! # Adaptive limits
//!
//! A fixed limit is a guess: too high, and a slow dependency drags every request into its
//! queue; too low, and capacity goes unused. With
//! [`adaptive`](ConcurrencyLimitLayer::adaptive) the limit moves at run time from the latency
//! of completed requests, measured from taking the permit to the **end of the response body**:
//!
//! * [`Gradient2`] (recommended) compares the latency of each round trip with a long-term
//!   average and the measured no-load latency, as Netflix's `Gradient2Limit`, and measures
//!   the no-load latency again from time to time at a low limit, as Envoy's adaptive
//!   concurrency filter. It finds by itself what "slow" is.
//! * [`Vegas`] estimates how many requests queue in the service from the latency and the
//!   no-load latency (Little's law) and keeps that queue small (3 to 6 requests below a limit
//!   of 100), as Netflix's `VegasLimit` after TCP Vegas: a lower latency than [`Gradient2`]'s
//!   at the same goodput, but it comes down from a limit far too high more slowly.
//! * [`Aimd`] grows the limit by one per round trip and multiplies it by 0.9 on a failure or a
//!   latency over a threshold you set.
//! * Or an algorithm of your own: [`LimitAlgorithm`] is fed one [`Sample`] per request.
//!
//! The limit stays between the algorithm's bounds and never goes above the layer's `max`.
//! Raising it wakes waiters at once; lowering it never cuts a request short: returned permits
//! are forgotten until the semaphore holds the new limit. With a [key](ConcurrencyLimitLayer::key),
//! one limit is learnt from all the requests and applies to each key (the latency is the
//! service's, which the keys share). [`limit`](ConcurrencyLimitLayer::limit) and
//! [`latency`](ConcurrencyLimitLayer::latency) tell where it stands.
//!
//! Against a simulated backend that serves 20 requests at once in 10 ms, driven at ten times
//! its capacity, [`Gradient2`] settles between 20 and 40 within 3 s from a start at 500 and
//! follows a change of capacity within 2 s; [`Vegas`] settles between 20 and 30 within 1.5 s,
//! follows a rise of capacity within 0.5 s and a fall from 80 to 10 within 4 s
//! (`tests/concurrency/adaptive.rs`, on a paused clock); BENCHMARKS.md has the same over HTTP in
//! real time.
//!
//! ```
//! use tollgate::concurrency::Gradient2;
//! use tollgate::ConcurrencyLimitLayer;
//!
//! // Between 4 and 200 in flight, starting at 20, as latency allows.
//! let limit = ConcurrencyLimitLayer::new(200).adaptive(Gradient2::new(20, 4, 200));
//! assert_eq!(limit.limit(), 20);
//! ```
//!
//! # Priorities and load shedding
//!
//! [`priority`](ConcurrencyLimitLayer::priority) classifies each request as
//! [`Priority::Critical`], [`Normal`](Priority::Normal) or [`Sheddable`](Priority::Sheddable).
//! A request is admitted only while the requests in flight, itself included, are within its
//! class's [share](Priority::share) of the current limit `L`: `⌊L/2⌋` for sheddable,
//! `L − ⌈L/10⌉` for normal, `L` for critical. So under pressure sheddable requests go first,
//! then normal ones, and `⌈L/10⌉` places are left to critical requests however many others
//! arrive. [`shares`](ConcurrencyLimitLayer::shares) sets other fractions ([`Shares`]).
//! [`sheds`](ConcurrencyLimitLayer::sheds) counts the requests turned away for their class.
//!
//! With an adaptive limit the shares follow the limit: while [`Gradient2`] or [`Vegas`]
//! measure the no-load latency at their minimum limit (a few round trips every 30 s), the
//! places kept for critical requests are those of the minimum (`⌈0.1 × 4⌉ = 1` with the
//! defaults). Give the algorithm a minimum at which the critical share is what critical
//! traffic needs.
//!
//! ```
//! use tollgate::concurrency::{Gradient2, Priority};
//! use tollgate::ConcurrencyLimitLayer;
//!
//! let limit = ConcurrencyLimitLayer::new(200)
//!     .adaptive(Gradient2::default())
//!     .priority(|req| match req.uri.path() {
//!         "/login" | "/checkout" => Priority::Critical,
//!         p if p.starts_with("/recommendations") => Priority::Sheddable,
//!         _ => Priority::Normal,
//!     });
//! # let _ = limit;
//! ```
//!
//! # Stacking with a rate limit
//!
//! The response body type, [`ResponseBody`], converts from `Bytes`, so this layer and
//! [`RateLimitLayer`](crate::RateLimitLayer) stack in either order, in a `Router` or a
//! `tower::ServiceBuilder`. Usually the rate limit goes **outside** (applied last with
//! `Router::layer`, first in a `ServiceBuilder`): a request the rate limit rejects then never
//! takes, nor waits for, a place that an admitted request could use.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{key, ConcurrencyLimitLayer, Quota, RateLimitLayer};
//! use tower::ServiceBuilder;
//!
//! let stack = ServiceBuilder::new()
//!     // Outside: 10 requests/s per API key; rejected requests stop here.
//!     .layer(RateLimitLayer::new(Quota::per_second(10)).key(key::Header::new("x-api-key")))
//!     // Inside: at most 64 in flight, 128 more may wait up to 1 s.
//!     .layer(ConcurrencyLimitLayer::new(64).queue(128, Duration::from_secs(1)));
//! # let _ = stack;
//! ```
//!
//! A concurrency limit sends no header field of its own unless it is given a name: with
//! [`.name(name)`](ConcurrencyLimitLayer::name), every response of the layer
//! (rejections too) carries a `RateLimit-Policy` item `"name";q=max;qu="concurrent-requests"`
//! (draft-ietf-httpapi-ratelimit-headers-10), appended to those of other layers. It has no
//! `RateLimit` item: what is left depends on the requests in flight, not on the client.
//!
//! ```
//! use tollgate::ConcurrencyLimitLayer;
//! // Responses say `RateLimit-Policy: "reports";q=8;qu="concurrent-requests"`.
//! let reports = ConcurrencyLimitLayer::new(8).name("reports");
//! # let _ = reports;
//! ```

mod adaptive;
mod body;
mod control;
mod future;
pub(crate) mod handle;
pub(crate) mod layer;
mod permit;
mod service;

pub use adaptive::{Aimd, Gradient2, LimitAlgorithm, Sample, Vegas};
pub use body::ResponseBody;
pub use control::{Priority, Shares};
pub use future::ResponseFuture;
pub use layer::DEFAULT_RETRY_AFTER;

// Public at the crate root; named here by this module's docs.
#[allow(unused_imports)]
pub(crate) use crate::{ConcurrencyHandle, ConcurrencyLimitLayer};
pub use service::ConcurrencyLimit;
