//! What a client sees and what an operator reads (docs/design.md section 2; section 3,
//! "Observability"): statuses, headers, gRPC statuses over a real tonic server, WebSocket
//! closes, dry-run, metrics and events.

#[path = "../common/mod.rs"]
mod common;

mod dry_run;
mod fired_quota;
mod grpc;
mod hostile_responses;
mod http;
mod meet_names;
mod meet_rejection;
mod metrics;
mod one_record;
mod rejection;
mod settled_fields;
mod websocket;
