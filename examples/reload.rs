//! Limits read from a TOML file and changed while serving, on SIGHUP: a rate limit, a
//! concurrency limit and a shaping rate, each through its layer's handle.
//!
//! ```text
//! cp examples/reload.toml /tmp/limits.toml
//! LIMITS=/tmp/limits.toml cargo run --example reload --features serde
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/api; done
//! sed -i 's/count = 5,/count = 5, burst = 20,/' /tmp/limits.toml
//! kill -HUP "$(cat /tmp/reload.pid)"
//! for i in $(seq 20); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/api; done
//! ```
//!
//! Serves on `127.0.0.1:3000` (or `ADDR`) and writes its process id to `/tmp/reload.pid`. The
//! first loop prints `200` five times, then `429`: 5 per second, burst 5, per client IP. The
//! new file gives the same rate a burst of 20. Limits change without losing what each client
//! already spent: this client spent its 5 (one second's worth of the key's time), so right
//! after the first loop it has 15 left of the new 20, and the second loop prints `200`
//! fifteen times, then `429`. Time between and during the loops gives some back, at the rate
//! of 5 per second up to the new burst: pasted as one block, one or two more `200`s come
//! before the first `429`; typed by hand a few seconds later, all twenty are `200`. The server logs `reloaded /tmp/limits.toml`; a file that does
//! not parse or holds an invalid limit is logged and changes nothing.
//!
//! Every limit of the file works the same way: `[report]` is the concurrency limit of
//! `/report` (its maximum and queue), `[upload]` the shaping rate and bounds of `/upload`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use serde::Deserialize;
use tollgate::settings::{ConcurrencySettings, ShapeSettings};
use tollgate::{
    key, Clock, ConcurrencyHandle, Policy, RateLimitHandle, RateLimitLayer, ShapeHandle,
};

/// The file's contents.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub api: Policy,
    pub report: ConcurrencySettings,
    pub upload: ShapeSettings,
}

impl Limits {
    /// Parses the file; an error says which field is wrong and where.
    pub fn parse(text: &str) -> Result<Limits, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }
}

/// The handles of the running app's limits.
#[derive(Debug, Clone)]
pub struct Handles {
    api: RateLimitHandle,
    report: ConcurrencyHandle,
    upload: ShapeHandle,
}

impl Handles {
    /// Applies the limits of `text` to the running app. Nothing changes unless the whole
    /// file parses and every limit is valid.
    pub fn reload(&self, text: &str) -> Result<(), String> {
        let limits = Limits::parse(text)?;
        if limits.api.name() != "api" {
            return Err(format!(
                "api: the policy is named \"api\", not {:?}",
                limits.api.name()
            ));
        }
        // Check every part on a scratch layer first, so that a bad part changes nothing.
        let report = limits.report.layer().validate();
        report.map(drop).map_err(|e| format!("report: {e}"))?;
        let upload = limits.upload.layer().validate();
        upload.map(drop).map_err(|e| format!("upload: {e}"))?;
        let api = RateLimitLayer::new(limits.api.clone()).validate();
        api.map(drop).map_err(|e| format!("api: {e}"))?;
        self.api
            .apply(&limits.api)
            .map_err(|e| format!("api: {e}"))?;
        self.report
            .apply(&limits.report)
            .map_err(|e| format!("report: {e}"))?;
        self.upload
            .apply(&limits.upload)
            .map_err(|e| format!("upload: {e}"))?;
        Ok(())
    }
}

/// The app and the handles that change its limits. `clock` is a parameter so that the tests
/// can run it on a paused clock; a server passes `Clock::default()`.
pub fn app(limits: &Limits, clock: Clock) -> Result<(Router, Handles), tollgate::ConfigError> {
    let api = RateLimitLayer::new(limits.api.clone())
        .key(key::PeerIp)
        .clock(clock);
    let report = limits.report.layer();
    let upload = limits.upload.layer().key(key::PeerIp);
    let handles = Handles {
        api: api.handle()?,
        report: report.handle()?,
        upload: upload.handle()?,
    };
    let router = Router::new()
        .route("/api", get(|| async { "api\n" }).layer(api))
        .route("/report", get(report_handler).layer(report))
        .route("/upload", get(|| async { "uploaded\n" }).layer(upload));
    Ok((router, handles))
}

async fn report_handler() -> &'static str {
    tokio::time::sleep(Duration::from_millis(500)).await;
    "report\n"
}

#[cfg(unix)]
async fn reload_on_sighup(path: String, handles: Handles) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    while hangups.recv().await.is_some() {
        let result = match std::fs::read_to_string(&path) {
            Ok(text) => handles.reload(&text),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => println!("reloaded {path}"),
            Err(e) => eprintln!("kept the limits in force: {path}: {e}"),
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::var("LIMITS").unwrap_or_else(|_| "examples/reload.toml".to_owned());
    let limits = Limits::parse(&std::fs::read_to_string(&path)?)?;
    let (app, handles) = app(&limits, Clock::default())?;
    std::fs::write("/tmp/reload.pid", std::process::id().to_string())?;
    #[cfg(unix)]
    tokio::spawn(reload_on_sighup(path.clone(), handles));
    #[cfg(not(unix))]
    let _ = handles;
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {addr}, limits from {path}; SIGHUP reloads them");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
