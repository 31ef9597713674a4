//! Every example's documented commands, replayed against the example's own app, with what its
//! doc comment (and the README) says they print. The examples are compiled in as modules, so
//! the app under test is the one `cargo run --example` serves.
//!
//! Each scenario starts a fresh app, as a freshly started example would be. Requests carry the
//! peer address axum's `ConnectInfo` would give them; the quickstart also runs over loopback
//! through a real `axum::serve`, byte for byte as `curl -si` sees it.
//!
//! Pins docs/design.md sections 1 to 3, as each example's doc comment states them.

#![cfg(feature = "axum")]

use crate::common;

#[path = "../../examples/custom_key.rs"]
#[allow(dead_code)]
mod custom_key;
#[path = "../../examples/llm_gateway.rs"]
#[allow(dead_code)]
mod llm_gateway;
#[path = "../../examples/login.rs"]
#[allow(dead_code)]
mod login;
#[cfg(feature = "metrics")]
#[path = "../../examples/metrics.rs"]
#[allow(dead_code)]
mod metrics_example;
#[path = "../../examples/per_route.rs"]
#[allow(dead_code)]
mod per_route;
#[path = "../../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;
#[cfg(feature = "redis")]
#[path = "../../examples/redis.rs"]
#[allow(dead_code)]
mod redis_example;
#[cfg(feature = "serde")]
#[path = "../../examples/reload.rs"]
#[allow(dead_code)]
mod reload;
#[path = "../../examples/shaping.rs"]
#[allow(dead_code)]
mod shaping;
#[path = "../../examples/stacked.rs"]
#[allow(dead_code)]
mod stacked;
#[path = "../../examples/tiers.rs"]
#[allow(dead_code)]
mod tiers;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tollgate::Clock;
use tower::ServiceExt;

/// What `curl -i` shows of a response.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// `curl -X <method> localhost:3000<path> [-H name: value]...` from `127.0.0.1`.
fn curl(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    curl_from(method, path, headers, [127, 0, 0, 1])
}

/// The same request from another client address.
fn curl_from(method: Method, path: &str, headers: &[(&str, &str)], peer: [u8; 4]) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let mut req = req.body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((peer, 50_000))));
    req
}

fn get(path: &str) -> Request<Body> {
    curl(Method::GET, path, &[])
}

