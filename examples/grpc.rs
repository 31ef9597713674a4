//! A tonic gRPC server behind all three layers, called by a tonic client in the same process.
//!
//! ```text
//! cargo run --example grpc --features tonic
//! ```
//!
//! The service is the standard gRPC health service (`grpc.health.v1.Health`), so the example
//! needs no code generation: `Check` is rate-limited per client address and per method,
//! `Watch` is excluded. The client calls `Check` five times and prints what it sees: calls 1
//! to 3 are served, each answer carrying one `ratelimit` entry per layer that sends one (the
//! shaper's, then the rate limit's, `"5-per-1s";r=2` down to `r=0`); call 4 gets
//! `ResourceExhausted "rate limit exceeded"` with a retry pushback of at most 200 ms, after
//! which a call is served again; that call spent the returned token, so call 5 is turned away
//! the same way.

use std::time::Duration;

use tollgate::key::{GrpcMethod, PeerIp};
use tollgate::response::grpc;
use tollgate::{ConcurrencyLimitLayer, Quota, RateLimitLayer, ShapeLayer};
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health) = tonic_health::server::health_reporter();

    let layers = tower::ServiceBuilder::new()
        // 100 calls in flight at most: beyond, UNAVAILABLE.
        .layer(ConcurrencyLimitLayer::new(100))
        // 5 calls per second per client and method, bursts of 3: beyond, RESOURCE_EXHAUSTED.
        .layer(grpc::layer(
            RateLimitLayer::new(Quota::per_second(5).burst(3))
                .key((PeerIp::new(), GrpcMethod))
                .skip_path("/grpc.health.v1.Health/Watch"),
        ))
        // At most 100 calls per second per method reach the service, evenly spaced; 20 wait.
        .layer(grpc::layer(
            ShapeLayer::new(Quota::per_second(100))
                .key(GrpcMethod)
                .max_waiting(20),
        ));

    let server = Server::builder()
        .layer(layers)
        .add_service(health)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    tokio::spawn(server);
    println!("gRPC server on {addr}");

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for i in 1..=5 {
        let req = HealthCheckRequest {
            service: String::new(),
        };
        match client.check(req).await {
            Ok(resp) => {
                // One `ratelimit` entry per layer that sends one: the rate limit's and the
                // shaper's.
                let rl: Vec<&str> = resp
                    .metadata()
                    .get_all("ratelimit")
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                println!(
                    "call {i}: {:?}, ratelimit {}",
                    resp.get_ref().status(),
                    rl.join(", ")
                );
            }
            Err(status) => {
                let pushback = status.metadata().get("grpc-retry-pushback-ms");
                println!(
                    "call {i}: {:?} {:?}, retry pushback {pushback:?} ms",
                    status.code(),
                    status.message()
                );
                if let Some(ms) = pushback.and_then(|v| v.to_str().ok()?.parse().ok()) {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    let again = client.check(HealthCheckRequest::default()).await;
                    println!(
                        "after the pushback: {:?}",
                        again.map(|r| r.get_ref().status())
                    );
                }
            }
        }
    }
    Ok(())
}
