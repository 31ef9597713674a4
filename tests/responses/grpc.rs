//! The layers on a real tonic server, called by a real tonic client over loopback: rejections
//! arrive as gRPC statuses with their message, pushback and RateLimit metadata.
//!
//! Pins docs/design.md section 2 (gRPC statuses and pushback).
#![cfg(feature = "tonic")]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use tokio::sync::Semaphore;
use tollgate::key::{self, GrpcMethod, Metadata};
use tollgate::response::grpc::{self, GrpcMode};
use tollgate::response::OnReject;
use tollgate::{Clock, ConcurrencyLimitLayer, Quota, RateLimitLayer, ShapeLayer};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};

/// Messages are raw bytes: no protobuf, no code generation.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// `test.Echo/Say` echoes its message; the message `hold` waits for a permit of `gate` first.
#[derive(Clone)]
struct Echo {
    gate: Arc<Semaphore>,
}

impl NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct Say(Arc<Semaphore>);

impl UnaryService<Bytes> for Say {
    type Response = Bytes;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, Status>>;
    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        let gate = self.0.clone();
        Box::pin(async move {
            let msg = req.into_inner();
            if &msg[..] == b"hold" {
                let _permit = gate.acquire().await;
            }
            Ok(tonic::Response::new(msg))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let gate = self.gate.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Raw);
            Ok(grpc.unary(Say(gate), req).await)
        })
    }
}

struct Running {
    addr: SocketAddr,
    gate: Arc<Semaphore>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

/// Serves `test.Echo` and the standard health service behind `layer` on a loopback port.
async fn serve<L, ResBody>(layer: L) -> Running
where
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    L: tower::Layer<tonic::service::Routes> + Clone + Send + 'static,
    L::Service: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let router = Server::builder()
        .layer(layer)
        .add_service(Echo { gate: gate.clone() })
        .add_service(health);
    tokio::spawn(router.serve_with_incoming_shutdown(
        tonic::transport::server::TcpIncoming::from(listener),
        async {
            let _ = rx.await;
        },
    ));
    Running {
        addr,
        gate,
        _shutdown: tx,
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn say(
    ch: &Channel,
    msg: &'static str,
    user: Option<&'static str>,
) -> Result<tonic::Response<Bytes>, Status> {
    let mut client = tonic::client::Grpc::new(ch.clone());
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(msg.as_bytes()));
    if let Some(u) = user {
        req.metadata_mut().insert("x-user", u.parse().unwrap());
    }
    let path = http::uri::PathAndQuery::from_static("/test.Echo/Say");
    client.unary(req, path, Raw).await
}

fn meta<'a>(status: &'a Status, name: &str) -> &'a str {
    status
        .metadata()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {status:?}"))
        .to_str()
        .unwrap()
}

async fn health_check(ch: &Channel) -> Result<(), Status> {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(drop)
}

#[tokio::test]
async fn rate_limited_call_is_resource_exhausted_with_pushback_and_ratelimit_metadata() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_second(1).burst(2))
        .key(GrpcMethod)
        .clock(clock);
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;

    let ok = say(&ch, "hi", None).await.unwrap();
    assert_eq!(&ok.get_ref()[..], b"hi");
    // Admitted calls carry the fields as initial metadata.
    let md = ok.metadata();
    assert_eq!(md.get("ratelimit").unwrap(), "\"1-per-1s\";r=1;t=1");
    assert_eq!(md.get("ratelimit-policy").unwrap(), "\"1-per-1s\";q=2;w=2");
    say(&ch, "hi", None).await.unwrap();

    let err = say(&ch, "hi", None).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), "rate limit exceeded");
    assert_eq!(meta(&err, "grpc-retry-pushback-ms"), "1000");
    assert_eq!(meta(&err, "retry-after"), "1");
    assert_eq!(meta(&err, "ratelimit"), "\"1-per-1s\";r=0;t=2");
    assert_eq!(meta(&err, "ratelimit-policy"), "\"1-per-1s\";q=2;w=2");
}

#[tokio::test]
async fn excluded_health_checks_are_never_limited_while_the_service_is() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_hour(1))
        .clock(clock)
        .skip_path("/grpc.health.v1.Health/Check");
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    say(&ch, "hi", None).await.unwrap();
    assert_eq!(
        say(&ch, "hi", None).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    for _ in 0..20 {
        health_check(&ch).await.unwrap();
    }
}

