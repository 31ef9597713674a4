//! The WebSocket example over loopback with a tokio-tungstenite client: messages limited per
//! connection and per user, abusive connections closed with 1008. The limiters run on a
//! manual clock, so only the test moves time.
//!
//! Pins docs/design.md section 2.
#![cfg(feature = "axum")]

#[allow(dead_code)]
#[path = "../../examples/websocket.rs"]
mod example;

use std::net::SocketAddr;
use std::time::Duration;

use example::{app, Limits, MAX_STRIKES, POLICY_VIOLATION, STRIKE_WINDOW};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tollgate::{Clock, ManualClock, Quota};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn serve(limits: Limits) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app(limits)).await });
    addr
}

/// Per connection 3 per second, per user 5 per second, bursts as large, on a manual clock.
fn limits() -> (Limits, ManualClock) {
    let (clock, time) = Clock::manual();
    let mut limits = Limits::new(clock.clone());
    limits.per_connection = Quota::per_second(3);
    limits.per_user = tollgate::RateLimiter::<String>::builder(Quota::per_second(5))
        .clock(clock)
        .build();
    (limits, time)
}

async fn connect(addr: SocketAddr, user: &str) -> Ws {
    let mut req = format!("ws://{addr}/ws").into_client_request().unwrap();
    req.headers_mut().insert("x-user", user.parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// Sends `text` and returns the server's answer.
async fn send(ws: &mut Ws, text: &str) -> Message {
    ws.send(Message::text(text)).await.unwrap();
    ws.next().await.unwrap().unwrap()
}

fn is_echo(m: &Message, text: &str) -> bool {
    matches!(m, Message::Text(t) if t.as_str() == text)
}

fn is_notice(m: &Message) -> bool {
    matches!(m, Message::Text(t) if t.as_str().starts_with("rate limited; retry in"))
}

#[tokio::test]
async fn a_flooding_connection_is_closed_with_1008_after_the_tolerance() {
    let (limits, _time) = limits();
    let addr = serve(limits).await;
    let mut ws = connect(addr, "alice").await;
    for i in 0..3 {
        assert!(is_echo(
            &send(&mut ws, &format!("m{i}")).await,
            &format!("m{i}")
        ));
    }
    // The 4th is refused with a notice; refusals up to the tolerance keep the connection.
    let m = send(&mut ws, "m3").await;
    assert_eq!(m, Message::text("rate limited; retry in 334 ms"));
    for _ in 1..MAX_STRIKES - 1 {
        assert!(is_notice(&send(&mut ws, "more").await));
    }
    // The MAX_STRIKES-th refusal within the window closes it: policy violation.
    match send(&mut ws, "more").await {
        Message::Close(Some(frame)) => {
            assert_eq!(frame.code, CloseCode::from(POLICY_VIOLATION));
            assert_eq!(frame.code, CloseCode::Policy);
            assert_eq!(frame.reason.as_str(), "rate limit exceeded");
        }
        other => panic!("expected a close frame, got {other:?}"),
    }
    // Nothing more comes from the server.
    let rest = ws.next().await;
    assert!(matches!(rest, None | Some(Err(_))), "{rest:?}");
}

#[tokio::test]
async fn a_client_at_twice_its_rate_is_closed_though_every_other_message_passes() {
    let (limits, time) = limits();
    let addr = serve(limits).await;
    let mut ws = connect(addr, "alice").await;
    for _ in 0..3 {
        assert!(is_echo(&send(&mut ws, "x").await, "x"));
    }
    // One refused, one interval later one accepted, and again: accepted messages in between
    // do not wipe the refusals, and the MAX_STRIKES-th within the window closes.
    for strike in 1..MAX_STRIKES {
        assert!(is_notice(&send(&mut ws, "x").await), "strike {strike}");
        time.advance(Duration::from_millis(334));
        assert!(is_echo(&send(&mut ws, "y").await, "y"), "strike {strike}");
    }
    match send(&mut ws, "x").await {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Policy),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

#[tokio::test]
async fn a_client_refused_less_often_than_the_tolerance_stays_connected() {
    let (limits, time) = limits();
    let addr = serve(limits).await;
    let mut ws = connect(addr, "alice").await;
    // Refused once every STRIKE_WINDOW / (MAX_STRIKES - 1) and a little more: never
    // MAX_STRIKES refusals within one window, however long it goes on.
    let gap = STRIKE_WINDOW / (MAX_STRIKES - 1) + Duration::from_millis(1);
    for round in 0..10 {
        for _ in 0..3 {
            assert!(is_echo(&send(&mut ws, "x").await, "x"), "round {round}");
        }
        assert!(is_notice(&send(&mut ws, "x").await), "round {round}");
        time.advance(gap);
    }
    assert!(is_echo(&send(&mut ws, "still here").await, "still here"));
}

#[tokio::test]
async fn the_user_limit_is_shared_by_all_their_connections() {
    let (limits, time) = limits();
    let addr = serve(limits).await;
    let mut a = connect(addr, "alice").await;
    let mut b = connect(addr, "alice").await;
    let mut bob = connect(addr, "bob").await;
    // Alice's 5 per user: 3 on one connection, 2 on the other.
    for _ in 0..3 {
        assert!(is_echo(&send(&mut a, "a").await, "a"));
    }
    for _ in 0..2 {
        assert!(is_echo(&send(&mut b, "b").await, "b"));
    }
    // b has room on its connection (1 of 3 left) but alice has none.
    assert_eq!(
        send(&mut b, "b").await,
        Message::text("rate limited; retry in 200 ms")
    );
    // Bob is not affected.
    for _ in 0..3 {
        assert!(is_echo(&send(&mut bob, "bob").await, "bob"));
    }
    // 200 ms later alice has one more, but the message the user limit refused counted
    // against b's connection, which is full until 334 ms.
    time.advance(Duration::from_millis(200));
    assert_eq!(
        send(&mut b, "b").await,
        Message::text("rate limited; retry in 134 ms")
    );
    time.advance(Duration::from_millis(134));
    assert!(is_echo(&send(&mut b, "b").await, "b"));
}

#[tokio::test]
async fn refusals_by_the_connection_limit_do_not_use_up_the_user_budget() {
    let (limits, _time) = limits();
    let addr = serve(limits).await;
    let mut a = connect(addr, "alice").await;
    for _ in 0..3 {
        assert!(is_echo(&send(&mut a, "a").await, "a"));
    }
    for _ in 0..MAX_STRIKES - 1 {
        assert!(is_notice(&send(&mut a, "a").await));
    }
    // Alice still has 2 of her 5 for another connection.
    let mut b = connect(addr, "alice").await;
    for _ in 0..2 {
        assert!(is_echo(&send(&mut b, "b").await, "b"));
    }
    assert!(is_notice(&send(&mut b, "b").await));
}

#[tokio::test]
async fn an_upgrade_without_a_user_is_refused() {
    let (limits, _time) = limits();
    let addr = serve(limits).await;
    let req = format!("ws://{addr}/ws").into_client_request().unwrap();
    let err = tokio_tungstenite::connect_async(req).await.unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => assert_eq!(resp.status(), 401),
        other => panic!("expected 401, got {other:?}"),
    }
}
