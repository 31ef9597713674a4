//! A login route protected against credential stuffing: a limit per client IP and one per
//! username, each with a penalty box, and an office network that no limit applies to.
//!
//! ```text
//! cargo run --example login
//! curl -i -X POST localhost:3000/login -H 'x-user: alice' -H 'x-password: wrong'
//! curl -i -X POST localhost:3000/login -H 'x-user: alice' -H 'x-password: open sesame'
//! curl -i -X POST localhost:3000/login -H 'x-user: bob' -H 'x-password: open sesame'
//! curl -i -X POST localhost:3000/login -H 'x-user: carol' -H 'x-password: wrong' -H 'x-forwarded-for: 198.51.100.7'
//! curl -i -X POST localhost:3000/login -H 'x-user: dave' -H 'x-password: wrong' -H 'x-forwarded-for: 203.0.113.5'
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`. The password of every user is
//! `open sesame`.
//!
//! * **Per username**, failures only: five wrong passwords for one username within 15 minutes
//!   ban that username for 15 minutes (then 30, 60, … up to a day): the first command, sent
//!   five times, answers `401 Unauthorized` five times; the sixth, and the right password
//!   (the second command) during the ban, get `429 Too Many Requests` with
//!   `retry-after: 900`. The handler records each failure with `Penalties::strike`; the
//!   layer's own limit of 20 attempts a minute per username counts as strikes too.
//! * **Per client IP**: 10 attempts a minute (`ratelimit-policy: "login-ip";q=10;w=60`); the
//!   eleventh in a minute gets `429` with `retry-after: 6`, and three such rejections within
//!   10 minutes ban the address for 10 minutes (`retry-after: 600`), whatever usernames it
//!   tries. Another username from the same address (the third command) is answered
//!   `200 welcome, bob` as long as the address is not banned.
//! * **Behind a proxy**: the client address is `key::ClientIp` behind a trusted proxy on
//!   loopback, so `x-forwarded-for` (as your proxy would set it) names the client (the fourth
//!   command counts against 198.51.100.7, not against the proxy). A header sent by a client that
//!   is not a trusted proxy is ignored.
//! * **The office**, `203.0.113.0/24` (the fifth command): never limited, counted or banned,
//!   by either layer, and no `RateLimit` fields. The allow list matches the address `ClientIp`
//!   resolves, so a client outside cannot claim an office address.
//!
//! Banning usernames lets anyone lock an account out for a while by failing its password on
//! purpose; the per-IP ban keeps that to a few tries per address. Pick the penalty box's
//! numbers with that in mind (or ban per username *and* address: `(ClientIp, Header)`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use tollgate::key::{ClientIp, Header, KeyExtractorExt};
use tollgate::penalty::Penalties;
use tollgate::penalty::PenaltyBox;
use tollgate::{Clock, MissingKey, Policy, Quota, RateLimitLayer};

const MINUTE: Duration = Duration::from_secs(60);

/// The app. `clock` is a parameter so that the tests can run it on a manual clock; a server
/// passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    // The client address: our proxy runs on this host, so loopback peers are trusted to say
    // who their client is; anyone else is the client themselves.
    let client = ClientIp::new().trust_loopback();

    let per_ip = RateLimitLayer::new(Policy::new("login-ip", Quota::per_minute(10)))
        .key(client.clone())
        .allow_ip("203.0.113.0/24") // the office
        .penalty_box(PenaltyBox::new(3, 10 * MINUTE, 10 * MINUTE))
        .clock(clock.clone());

    let per_user = RateLimitLayer::new(Policy::new("login-user", Quota::per_minute(20)))
        // Keyed by username; the office is recognised as `ClientIp` sees the client.
        .key(Header::new("x-user").with_client_ip(client.clone()))
        .on_missing_key(MissingKey::reject(401))
        .allow_ip("203.0.113.0/24")
        .penalty_box(PenaltyBox::new(5, 15 * MINUTE, 15 * MINUTE))
        .clock(clock);
    // The handler strikes a username for each wrong password.
    let penalties = per_user
        .penalties()
        .expect("the settings above are valid")
        .expect("a memory store keeps the penalty box in the layer");

    let login = move |headers: HeaderMap| login(headers, penalties.clone());
    Router::new().route(
        "/login",
        // The per-IP limit sees each request first.
        post(login).route_layer((per_ip, per_user)),
    )
}

async fn login(headers: HeaderMap, penalties: Penalties<Box<[u8]>>) -> (StatusCode, String) {
    let user = headers
        .get("x-user")
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let password = headers.get("x-password").map(|v| v.as_bytes());
    if password == Some(b"open sesame".as_slice()) {
        let name = String::from_utf8_lossy(user);
        return (StatusCode::OK, format!("welcome, {name}\n"));
    }
    penalties.strike(&tollgate::key::bounded_bytes(user));
    (StatusCode::UNAUTHORIZED, "wrong user or password\n".into())
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  POST /login  x-user, x-password ('open sesame')");
    println!("  10/min per client IP, ban after 3 rejections; 5 failures per user ban it");
    println!("  203.0.113.0/24 (the office) is never limited");
    println!("try: curl -i -X POST http://{local}/login -H 'x-user: alice' -H 'x-password: wrong'");
    // ClientIp starts from the peer address: serve with ConnectInfo.
    axum::serve(
        listener,
        app(Clock::default()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
