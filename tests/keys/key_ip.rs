#![cfg(feature = "axum")]
//! `PeerIp` and `ClientIp` through the public API, and behind a real axum server whose peer
//! address comes from `ConnectInfo`.
//!
//! Pins docs/design.md section 2 (a request without a key) and section 5 (client IPs).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::key::{ClientIp, KeyExtractor, KeyExtractorExt, PeerIp, RequestHead};
use tollgate::ConfigError;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn request(peer: &str, xff: &str) -> http::Request<()> {
    let mut req = http::Request::builder()
        .header("x-forwarded-for", xff)
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip(peer), 5000)));
    req
}

#[test]
fn client_ip_from_configuration() {
    let proxies = vec!["10.0.0.0/8".to_owned(), "2001:db8:ffff::/48".to_owned()];
    let client_ip = ClientIp::new().try_trust_proxies(&proxies).unwrap();
    let req = request("2001:db8:ffff::1", "203.0.113.7, 10.1.1.1");
    assert_eq!(
        client_ip.extract(&RequestHead::new(&req)).unwrap(),
        ip("203.0.113.7").into()
    );

    let err = ClientIp::new()
        .try_trust_proxies(["10.0.0.0/8", "10.0.0.0/64"])
        .unwrap_err();
    assert_eq!(err, ConfigError::InvalidProxy("10.0.0.0/64".into()));
    assert_eq!(
        err.to_string(),
        "trusted proxy \"10.0.0.0/64\" is not an IP address or CIDR range"
    );
}

#[test]
fn extractors_compose() {
    let shared = Arc::new(ClientIp::new().trust_private().ipv6_prefix(128));
    let req = request("192.168.1.1", "2001:db8::7");
    assert_eq!(
        shared.extract(&RequestHead::new(&req)).unwrap(),
        ip("2001:db8::7").into()
    );
    let text = PeerIp::new().map(|ip| ip.to_string());
    assert_eq!(
        text.extract(&RequestHead::new(&req)).unwrap(),
        "192.168.1.1"
    );

    // Without a peer address there is no key; `or` can fall back to another extractor.
    let no_peer = http::Request::new(());
    assert!(ClientIp::new()
        .extract(&RequestHead::new(&no_peer))
        .is_err());
    let fallback = ClientIp::new().or(tollgate::key::from_fn(|_: &RequestHead<'_>| {
        Some(tollgate::key::IpKey::from(IpAddr::from([0, 0, 0, 0])))
    }));
    assert_eq!(
        fallback.extract(&RequestHead::new(&no_peer)).unwrap(),
        tollgate::key::Either::Second(ip("0.0.0.0").into())
    );
}

/// Sends one HTTP/1.1 request with `headers` and returns the response body.
async fn get_body(addr: SocketAddr, headers: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n".to_vec();
    req.extend_from_slice(headers);
    req.extend_from_slice(b"\r\n");
    stream.write_all(&req).await.unwrap();
    let mut resp = String::new();
    stream.read_to_string(&mut resp).await.unwrap();
    resp.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn behind_a_real_server_with_connect_info() {
    let trusting = Arc::new(ClientIp::new().trust_loopback());
    let distrusting = Arc::new(ClientIp::new().trust_proxy("10.0.0.0/8"));
    let app = Router::new().route(
        "/",
        get(move |req: Request| async move {
            let head = RequestHead::new(&req);
            let a = trusting.extract(&head).unwrap();
            let b = distrusting.extract(&head).unwrap();
            let c = PeerIp::new().extract(&head).unwrap();
            format!("{a} {b} {c}")
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });

    let body = get_body(addr, b"X-Forwarded-For: 6.6.6.6, 203.0.113.7\r\n").await;
    assert_eq!(body, "203.0.113.7 127.0.0.1 127.0.0.1");
    let body = get_body(addr, b"Forwarded: for=\"[2001:db8::1]:4711\"\r\n").await;
    assert_eq!(body, "2001:db8:: 127.0.0.1 127.0.0.1");
    let body = get_body(addr, b"X-Forwarded-For: \xff, nonsense\r\n").await;
    assert_eq!(body, "127.0.0.1 127.0.0.1 127.0.0.1");
    server.abort();
}
