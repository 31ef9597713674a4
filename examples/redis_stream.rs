//! A Redis Stream consumer that processes messages at a fixed rate and loses none when it
//! stops half-way.
//!
//! ```text
//! redis-server --port 6379 &            # or any Redis; REDIS_URL=redis://host:port
//! cargo run --example redis_stream --features stream
//! ```
//!
//! The consumer reads with `XREADGROUP` in a consumer group and acknowledges each message with
//! `XACK` only after processing it. Messages read but not acknowledged stay in the group's
//! pending list; on restart the consumer reads its own pending messages first (`XREADGROUP …
//! 0`), then new ones (`>`). So a consumer that stops (a crash, a deploy) mid-way loses
//! nothing: what it had read and not finished comes back. Processing is at-least-once: a
//! message processed but not yet acknowledged when the consumer stops is processed again.
//!
//! It prints each job as it is processed, five per second: the first run stops at job 6
//! without acknowledging it, the second starts with the jobs the first had read (6 to 9) and
//! goes on to 14, and the last line, `pending now: 0`, says nothing is left unacknowledged.
//!
//! The rate: a [`RateLimiter`] over the message stream ([`LimitStreamExt::rate_limit`]); reads
//! are `COUNT 10`, so no more than ten messages are held while they wait for their turn.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, RedisResult};
use tollgate::stream::LimitStreamExt;
use tollgate::{Quota, RateLimiter};

/// What the handler says after a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Processed: acknowledge it and go on.
    Ack,
    /// Stop now, without acknowledging this message (as a crash would).
    Stop,
}

/// Where a consumer reads: its group, its name, and how long a read waits for new messages
/// (`None`: stop when there are none).
#[derive(Debug, Clone)]
pub struct Consumer {
    pub stream: String,
    pub group: String,
    pub name: String,
    pub block: Option<Duration>,
}

/// Reads the consumer's pending messages first, then new ones, ten at a time.
struct Reader {
    con: MultiplexedConnection,
    c: Consumer,
    backlog: bool,
    buf: VecDeque<StreamId>,
}

impl Reader {
    async fn next(&mut self) -> RedisResult<Option<StreamId>> {
        loop {
            if let Some(e) = self.buf.pop_front() {
                return Ok(Some(e));
            }
            let id = if self.backlog { "0" } else { ">" };
            let mut opts = StreamReadOptions::default()
                .group(&self.c.group, &self.c.name)
                .count(10);
            if let Some(b) = self.c.block {
                opts = opts.block(b.as_millis().try_into().unwrap_or(usize::MAX));
            }
            let reply: Option<StreamReadReply> = self
                .con
                .xread_options(&[&self.c.stream], &[id], &opts)
                .await?;
            let entries: Vec<StreamId> = reply
                .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
                .unwrap_or_default();
            if entries.is_empty() {
                if self.backlog {
                    // The pending list is done: on to new messages.
                    self.backlog = false;
                    continue;
                }
                if self.c.block.is_none() {
                    return Ok(None);
                }
                continue;
            }
            self.buf.extend(entries);
        }
    }
}

/// Creates the group (from the start of the stream) unless it exists.
pub async fn create_group(
    con: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> RedisResult<()> {
    let created: RedisResult<()> = con.xgroup_create_mkstream(stream, group, "0").await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// Runs `consumer` until the stream has nothing new (or `handle` says stop), passing messages
/// to `handle` no faster than `limiter` allows and acknowledging each one it accepts.
/// Returns the number acknowledged.
pub async fn consume<F>(
    con: MultiplexedConnection,
    consumer: Consumer,
    limiter: RateLimiter<()>,
    mut handle: F,
) -> RedisResult<usize>
where
    F: FnMut(&StreamId) -> Step,
{
    let mut acker = con.clone();
    let (stream, group) = (consumer.stream.clone(), consumer.group.clone());
    let reader = Reader {
        con,
        c: consumer,
        backlog: true,
        buf: VecDeque::new(),
    };
    let messages = futures_util::stream::unfold(reader, |mut r| async move {
        match r.next().await {
            Ok(Some(e)) => Some((Ok(e), r)),
            Ok(None) => None,
            Err(e) => Some((Err(e), r)),
        }
    });
    let mut paced = Box::pin(messages.rate_limit(limiter, |_| ()));
    let mut acked = 0;
    while let Some(msg) = paced.next().await {
        let msg = msg?;
        match handle(&msg) {
            Step::Ack => {
                let _: usize = acker.xack(&stream, &group, &[&msg.id]).await?;
                acked += 1;
            }
            Step::Stop => break,
        }
    }
    Ok(acked)
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> RedisResult<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let stream = "tollgate:example:jobs";
    let _: () = con.del(stream).await?;
    create_group(&mut con, stream, "workers").await?;
    for i in 0..15 {
        let _: String = con.xadd(stream, "*", &[("job", i)]).await?;
    }
    let consumer = Consumer {
        stream: stream.into(),
        group: "workers".into(),
        name: "worker-1".into(),
        block: None,
    };
    // 5 messages per second, one at a time.
    let limiter = || RateLimiter::<()>::new(Quota::per_second(5).burst(1));

    println!("first run: stops at job 6, before acknowledging it");
    let done = consume(con.clone(), consumer.clone(), limiter(), |m| {
        let job: String = m.get("job").unwrap_or_default();
        if job == "6" {
            return Step::Stop;
        }
        println!("  processed job {job} ({})", m.id);
        Step::Ack
    })
    .await?;
    println!("acknowledged {done}; restarting");
    let done = consume(con.clone(), consumer, limiter(), |m| {
        let job: String = m.get("job").unwrap_or_default();
        println!("  processed job {job} ({})", m.id);
        Step::Ack
    })
    .await?;
    println!("acknowledged {done}");
    println!(
        "pending now: {}",
        pending(&mut con, stream, "workers").await?
    );
    Ok(())
}

/// How many messages of `stream` the consumers of `group` have read and not acknowledged
/// (the first number of `XPENDING`'s summary).
pub async fn pending(
    con: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> RedisResult<u64> {
    let (count, _first, _last, _consumers): (u64, Option<String>, Option<String>, redis::Value) =
        redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .query_async(con)
            .await?;
    Ok(count)
}
