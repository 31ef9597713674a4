//! Lengthening the expiry of a limit's keys in Redis after a live change under which their
//! requests count longer.
//!
//! # Implementation details
//! A key's time to live in Redis is set by the script that last wrote it: until its state is
//! idle under the quotas of that write. A live change can make the state count longer: a
//! sliding log or counter widened, or a warm-up curve changed (the key's stored deficit is
//! regained at the new curve's pace). A key that a request or a report touches after the
//! change has its expiry lengthened by the script; one left untouched would expire while its
//! requests still count, and its next request would start afresh, where the memory store
//! keeps it.
//!
//! So a change that can lengthen some key's life starts, in the background of the
//! decisions, a walk over the limit's keys (`SCAN MATCH <the limit's prefix>*`) that sends
//! each key a report (`script::lengthening_args`) lengthening its expiry to when it is idle
//! under the quotas in force, never shortening it. The same report sent twice (a key that
//! `SCAN` returns twice, several instances applying the same change) sets the same expiry.
//!
//! * **Bounded.** At most [`MAX_KEYS`] keys and [`MAX_TIME`] per walk; a walk that reaches
//!   either bound, or whose call fails, stops and logs a warning (the keys not reached keep
//!   the expiry they had). A walk that finishes logs what it did.
//! * **Cancelled** when a later change starts its own walk (which covers every key under the
//!   quotas then in force), and when the limiter is dropped.
//! * **Never in a decision's way.** Each call is a `SCAN` of [`BATCH`] keys or one key's
//!   report, [`AT_ONCE`] reports at a time on the store's connection, between the decisions;
//!   a failed call is no outage, and is neither counted nor logged as a decision's.
//! * **Not on Redis Cluster**, where a `SCAN` reaches one node: the change is logged as not
//!   reaching idle keys, as it did not before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::decide::{join_all, Limits};
use super::script::{lengthening_args, time_arg, SCRIPT};
use super::store::RedisStore;
use crate::algo::Rule;
use crate::clock::Clock;

/// The most keys one walk looks at.
pub(super) const MAX_KEYS: u64 = 10_000_000;
/// The longest a walk runs.
pub(super) const MAX_TIME: Duration = Duration::from_secs(600);
/// The keys a `SCAN` call asks for (a hint to Redis), lengthened together.
pub(super) const BATCH: usize = 500;
/// The reports a walk has on the connection at once: a decision sent meanwhile waits behind
/// these few at most, not a whole batch.
const AT_ONCE: usize = 32;
/// The least time a walk's call is given, whatever the store's timeout for decisions.
const MIN_WAIT: Duration = Duration::from_secs(1);

/// Whether replacing the rules `old` by `new` can make some key's state count longer: a
/// sliding log or counter widened, or a warm-up curve changed. A fixed window keeps the end
/// it opened with and GCRA the key's time, so neither lengthens a key's life.
pub(super) fn lengthens(old: &[Rule], new: &[Rule]) -> bool {
    new.iter().zip(old).any(|pair| match pair {
        (Rule::SlidingLog(n), Rule::SlidingLog(o))
        | (Rule::SlidingWindow(n), Rule::SlidingWindow(o)) => n.width > o.width,
        (Rule::WarmUp(n), Rule::WarmUp(o)) => n.curve != o.curve,
        _ => false,
    })
}

/// The walks of one limiter: the latest started (a later one cancels the earlier), and the
/// latest over (done or stopped), for [`Walks::until_over`].
pub(super) struct Walks {
    latest: Arc<AtomicU64>,
    over: Arc<watch::Sender<u64>>,
    /// The Tokio runtime the limiter was built in, if any: a walk runs there when the change
    /// is made outside one (a thread that reloads the configuration).
    built_in: Option<tokio::runtime::Handle>,
}