#[tokio::test]
async fn unexcluded_health_checks_share_the_limit() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_hour(1)).clock(clock);
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    health_check(&ch).await.unwrap();
    let err = health_check(&ch).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn cost_above_the_burst_asks_the_client_not_to_retry() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_second(1).burst(2))
        .clock(clock)
        .cost(|_| 3);
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    let err = say(&ch, "hi", None).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), "request exceeds the rate limit");
    assert_eq!(meta(&err, "grpc-retry-pushback-ms"), "-1");
}

#[tokio::test]
async fn missing_metadata_key_is_invalid_argument_without_pushback() {
    let layer = RateLimitLayer::new(Quota::per_second(1)).key(Metadata::new("x-user"));
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    let err = say(&ch, "hi", None).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "could not identify the client");
    assert!(err.metadata().get("grpc-retry-pushback-ms").is_none());
    say(&ch, "hi", Some("alice")).await.unwrap();
}

#[tokio::test]
async fn metadata_keys_limit_each_user_on_their_own() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_hour(1))
        .key(Metadata::new("x-user"))
        .clock(clock);
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    say(&ch, "hi", Some("alice")).await.unwrap();
    say(&ch, "hi", Some("bob")).await.unwrap();
    let err = say(&ch, "hi", Some("alice")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn peer_address_from_tonic_connect_info_keys_the_client() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_hour(1))
        .key(key::PeerIp::new())
        .clock(clock);
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    // Without tonic's TcpConnectInfo there would be no key: InvalidArgument.
    say(&ch, "hi", None).await.unwrap();
    let err = say(&ch, "hi", None).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn full_global_concurrency_limit_is_unavailable() {
    let layer = ConcurrencyLimitLayer::new(1).retry_after(Duration::from_millis(1500));
    // The concurrency layer's body already carries rejections: no adapter needed.
    let server = serve(layer).await;
    let ch = channel(server.addr).await;
    let held = tokio::spawn({
        let ch = ch.clone();
        async move { say(&ch, "hold", None).await }
    });
    // Wait until the held call is inside the service (bounded).
    let mut err = None;
    for _ in 0..1000 {
        match say(&ch, "hi", None).await {
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the second call was rejected");
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "too many concurrent requests");
    assert_eq!(meta(&err, "grpc-retry-pushback-ms"), "1500");
    server.gate.add_permits(1);
    assert_eq!(&held.await.unwrap().unwrap().get_ref()[..], b"hold");
    say(&ch, "hi", None).await.unwrap();
}

#[tokio::test]
async fn full_concurrency_limit_per_key_is_resource_exhausted() {
    let layer = ConcurrencyLimitLayer::new(1).key(Metadata::new("x-user"));
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    let held = tokio::spawn({
        let ch = ch.clone();
        async move { say(&ch, "hold", Some("alice")).await }
    });
    let mut err = None;
    for _ in 0..1000 {
        match say(&ch, "hi", Some("alice")).await {
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the second call was rejected");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(meta(&err, "grpc-retry-pushback-ms"), "1000");
    // Another user is not held up.
    say(&ch, "hi", Some("bob")).await.unwrap();
    server.gate.add_permits(1);
    held.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn full_shaping_queue_is_resource_exhausted() {
    let layer = ShapeLayer::new(Quota::per_hour(1)).max_waiting(0);
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    say(&ch, "hi", None).await.unwrap();
    let err = say(&ch, "hi", None).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), "too many requests waiting");
    // The clock is paused: the place frees up exactly one emission interval later.
    assert_eq!(meta(&err, "grpc-retry-pushback-ms"), "3600000");
    assert_eq!(meta(&err, "retry-after"), "3600");
}

#[tokio::test]
async fn never_mode_answers_grpc_calls_with_plain_http() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Quota::per_hour(1))
        .clock(clock)
        .on_reject(OnReject::grpc(GrpcMode::Never));
    let server = serve(grpc::layer(layer)).await;
    let ch = channel(server.addr).await;
    say(&ch, "hi", None).await.unwrap();
    // What tonic makes of an HTTP 429 with a text body: INTERNAL, no message, no pushback.
    let err = say(&ch, "hi", None).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.metadata().get("grpc-retry-pushback-ms").is_none());
}
