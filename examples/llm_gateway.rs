//! An LLM gateway that charges tokens per API key: a daily token budget, settled with the real
//! token count of each completion, behind a per-minute request rate.
//!
//! ```text
//! cargo run --example llm_gateway
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`. `POST /v1/completions` takes the
//! prompt as its body, `max_tokens` in the query (256 when absent), and the API key in
//! `x-api-key` (`401` without one). The stand-in model always writes `max_tokens` tokens and
//! reads one token per word of the prompt, so a completion uses `max_tokens` + the prompt's
//! words; it answers with `x-tokens-used`.
//!
//! Two limits per API key, stacked:
//!
//! * **requests** (outer): 10 per minute, burst 10; decided first, so a flood is turned away
//!   before it reserves any tokens;
//! * **tokens** (inner): 10 000 per day. Each request reserves its `max_tokens` before the
//!   model runs (a key that has spent its day is rejected then, and the model is not called);
//!   the handler reports the tokens it really used (`ActualCost`), and the layer settles the
//!   difference before the response leaves: given back when smaller, charged when larger,
//!   even past the budget. A key in debt waits until the debt is paid off (8.64 s per token),
//!   and `Retry-After` says how long.
//!
//! What the printed `curl` lines show:
//!
//! * `max_tokens=6000`, a prompt of 5 words: `200`, `x-tokens-used: 6005`, and
//!   `ratelimit: "tokens";r=3995;t=51884` (the settled state: 6 005 tokens are 51 884 s of
//!   the day) then `ratelimit: "requests";r=9;t=6`;
//! * `max_tokens=3995`, 5 words: fits the reservation, uses 4 000: the key is 5 tokens into
//!   debt (`r=0`, `t=86444`);
//! * `max_tokens=1` next: `429` with `retry-after: 52` (5 tokens of debt and the 1 asked
//!   for, at 8.64 s each); the model was not called, and the request rate gave back the
//!   request it had admitted (its fields, `r=7`, report that admission);
//! * `max_tokens=20000` (past the whole budget) on a fresh key: `429` without `Retry-After`,
//!   since waiting never helps;
//! * eleven quick requests on another key: ten `200`s, then `429` from the request rate
//!   (`retry-after: 6`).
//!
//! The figures are those of commands sent in quick succession: each second between them
//! takes a second off `t` and `retry-after`.

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{routing::post, Router};
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{key, Clock, MissingKey, Policy, Quota, RateLimitLayer};

/// `max_tokens` from the query, 256 when absent or not a number.
fn max_tokens(uri: &Uri) -> u32 {
    uri.query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("max_tokens="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The stand-in model: `max_tokens` tokens of output, one token per word of the prompt.
async fn complete(uri: Uri, prompt: String) -> Response {
    let output = max_tokens(&uri);
    let used = output.saturating_add(prompt.split_whitespace().count() as u32);
    let mut response = (
        StatusCode::OK,
        [("x-tokens-used", used.to_string())],
        format!("({output} tokens of completion)\n"),
    )
        .into_response();
    // What the token budget settles: the real count, known once the model is done.
    response.extensions_mut().insert(ActualCost(used));
    response
}

/// The app. `clock` is the limits' clock, a parameter so that the tests can run it on a
/// manual clock; a server passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    let requests = RateLimitLayer::new(Policy::new("requests", Quota::per_minute(10)))
        .key(key::Header::new("x-api-key"))
        .on_missing_key(MissingKey::reject(401))
        .clock(clock.clone());
    let tokens = RateLimitLayer::new(Policy::new("tokens", Quota::per_day(10_000)))
        .key(key::Header::new("x-api-key"))
        .on_missing_key(MissingKey::reject(401))
        .cost(|req| max_tokens(req.uri))
        .settle(ActualCost::of)
        .clock(clock);
    Router::new().route(
        "/v1/completions",
        // The first layer of the tuple sees the request first.
        post(complete).layer((requests, tokens)),
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    let url = format!("http://{local}/v1/completions");
    let grep = "grep -iE '^(HTTP|x-tokens|retry-after|ratelimit:)'";
    println!("tollgate LLM gateway example listening on http://{local}");
    println!();
    println!("6 000 tokens asked, 6 005 used; the fields report the settled state:");
    println!("  curl -si -X POST '{url}?max_tokens=6000' -H 'x-api-key: demo' -d 'Write an essay about lighthouses' | {grep}");
    println!();
    println!("The rest of the day asked for, 5 more used: the key is 5 tokens in debt:");
    println!("  curl -si -X POST '{url}?max_tokens=3995' -H 'x-api-key: demo' -d 'Write an essay about lighthouses' | {grep}");
    println!();
    println!("The next request waits until the debt is paid off (Retry-After: 52):");
    println!("  curl -si -X POST '{url}?max_tokens=1' -H 'x-api-key: demo' -d 'hi' | {grep}");
    println!();
    println!("More than the whole budget: 429 without Retry-After:");
    println!("  curl -si -X POST '{url}?max_tokens=20000' -H 'x-api-key: big' -d 'hi' | {grep}");
    println!();
    println!("Eleven quick requests: the request rate answers 429 past its burst of 10:");
    println!("  for i in $(seq 11); do curl -s -o /dev/null -w '%{{http_code}}\\n' -X POST '{url}?max_tokens=10' -H 'x-api-key: quick' -d 'hi'; done");
    axum::serve(listener, app(Clock::default())).await
}