async fn send(app: &Router, req: Request<Body>) -> Answer {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// Sends `reqs` all at once (each in its own task) and gives each answer with the time it
/// came back, in the order of `reqs`.
async fn all_at_once(app: &Router, reqs: Vec<Request<Body>>) -> Vec<(Answer, Duration)> {
    let start = Instant::now();
    let tasks: Vec<_> = reqs
        .into_iter()
        .map(|req| {
            let app = app.clone();
            tokio::spawn(async move {
                let answer = send(&app, req).await;
                (answer, start.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

// ---------------------------------------------------------------------------------------------
// quickstart and the README's "Try it"

/// `curl -si URL | grep -iE '^(HTTP|retry-after|ratelimit)'` over a real connection.
async fn curl_si_grep(addr: SocketAddr) -> (Vec<String>, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let lines = head
        .split("\r\n")
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with("http") || l.starts_with("retry-after") || l.starts_with("ratelimit")
        })
        .map(str::to_owned)
        .collect();
    (lines, body.to_owned())
}

/// The README's output block of the curl loop: the lines before `...` and the lines after.
fn readme_curl_output() -> (Vec<String>, Vec<String>) {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("```text\nHTTP/1.1 200 OK")
        .expect("the README shows the curl loop's output")
        + "```text\n".len();
    let block = &readme[start..];
    let block = &block[..block.find("```").expect("the block ends")];
    let (first, last) = block
        .split_once("...\n")
        .expect("the block elides with ...");
    let lines = |s: &str| s.lines().map(str::to_owned).collect::<Vec<_>>();
    (lines(first), lines(last))
}

#[tokio::test]
async fn quickstart_curl_loop_prints_what_the_readme_shows() {
    let (clock, _time) = Clock::manual();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = quickstart::app(clock);
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    // for i in $(seq 7); do curl -si localhost:3000/ | grep -iE '^(HTTP|retry-after|ratelimit)'; done
    let mut output = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..7 {
        let (lines, body) = curl_si_grep(addr).await;
        output.push(lines);
        bodies.push(body);
    }
    server.abort();

    let status_lines: Vec<&str> = output.iter().map(|l| l[0].as_str()).collect();
    assert_eq!(
        status_lines,
        [
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 429 Too Many Requests",
            "HTTP/1.1 429 Too Many Requests",
        ]
    );
    for (i, body) in bodies[..5].iter().enumerate() {
        let n = 4 - i;
        assert_eq!(
            body,
            &format!("Hello! You may send {n} more request(s) right now.\n")
        );
    }
    assert_eq!(bodies[5], "Too Many Requests\n");

    let (first, last) = readme_curl_output();
    assert_eq!(output[0], first, "the README's first answer");
    assert_eq!(output[5], last, "the README's first 429");
    assert_eq!(output[6], last, "the seventh answer is the sixth again");
    assert_eq!(
        last,
        [
            "HTTP/1.1 429 Too Many Requests",
            "retry-after: 1",
            "ratelimit-policy: \"per-ip\";q=5;w=5",
            "ratelimit: \"per-ip\";r=0;t=5",
        ]
    );
}

#[tokio::test]
async fn quickstart_served_without_connect_info_answers_400() {
    let (clock, _time) = Clock::manual();
    let app = quickstart::app(clock);
    let req = Request::get("/").body(Body::empty()).unwrap();
    let answer = send(&app, req).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.body, "Bad Request: could not identify the client\n");
}

// ---------------------------------------------------------------------------------------------
// login

/// `curl -i -X POST localhost:3000/login -H 'x-user: <user>' -H 'x-password: <password>'`,
/// with more headers.
fn login_as(user: &str, password: &str, more: &[(&str, &str)]) -> Request<Body> {
    let mut headers = vec![("x-user", user), ("x-password", password)];
    headers.extend_from_slice(more);
    curl(Method::POST, "/login", &headers)
}

#[tokio::test]
async fn login_five_wrong_passwords_ban_the_username_for_15_minutes() {
    let (clock, time) = Clock::manual();
    let app = login::app(clock);

    // curl -i -X POST localhost:3000/login -H 'x-user: alice' -H 'x-password: wrong'
    for _ in 0..5 {
        let a = send(&app, login_as("alice", "wrong", &[])).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert_eq!(a.body, "wrong user or password\n");
    }
    let sixth = send(&app, login_as("alice", "wrong", &[])).await;
    assert_eq!(sixth.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sixth.header("retry-after"), Some("900"));

    // curl -i -X POST localhost:3000/login -H 'x-user: alice' -H 'x-password: open sesame'
    let right = send(&app, login_as("alice", "open sesame", &[])).await;
    assert_eq!(right.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(right.header("retry-after"), Some("900"));

    // curl -i -X POST localhost:3000/login -H 'x-user: bob' -H 'x-password: open sesame'
    let bob = send(&app, login_as("bob", "open sesame", &[])).await;
    assert_eq!(bob.status, StatusCode::OK);
    assert_eq!(bob.body, "welcome, bob\n");
    let policies: Vec<_> = bob.headers.get_all("ratelimit-policy").iter().collect();
    // Each layer adds its own item, the inner one first.
    assert_eq!(
        policies,
        ["\"login-user\";q=20;w=60", "\"login-ip\";q=10;w=60"]
    );

    // Fifteen minutes later alice may log in.
    time.advance(Duration::from_secs(900));
    let later = send(&app, login_as("alice", "open sesame", &[])).await;
    assert_eq!(later.status, StatusCode::OK);
}

#[tokio::test]
async fn login_eleven_attempts_from_one_address_then_a_ban_of_10_minutes() {
    let (clock, _time) = Clock::manual();
    let app = login::app(clock);
    for i in 0..10 {
        let a = send(&app, login_as(&format!("user{i}"), "open sesame", &[])).await;
        assert_eq!(a.status, StatusCode::OK, "attempt {i}");
    }
    let eleventh = send(&app, login_as("bob", "open sesame", &[])).await;
    assert_eq!(eleventh.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(eleventh.header("retry-after"), Some("6"));
    let twelfth = send(&app, login_as("bob", "open sesame", &[])).await;
    assert_eq!(twelfth.header("retry-after"), Some("6"));
    let third_rejection = send(&app, login_as("bob", "open sesame", &[])).await;
    assert_eq!(third_rejection.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third_rejection.header("retry-after"), Some("600"));
    assert_eq!(
        third_rejection.header("ratelimit"),
        Some("\"login-ip\";r=0;t=600")
    );
    // Another address is not affected.
    let other = send(
        &app,
        curl_from(
            Method::POST,
            "/login",
            &[("x-user", "bob"), ("x-password", "open sesame")],
            [192, 0, 2, 7],
        ),
    )
    .await;
    assert_eq!(other.status, StatusCode::OK);
}

#[tokio::test]
async fn login_behind_the_proxy_counts_the_forwarded_client_and_never_the_office() {
    let (clock, _time) = Clock::manual();
    let app = login::app(clock);

    // curl ... -H 'x-user: carol' -H 'x-password: wrong' -H 'x-forwarded-for: 198.51.100.7'
    let carol = [("x-forwarded-for", "198.51.100.7")];
    for i in 0..10 {
        let a = send(&app, login_as(&format!("c{i}"), "wrong", &carol)).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    }
    let a = send(&app, login_as("c10", "wrong", &carol)).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    // ... against 198.51.100.7, not against the proxy on loopback.
    let direct = send(&app, login_as("bob", "open sesame", &[])).await;
    assert_eq!(direct.status, StatusCode::OK);

    // curl ... -H 'x-user: dave' -H 'x-password: wrong' -H 'x-forwarded-for: 203.0.113.5'
    let office = [("x-forwarded-for", "203.0.113.5")];
    for _ in 0..50 {
        let a = send(&app, login_as("dave", "wrong", &office)).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert_eq!(a.header("ratelimit-policy"), None);
    }
    // A client that is not our proxy cannot claim an office address.
    let spoofed = |user: &str| {
        curl_from(
            Method::POST,
            "/login",
            &[
                ("x-user", user),
                ("x-password", "wrong"),
                ("x-forwarded-for", "203.0.113.5"),
            ],
            [198, 51, 100, 99],
        )
    };
    let mut statuses = Vec::new();
    for i in 0..11 {
        statuses.push(send(&app, spoofed(&format!("e{i}"))).await.status.as_u16());
    }
    assert_eq!(statuses[..10], [401; 10]);
    assert_eq!(statuses[10], 429);
}

// ---------------------------------------------------------------------------------------------
// per_route

#[tokio::test]
async fn per_route_login_is_5_per_minute_per_ip_without_an_api_key() {
    let (clock, _time) = Clock::manual();
    let app = per_route::app(clock);

    // curl -i -X POST localhost:3000/login
    for _ in 0..5 {
        let a = send(&app, curl(Method::POST, "/login", &[])).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body, "logged in\n");
        assert_eq!(a.header("ratelimit-policy"), Some("\"login\";q=5;w=60"));
    }
    let sixth = send(&app, curl(Method::POST, "/login", &[])).await;
    assert_eq!(sixth.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sixth.header("retry-after"), Some("12"));

    // Another client address has its own five.
    let other = send(&app, curl_from(Method::POST, "/login", &[], [192, 0, 2, 7])).await;
    assert_eq!(other.status, StatusCode::OK);
}

#[tokio::test]
async fn per_route_api_needs_a_key_and_counts_per_key() {
    let (clock, _time) = Clock::manual();
    let app = per_route::app(clock);

    // curl -i localhost:3000/api/items -H 'x-api-key: k1'
    let a = send(
        &app,
        curl(Method::GET, "/api/items", &[("x-api-key", "k1")]),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, "[]\n");
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"api\";q=200;w=2, \"api-daily\";q=100000;w=86400")
    );

    // curl -i localhost:3000/api/items
    let a = send(&app, get("/api/items")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.body, "Unauthorized: could not identify the client\n");
}

#[tokio::test]
async fn per_route_health_is_unlimited_and_unknown_paths_are_404() {
    let (clock, _time) = Clock::manual();
    let app = per_route::app(clock);

    // curl -i localhost:3000/health
    for _ in 0..300 {
        let a = send(&app, get("/health")).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body, "ok\n");
        assert_eq!(a.header("ratelimit-policy"), None);
    }

    // curl -i localhost:3000/nope
    for path in ["/nope", "/api/nope"] {
        let a = send(&app, get(path)).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(a.header("ratelimit-policy"), None, "{path}");
    }
}

// ---------------------------------------------------------------------------------------------
// tiers

#[tokio::test]
async fn tiers_vip_keys_get_100_others_10_no_key_401() {
    let (clock, _time) = Clock::manual();
    let app = tiers::app(clock);

    // curl -i localhost:3000/ -H 'x-api-key: vip_alice'
    let a = send(&app, curl(Method::GET, "/", &[("x-api-key", "vip_alice")])).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, "99 of 100 left\n");
    assert_eq!(a.header("ratelimit-policy"), Some("\"vip\";q=100;w=1"));

    // curl -i localhost:3000/ -H 'x-api-key: bob'
    let a = send(&app, curl(Method::GET, "/", &[("x-api-key", "bob")])).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, "9 of 10 left\n");
    assert_eq!(a.header("ratelimit-policy"), Some("\"free\";q=10;w=1"));

    // curl -i localhost:3000/
    let a = send(&app, get("/")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    let a = send(&app, curl(Method::GET, "/nope", &[("x-api-key", "bob")])).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------------------------
// metrics

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_twelve_calls_ten_admitted_and_the_shadow_policy_would_have_refused_seven() {
    use metrics_exporter_prometheus::PrometheusBuilder;

    let (clock, _time) = Clock::manual();
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let app = metrics::with_local_recorder(&recorder, || metrics_example::app(handle, clock));

    // for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' localhost:3000/api; done
    let mut codes = Vec::new();
    for _ in 0..12 {
        codes.push(send(&app, get("/api")).await.status.as_u16());
    }
    assert_eq!(
        codes,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429]
    );

    // curl -s localhost:3000/metrics | grep '^tollgate_decisions_total' | grep -v ' 0$'
    let scrape = send(&app, get("/metrics")).await.body;
    let mut lines: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total") && !l.ends_with(" 0"))
        .collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "tollgate_decisions_total{layer=\"rate_limit\",policy=\"api\",quota=\"\",outcome=\"allowed\",dry_run=\"false\"} 10",
            "tollgate_decisions_total{layer=\"rate_limit\",policy=\"api\",quota=\"api\",outcome=\"limited\",dry_run=\"false\"} 2",
            "tollgate_decisions_total{layer=\"rate_limit\",policy=\"api-strict\",quota=\"\",outcome=\"allowed\",dry_run=\"true\"} 5",
            "tollgate_decisions_total{layer=\"rate_limit\",policy=\"api-strict\",quota=\"api-strict\",outcome=\"limited\",dry_run=\"true\"} 7",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// custom_key

#[tokio::test]
async fn custom_key_counts_per_tenant_and_client_and_rejects_in_json() {
    let (clock, _time) = Clock::manual();
    let app = custom_key::app(clock);

    // for i in $(seq 5); do curl -s localhost:3000/acme/orders; done
    let mut bodies = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let a = send(&app, get("/acme/orders")).await;
        bodies.push(a.body.clone());
        last = Some(a);
    }
    assert_eq!(
        bodies,
        [
            "orders\n",
            "orders\n",
            "orders\n",
            "orders\n",
            "{\"error\":\"rate_limited\",\"message\":\"Too Many Requests\",\"retry_after\":1}\n"
        ]
    );
    let last = last.unwrap();
    assert_eq!(last.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(last.header("content-type"), Some("application/json"));
    assert_eq!(last.header("retry-after"), Some("1"));

    // curl -s localhost:3000/globex/orders
    assert_eq!(send(&app, get("/globex/orders")).await.body, "orders\n");

    // curl -s localhost:3000/acme/orders -H 'x-forwarded-for: 203.0.113.7'
    let req = curl(
        Method::GET,
        "/acme/orders",
        &[("x-forwarded-for", "203.0.113.7")],
    );
    assert_eq!(send(&app, req).await.body, "orders\n");

    // curl -i localhost:3000/
    let a = send(&app, get("/")).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.body, "");
}

#[tokio::test]
async fn custom_key_without_connect_info_says_missing_key_with_its_400() {
    let (clock, _time) = Clock::manual();
    let app = custom_key::app(clock);
    let req = Request::get("/acme/orders").body(Body::empty()).unwrap();
    let a = send(&app, req).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.body,
        "{\"error\":\"missing_key\",\"message\":\"Bad Request: could not identify the client\",\"retry_after\":null}\n"
    );
}

