//! WebSocket messages limited per connection and per user, with abusive connections closed.
//!
//! ```text
//! cargo run --example websocket
//! # then, e.g. with websocat: websocat -H 'x-user: alice' ws://127.0.0.1:3000/ws
//! ```
//!
//! The HTTP layers limit requests, and a WebSocket is one request: its messages are limited
//! inside the handler with [`RateLimiter`]s:
//!
//! * **per connection**: 5 messages per second, bursts of 5 (a limiter per connection);
//! * **per user**, across all their connections: 10 messages per second, bursts of 10 (one
//!   limiter keyed by user, shared by every connection). A message is checked against its
//!   connection first, then its user: a message the connection already refuses does not use
//!   up the user's budget (one the user refuses still counts against its connection).
//!
//! A refused message is dropped and the client is told, in a text message
//! `rate limited; retry in N ms`. **Tolerance**: the [`MAX_STRIKES`]-th refused message within
//! any [`STRIKE_WINDOW`] (10 s) makes the server close the connection with close code **1008**
//! (policy violation), reason `rate limit exceeded`. The refusals are counted by a third
//! limiter, a sliding log of `MAX_STRIKES - 1` per window: accepted messages in between do
//! not wipe the slate, so a client that keeps sending at twice its rate (one message in, one
//! refused, ...) is closed as surely as a flood, within three refusals. A client that waits
//! when told is refused at most once per wait and stays connected.
//!
//! The user comes from the `x-user` header here (an authenticated session in a real
//! application); an upgrade without it is refused with 401.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tollgate::{Clock, Quota, RateLimiter};

/// Refused messages within [`STRIKE_WINDOW`] at which a connection is closed.
pub const MAX_STRIKES: u32 = 3;

/// The window in which refusals are counted.
pub const STRIKE_WINDOW: Duration = Duration::from_secs(10);

/// WebSocket close code 1008: policy violation (RFC 6455, section 7.4.1).
pub const POLICY_VIOLATION: u16 = 1008;

/// The limits of every connection.
#[derive(Clone)]
pub struct Limits {
    /// The quota of each connection.
    pub per_connection: Quota,
    /// Shared by all the connections of a user.
    pub per_user: RateLimiter<String>,
    /// The clock of the connection limiters (the user limiter has its own).
    pub clock: Clock,
}

impl Limits {
    /// 5 messages per second per connection, 10 per user, on `clock`.
    pub fn new(clock: Clock) -> Self {
        Limits {
            per_connection: Quota::per_second(5),
            per_user: RateLimiter::<String>::builder(Quota::per_second(10))
                .clock(clock.clone())
                .build(),
            clock,
        }
    }
}

/// The application: `/ws` echoes every accepted message.
pub fn app(limits: Limits) -> Router {
    Router::new().route("/ws", get(upgrade)).with_state(limits)
}

async fn upgrade(
    ws: WebSocketUpgrade,
    headers: HeaderMap,
    State(limits): State<Limits>,
) -> Response {
    let Some(user) = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
    else {
        return (StatusCode::UNAUTHORIZED, "x-user required\n").into_response();
    };
    ws.on_upgrade(move |socket| session(socket, user, limits))
}

/// Why a message was refused: how long until it could pass.
fn verdict(conn: &RateLimiter<()>, user: &str, limits: &Limits) -> Result<(), Duration> {
    let d = conn.check(&());
    if !d.is_allowed() {
        return Err(d.retry_after().unwrap_or_default());
    }
    let d = limits.per_user.check(&user.to_owned());
    if !d.is_allowed() {
        return Err(d.retry_after().unwrap_or_default());
    }
    Ok(())
}

async fn session(mut socket: WebSocket, user: String, limits: Limits) {
    let conn = RateLimiter::<()>::builder(limits.per_connection.clone())
        .clock(limits.clock.clone())
        .build();
    // Refusals tolerated: MAX_STRIKES - 1 in any STRIKE_WINDOW; the next one closes.
    let strikes = RateLimiter::<()>::builder(Quota::sliding_log(MAX_STRIKES - 1, STRIKE_WINDOW))
        .clock(limits.clock.clone())
        .build();
    while let Some(Ok(msg)) = socket.recv().await {
        match msg {
            Message::Text(_) | Message::Binary(_) => {}
            Message::Close(_) => return,
            // Pings are answered by axum; pongs need nothing.
            Message::Ping(_) | Message::Pong(_) => continue,
        }
        match verdict(&conn, &user, &limits) {
            Ok(()) => {
                // The application's work: here, an echo.
                if socket.send(msg).await.is_err() {
                    return;
                }
            }
            Err(wait) => {
                if !strikes.check(&()).is_allowed() {
                    let frame = CloseFrame {
                        code: POLICY_VIOLATION,
                        reason: "rate limit exceeded".into(),
                    };
                    let _ = socket.send(Message::Close(Some(frame))).await;
                    return;
                }
                // Rounded up: a client that waits that long is not refused again.
                let ms = wait.as_nanos().div_ceil(1_000_000);
                let notice = format!("rate limited; retry in {ms} ms");
                if socket.send(Message::Text(notice.into())).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "ws://{}/ws (send the header x-user)",
        listener.local_addr()?
    );
    axum::serve(listener, app(Limits::new(Clock::system()))).await
}