impl Default for Walks {
    fn default() -> Self {
        Walks {
            latest: Arc::default(),
            over: Arc::new(watch::channel(0).0),
            built_in: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

/// One walk over a limit's keys.
pub(super) struct Walk {
    pub(super) store: RedisStore,
    /// The limit's key names' fixed part (`<prefix><name length>:<name>:`).
    pub(super) key_prefix: Box<[u8]>,
    pub(super) name: Box<str>,
    /// The quotas in force, read for each batch; gone with the limiter.
    pub(super) limits: Weak<ArcSwap<Limits>>,
    pub(super) clock: Clock,
    pub(super) local_time: bool,
}

impl Walks {
    /// Starts `walk` in the background (in the Tokio runtime of the caller, else in the one
    /// the limiter was built in), cancelling the walk before it; logs why not when there is
    /// no runtime to run it or the store is a cluster.
    pub(super) fn start(&self, walk: Walk) {
        let mine = self.latest.fetch_add(1, Ordering::AcqRel) + 1;
        let over = Over(self.over.clone(), mine);
        if walk.store.is_cluster() {
            tracing::warn!(
                target: "tollgate::redis",
                policy = &*walk.name,
                "tollgate: the quotas changed live may make requests count longer, but on \
                 Redis Cluster the keys no request touches keep the expiry they had: such a \
                 key may expire while its requests still count"
            );
            return;
        }
        let current = tokio::runtime::Handle::try_current().ok();
        let Some(runtime) = current.or_else(|| self.built_in.clone()) else {
            tracing::warn!(
                target: "tollgate::redis",
                policy = &*walk.name,
                "tollgate: the quotas changed live may make requests count longer, but the \
                 limiter was built and changed outside a Tokio runtime, so the keys no request \
                 touches keep the expiry they had"
            );
            return;
        };
        let latest = Arc::downgrade(&self.latest);
        runtime.spawn(async move {
            walk.run(latest, mine).await;
            drop(over);
        });
    }

    /// Waits until the walk started last, if any, is over (done or stopped).
    pub(super) async fn until_over(&self) {
        let latest = self.latest.load(Ordering::Acquire);
        let mut over = self.over.subscribe();
        // The sender lives as long as `self`: the wait ends with the walk.
        let _ = over.wait_for(|&o| o >= latest).await;
    }
}

/// Marks walk `.1` over when dropped: done, stopped, or never started.
struct Over(Arc<watch::Sender<u64>>, u64);

impl Drop for Over {
    fn drop(&mut self) {
        let mine = self.1;
        self.0.send_modify(|o| *o = (*o).max(mine));
    }
}

impl Walk {
    /// Lengthens the expiry of every key of the limit, until done, a bound is reached, a call
    /// fails, a later walk starts (`latest` moves past `mine`) or the limiter is dropped.
    async fn run(self, latest: Weak<AtomicU64>, mine: u64) {
        let started = Instant::now();
        let wait = self.store.timeout.max(MIN_WAIT);
        let mut pattern = Vec::with_capacity(self.key_prefix.len() + 8);
        for &b in self.key_prefix.iter() {
            // Taken literally by the glob of SCAN MATCH.
            if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
                pattern.push(b'\\');
            }
            pattern.push(b);
        }
        pattern.push(b'*');
        let (mut cursor, mut seen, mut failed) = (0u64, 0u64, 0u64);
        let stop = |why: &str, seen: u64| {
            tracing::warn!(
                target: "tollgate::redis",
                policy = &*self.name,
                keys = seen,
                "tollgate: stopped lengthening the expiry of the keys after a live change of \
                 quotas ({why}): keys not reached that no request touches keep the expiry they \
                 had"
            );
        };
        loop {
            let current = latest
                .upgrade()
                .is_some_and(|l| l.load(Ordering::Acquire) == mine);
            let Some(limits) = self.limits.upgrade().filter(|_| current) else {
                // A later change walks the keys itself, or the limiter is gone.
                return;
            };
            if seen >= MAX_KEYS || started.elapsed() >= MAX_TIME {
                return stop("its bound of keys or time was reached", seen);
            }
            let mut scan = ::redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(BATCH);
            let (next, keys): (u64, Vec<Vec<u8>>) = match self.store.background(&scan, wait).await {
                Ok(reply) => reply,
                Err(e) => return stop(&format!("SCAN failed: {e}"), seen),
            };
            let limits = limits.load_full();
            let time = time_arg(self.local_time, self.clock.now());
            let args = lengthening_args(&limits.rules, &limits.renewals, time);
            let args = &args[..];
            let failures = AtomicU64::new(0);
            for chunk in keys.chunks(AT_ONCE) {
                let calls: Vec<_> = chunk
                    .iter()
                    .map(|key| {
                        let (store, failures) = (&self.store, &failures);
                        Box::pin(async move {
                            // A key of another layout (another limit's) is left as it is.
                            let sent = store.background_script(&SCRIPT, key, args, wait).await;
                            if sent.is_err() {
                                failures.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                    })
                    .collect();
                join_all(calls).await;
            }
            seen += keys.len() as u64;
            failed += failures.into_inner();
            if next == 0 {
                tracing::info!(
                    target: "tollgate::redis",
                    policy = &*self.name,
                    keys = seen,
                    failed,
                    "tollgate: lengthened the expiry of the keys after a live change of quotas \
                     in {:?}",
                    started.elapsed()
                );
                return;
            }
            cursor = next;
        }
    }
}