// ---------------------------------------------------------------------------------------------
// shaping

#[tokio::test(start_paused = true)]
async fn shaping_eight_at_once_one_now_four_spaced_three_refused() {
    let app = shaping::app();
    let answers = all_at_once(&app, (0..8).map(|_| get("/")).collect()).await;
    let mut served: Vec<Duration> = Vec::new();
    let mut refused = 0;
    for (a, at) in &answers {
        match a.status {
            StatusCode::OK => served.push(*at),
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert_eq!(*at, Duration::ZERO, "refused at once");
                assert!(a.header("retry-after").is_some());
                assert!(a.header("ratelimit-policy").is_some());
            }
            other => panic!("unexpected {other}"),
        }
    }
    served.sort();
    assert_eq!(
        served,
        [0, 500, 1000, 1500, 2000].map(Duration::from_millis)
    );
    assert_eq!(refused, 3);
}

#[tokio::test(start_paused = true)]
async fn shaping_per_ip_three_at_once_then_spaced() {
    let app = shaping::app();
    let answers = all_at_once(&app, (0..10).map(|_| get("/per-ip")).collect()).await;
    let mut served: Vec<Duration> = Vec::new();
    let mut refused = 0;
    for (a, at) in &answers {
        match a.status {
            StatusCode::OK => served.push(*at),
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert_eq!(*at, Duration::ZERO, "refused at once");
            }
            other => panic!("unexpected {other}"),
        }
    }
    served.sort();
    assert_eq!(
        served,
        [0, 0, 0, 200, 400, 600, 800, 1000, 1200].map(Duration::from_millis)
    );
    assert_eq!(refused, 1);

    // Another client has its own queue.
    let other = send(&app, curl_from(Method::GET, "/per-ip", &[], [192, 0, 2, 7])).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(send(&app, get("/nope")).await.status, StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------------------------
// stacked

#[tokio::test(start_paused = true)]
async fn stacked_eight_reports_two_built_two_waited_two_timed_out_two_refused() {
    let app = stacked::app(Clock::tokio());
    let answers = all_at_once(&app, (0..8).map(|_| get("/report")).collect()).await;
    let mut got: Vec<(u16, Duration)> = answers
        .iter()
        .map(|(a, at)| (a.status.as_u16(), *at))
        .collect();
    got.sort();
    let s = Duration::from_secs;
    assert_eq!(
        got,
        [
            (200, s(2)),
            (200, s(2)),
            (200, s(4)),
            (200, s(4)),
            (503, s(0)),
            (503, s(0)),
            (503, s(3)),
            (503, s(3)),
        ]
    );
    for (a, _) in &answers {
        if a.status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(a.header("retry-after"), Some("1"));
            assert!(a.body.starts_with("Service Unavailable"), "{}", a.body);
        } else {
            assert_eq!(a.body, "Here is your report.\n");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn stacked_three_per_route_then_429_other_route_unaffected() {
    let app = stacked::app(Clock::tokio());
    let mut reqs: Vec<_> = (0..5).map(|_| get("/api/users")).collect();
    reqs.push(get("/api/orders"));
    let answers = all_at_once(&app, reqs).await;
    let users: Vec<u16> = answers[..5]
        .iter()
        .map(|(a, _)| a.status.as_u16())
        .collect();
    assert_eq!(users.iter().filter(|s| **s == 200).count(), 3, "{users:?}");
    assert_eq!(users.iter().filter(|s| **s == 429).count(), 2, "{users:?}");
    assert_eq!(answers[5].0.status, StatusCode::OK);
    assert_eq!(answers[5].0.body, "[]\n");
}

#[tokio::test(start_paused = true)]
async fn stacked_twelve_in_a_row_ten_then_429() {
    let app = stacked::app(Clock::tokio());
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(send(&app, get("/")).await.status.as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429]
    );
    assert_eq!(send(&app, get("/nope")).await.status, StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------------------------
// redis

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_two_instances_share_five_per_minute_and_each_take_half_when_redis_is_gone() {
    let mut server = common::redis_server::RedisServer::start();
    let a = redis_example::instance(&server.url()).await.unwrap();
    let b = redis_example::instance(&server.url()).await.unwrap();

    let mut seen = Vec::new();
    for i in 0..7 {
        let app = if i % 2 == 0 { &a } else { &b };
        let ans = send(app, curl(Method::GET, "/", &[("x-api-key", "demo")])).await;
        let r = ans
            .header("ratelimit")
            .and_then(|v| v.split(';').nth(1))
            .unwrap_or("-")
            .to_owned();
        seen.push((ans.status.as_u16(), r, ans.body));
    }
    let expected: Vec<(u16, String, String)> = (0..7)
        .map(|i| {
            if i < 5 {
                let left = 4 - i;
                (
                    200,
                    format!("r={left}"),
                    format!("hello; {left} more right now\n"),
                )
            } else {
                (429, "r=0".to_owned(), "Too Many Requests\n".to_owned())
            }
        })
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(send(&a, get("/nope")).await.status, StatusCode::NOT_FOUND);

    // With Redis gone, each instance decides alone on half the limit (2 of 5), and the
    // handler says so.
    server.kill();
    for (app, name) in [(&a, "A"), (&b, "B")] {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let ans = send(app, curl(Method::GET, "/", &[("x-api-key", "other")])).await;
            seen.push((ans.status.as_u16(), ans.body));
        }
        assert_eq!(
            seen,
            [
                (
                    200,
                    "hello; 1 more right now, decided here: Redis did not answer\n".to_owned()
                ),
                (
                    200,
                    "hello; 0 more right now, decided here: Redis did not answer\n".to_owned()
                ),
                (429, "Too Many Requests\n".to_owned()),
            ],
            "instance {name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// polite_client

#[path = "../../examples/polite_client.rs"]
#[allow(dead_code)]
mod polite_client;

#[tokio::test(start_paused = true)]
async fn polite_client_calls_go_out_100_ms_apart_then_the_jobs() {
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = log.clone();
    let answers = polite_client::demo(move |at, what| {
        sink.lock().unwrap().push((at, what));
    })
    .await;
    assert_eq!(answers, 25);

    let log = log.lock().unwrap().clone();
    let times: Vec<u64> = log.iter().map(|(at, _)| at.as_millis() as u64).collect();
    let expected: Vec<u64> = (0..28).map(|i| i * 100).collect();
    assert_eq!(times, expected);
    assert!(log[..25]
        .iter()
        .all(|(_, what)| what.starts_with("GET /orders/")));
    let jobs: Vec<&str> = log[25..].iter().map(|(_, what)| what.as_str()).collect();
    assert_eq!(
        jobs,
        [
            "job 0 may call the partner",
            "job 1 may call the partner",
            "job 2 may call the partner"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// reload

/// The documented commands: six requests (5 × 200, then 429); the file gets a burst of 20 and
/// SIGHUP reloads it (here: the function the signal calls); sixteen more (15 × 200, then 429).
#[cfg(feature = "serde")]
#[tokio::test]
async fn reload_five_then_429_then_after_sighup_fifteen_more_of_a_burst_of_twenty() {
    let (clock, _time) = Clock::manual();
    let file = std::fs::read_to_string("examples/reload.toml").unwrap();
    let limits = reload::Limits::parse(&file).unwrap();
    let (app, handles) = reload::app(&limits, clock).unwrap();
    let codes = |n| {
        let app = app.clone();
        async move {
            let mut codes = Vec::new();
            for _ in 0..n {
                codes.push(send(&app, get("/api")).await.status.as_u16());
            }
            codes
        }
    };
    assert_eq!(codes(6).await, [200, 200, 200, 200, 200, 429]);

    // sed -i 's/count = 5,/count = 5, burst = 20,/' /tmp/limits.toml
    let edited = file.replace("count = 5,", "count = 5, burst = 20,");
    assert_ne!(edited, file);
    // A file that does not parse, or an invalid limit, changes nothing.
    let err = handles
        .reload(&edited.replace("max = 2", "max = 0"))
        .unwrap_err();
    assert!(err.starts_with("report:"), "{err}");
    let err = handles
        .reload(&edited.replace("\"1s\"", "\"1 sec\""))
        .unwrap_err();
    assert!(err.contains("per"), "{err}");
    assert_eq!(codes(1).await, [429]);

    handles.reload(&edited).unwrap();
    let mut want = vec![200; 15];
    want.push(429);
    assert_eq!(codes(16).await, want);
}

// ---------------------------------------------------------------------------------------------
// llm_gateway

/// `curl -si -X POST 'localhost:3000/v1/completions?max_tokens=N' -H 'x-api-key: KEY' -d PROMPT`
fn completion(key: &str, max_tokens: u32, prompt: &str) -> Request<Body> {
    let mut req = curl(
        Method::POST,
        &format!("/v1/completions?max_tokens={max_tokens}"),
        &[("x-api-key", key)],
    );
    *req.body_mut() = Body::from(prompt.to_owned());
    req
}

fn all(a: &Answer, name: &str) -> Vec<String> {
    a.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn llm_gateway_settles_the_real_token_count_and_a_key_in_debt_waits() {
    let (clock, _time) = Clock::manual();
    let app = llm_gateway::app(clock);
    let essay = "Write an essay about lighthouses";

    let first = send(&app, completion("demo", 6000, essay)).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("x-tokens-used"), Some("6005"));
    assert_eq!(first.body, "(6000 tokens of completion)\n");
    assert_eq!(
        all(&first, "ratelimit"),
        ["\"tokens\";r=3995;t=51884", "\"requests\";r=9;t=6"]
    );

    let second = send(&app, completion("demo", 3995, essay)).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.header("x-tokens-used"), Some("4000"));
    assert_eq!(
        all(&second, "ratelimit"),
        ["\"tokens\";r=0;t=86444", "\"requests\";r=8;t=12"]
    );

    let third = send(&app, completion("demo", 1, "hi")).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.header("retry-after"), Some("52"));
    assert_eq!(third.header("x-tokens-used"), None);
    // The request rate's fields report its admission; the budget's rejection gave the
    // request back, so a second try is admitted by the rate at the same place again.
    assert_eq!(all(&third, "ratelimit")[1], "\"requests\";r=7;t=18");
    let again = send(&app, completion("demo", 1, "hi")).await;
    assert_eq!(again.header("retry-after"), Some("52"));
    assert_eq!(all(&again, "ratelimit")[1], "\"requests\";r=7;t=18");

    let big = send(&app, completion("big", 20_000, "hi")).await;
    assert_eq!(big.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(big.header("retry-after"), None);

    let mut codes = Vec::new();
    for _ in 0..11 {
        let a = send(&app, completion("quick", 10, "hi")).await;
        codes.push(a.status.as_u16());
        if a.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(a.header("retry-after"), Some("6"));
        }
    }
    assert_eq!(
        codes,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429]
    );

    let anonymous = send(&app, curl(Method::POST, "/v1/completions", &[])).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}
