//! Leased quota: an instance takes a batch of a hot key's quota from Redis in one script call
//! and hands it out itself, so that most decisions on that key cost no round trip.
//!
//! Everything an instance admits under a lease was taken from Redis first, by the same script
//! that decides every other request: the fleet never admits more than the limit. What a lease
//! costs is the other side: units an instance holds are not available to the others until it
//! spends them, gives them back or lets them expire. The rules that bound that:
//!
//! * A batch is at most [`Lease::max_batch`] units, and at most the smallest burst of the
//!   policy's quotas.
//! * Its size follows the instance's own rate for the key: the first request of a key takes
//!   only its own cost (a plain decision); a lease spent in less than half its hold doubles the
//!   next batch; a lease that expires with units left makes the next batch what was spent of
//!   it; a batch Redis refuses halves the next one.
//! * A lease is used for at most [`Lease::hold`]. Units left when it expires are gone: never
//!   used and never given back (Redis restored them by time alone meanwhile; giving them back
//!   would let the fleet admit more than the limit). Units of a live lease go back with
//!   [`RedisRateLimiter::return_leases`](super::RedisRateLimiter::return_leases). Units left
//!   when a new batch arrives keep their lease's end, which the new ones share. So the fleet
//!   admits at most `burst + rate × (t + hold)` over any span `t`.
//! * An instance asks for one batch of a key at a time: its other requests that the lease
//!   cannot serve wait for that batch (a few times at most), whether the lease is live or
//!   expired. A request dropped while its batch is on its way clears it; a batch that gets no
//!   answer sends those waiting to the failure policy (a decision waits for Redis once).
//! * Units held or on their way when the quotas change are never used (those on their way
//!   are lost to the instance; Redis recovers them within the burst period).
//!
//! So each instance holds at most `max_batch` units of a key (for a moment up to twice that:
//! after Redis refuses a batch, the request that asked takes what the key has left while
//! another may start the next batch), and the fleet admits
//! at least the limit's allowance less `instances × max_batch` units (plus what expired leases
//! held; Redis's own recovery makes up for those within the quota's burst period).
//!
//! A request served from a lease took its own part of the batch's slice of each quota's time
//! in Redis (the batch's units are handed out in order from the start of its slice), so a
//! refund or a settlement of it gives back what it took and only what still counts, as for a
//! request Redis decided alone (see `src/rate_limit/settle.rs`): a late refund never doubles
//! a limit. A settlement that puts a key in debt takes back the units this instance holds of
//! it and gives them back to Redis in a second call, so that no unit taken before the debt
//! is handed out past it: a debt stands, leased or not.
//!
//! Local decisions report what the instance knows: the key's state in Redis after its latest
//! batch, with the units it still holds given back. `r` is then what Redis would report if the
//! instance returned its lease now and no other instance had taken anything since.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::algo::gcra::{self, Gcra};
use crate::decision::{Decision, Outcome, Reservation, MAX_QUOTAS};
use crate::error::ConfigError;
use crate::keyed::{Absent, OnFull, Table};

/// Leases of a hot key's quota, taken from Redis in batches and handed out locally.
///
/// Set on a store with [`RedisStore::lease`](super::RedisStore::lease); every limiter and
/// layer built on that store leases the keys of its policies whose quotas are all GCRA and that
/// have no penalty box (those ask Redis for every decision, as without a lease). See the
/// [`RedisRateLimiter`](super::RedisRateLimiter) docs for what a lease promises.
///
/// ```
/// use std::time::Duration;
/// use tollgate::redis::Lease;
///
/// // At most 50 units per batch, each used for at most 100 ms.
/// let lease = Lease::new(50, Duration::from_millis(100));
/// assert_eq!(lease.max_batch(), 50);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    max_batch: u32,
    hold: Duration,
    max_keys: usize,
}

impl Lease {
    /// The default bound on the keys a limiter holds leases of.
    pub const DEFAULT_MAX_KEYS: usize = 10_000;

    /// Batches of at most `max_batch` units, each used for at most `hold`.
    ///
    /// `max_batch` bounds what an instance holds of a key, so what the other instances may
    /// miss; `hold` bounds how long a unit taken from Redis may wait before it is admitted (a
    /// burst may therefore come up to `hold` later than Redis would have let it). Checked when
    /// a limiter is built: `max_batch` at least 1, `hold` from 1 ms to 1 minute
    /// ([`ConfigError::InvalidLease`]).
    pub const fn new(max_batch: u32, hold: Duration) -> Self {
        Lease {
            max_batch,
            hold,
            max_keys: Self::DEFAULT_MAX_KEYS,
        }
    }

    /// Holds leases of at most about `max_keys` keys per limiter (default
    /// [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS)); other keys are decided by Redis, one
    /// request at a time.
    #[must_use]
    pub const fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The largest batch.
    pub const fn max_batch(&self) -> u32 {
        self.max_batch
    }

    /// How long a batch is used at most.
    pub const fn hold(&self) -> Duration {
        self.hold
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_batch == 0 {
            return Err(ConfigError::InvalidLease("max_batch must be at least 1"));
        }
        if self.hold < Duration::from_millis(1) || self.hold > Duration::from_secs(60) {
            return Err(ConfigError::InvalidLease(
                "hold must be from 1 ms to 1 minute",
            ));
        }
        if self.max_keys == 0 {
            return Err(ConfigError::InvalidLease("max_keys must be at least 1"));
        }
        Ok(())
    }
}

/// What an instance holds of one key.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// Units taken from Redis and not handed out yet.
    units: u32,
    /// Until when (limiter clock, ns) they may be handed out.
    until: u64,
    /// When the latest batch was taken.
    since: u64,
    /// The size of the latest batch.
    taken: u32,
    /// The size of the next batch.
    batch: u32,
    /// Until when a batch asked for is on its way (the others ask for their cost alone, so
    /// that an instance holds at most one batch). Bounded, for a request dropped on its way.
    pending_until: u64,
    /// When the entry may go: one hold after its lease expires, so that the units left go
    /// back and the batch size is remembered across a short pause.
    forget_at: u64,
    /// The quotas' generation the units were taken under.
    generation: u64,
    /// Each quota's stored time in Redis after the latest batch, on the limiter's clock.
    tats: Tats,
    /// What the latest batch took in Redis (its `taken` units): each quota's slice, in the
    /// script's time; all zeros when not known. A unit handed out takes its own part of it
    /// (see [`Held::hand_out`]).
    slices: Slices,
    /// How many of the units held are left of earlier batches (handed out first), and their
    /// slices.
    carried: u32,
    carried_slices: Slices,
}

/// One slice of Redis time per quota.
type Slices = [[u64; 2]; MAX_QUOTAS];

/// `width × part / whole`, in 128 bits.
fn share(width: u64, part: u32, whole: u32) -> u64 {
    let s = u128::from(width) * u128::from(part) / u128::from(whole.max(1));
    u64::try_from(s).unwrap_or(u64::MAX)
}

impl Held {
    /// What a request of `cost` handed out now took in Redis, `units` (the request's included)
    /// being held: the units left of earlier batches go first, from the start of their
    /// slices, then the latest batch's, from the start of its slice. A request whose units
    /// come from both takes as much time as its parts, from the start of the first (never
    /// later than they lie, so that a refund gives back no more than still counts). A batch
    /// whose slices are not known gives a reservation of the cost alone.
    fn hand_out(&mut self, units: u32, n: usize, cost: u32) -> Reservation {
        let mut taken = Reservation::none();
        taken.cost = cost;
        let known = self.slices != Reservation::none().spots && self.taken > 0;
        let carried = self.carried.min(units);
        let from_carried = cost.min(carried);
        let from_batch = cost - from_carried;
        // Units of the latest batch still held before this request.
        let in_batch = units - carried;
        for q in 0..n {
            let [a, b] = self.slices[q];
            let [s, e] = self.carried_slices[q];
            let carried_len = share(e.saturating_sub(s), from_carried, carried);
            let batch_start = b.saturating_sub(share(b.saturating_sub(a), in_batch, self.taken));
            let batch_len = share(b.saturating_sub(a), from_batch, self.taken);
            taken.spots[q] = if from_carried > 0 {
                [s, s.saturating_add(carried_len).saturating_add(batch_len)]
            } else {
                [batch_start, batch_start.saturating_add(batch_len)]
            };
            self.carried_slices[q] = [s.saturating_add(carried_len), e];
        }
        self.carried = carried - from_carried;
        if !known {
            return Reservation {
                cost,
                ..Reservation::none()
            };
        }
        taken
    }

    /// A new batch of `batch` units that took `slices` arrives while `self.units` are held:
    /// those become the units carried, with the slices they lie in (their own part of the
    /// latest batch, counted from its end, once the units carried before are gone; else from
    /// the start of the earliest slice, no later than they lie).
    fn new_batch(&mut self, n: usize, batch: u32, slices: Slices) {
        let held = self.units;
        let old_carried = self.carried.min(held);
        let in_batch = held - old_carried;
        for q in 0..n {
            let [a, b] = self.slices[q];
            let from_batch = share(b.saturating_sub(a), in_batch, self.taken);
            self.carried_slices[q] = if held == 0 {
                [0, 0]
            } else if old_carried == 0 {
                [b.saturating_sub(from_batch), b]
            } else {
                let [s, e] = self.carried_slices[q];
                [s, e.saturating_add(from_batch)]
            };
        }
        self.carried = held;
        self.slices = slices;
        self.taken = batch;
    }
}

/// One stored time per quota.
type Tats = [u64; MAX_QUOTAS];

impl crate::keyed::Entry for Held {
    /// An expired lease is kept one more hold, for the units to go back and the batch size to
    /// be remembered; after that nothing is lost by dropping it but units that Redis gives
    /// back on its own within the burst period.
    fn idle_at(&self) -> u64 {
        self.forget_at
    }
}

/// What to do before deciding a request that the lease could not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// How many units to ask Redis for: the request's cost, and more to hold.
    pub(crate) batch: u32,
    /// Another request of this instance is taking a batch of the key: wait for it (see
    /// [`Leases::taken`]) and try the lease again before asking Redis.
    pub(crate) wait: bool,
    /// The lease holds enough for the request now (a batch arrived since it last failed to
    /// serve it): try it again, rather than take a batch that would leave two held.
    pub(crate) ready: bool,
    /// The quotas' generation the plan was made under: a batch taken under other quotas than
    /// those in force when it arrives is not held (see [`Leases::took`]).
    pub(crate) generation: u64,
    /// The request's cost.
    pub(crate) cost: u32,
}

/// The leases of one limiter.
pub(crate) struct Leases<K> {
    table: Table<K, Held>,
    max_batch: u32,
    /// ns
    hold: u64,
    /// Bumped when the quotas change: units taken under other quotas are not used.
    generation: AtomicU64,
    served: AtomicU64,
    /// Woken when a batch arrives or is refused, for the requests that wait for it.
    batches: tokio::sync::Notify,
    /// How long a batch asked for counts as on its way (ns): the hold, or the store's timeout
    /// if that is longer, so that no second batch is asked for while the first may still come.
    pending: u64,
}

impl<K: Hash + Eq + Clone> Leases<K> {
    /// The leases of one limiter whose store waits at most `timeout` for an answer.
    pub(crate) fn new(lease: &Lease, timeout: Duration) -> Self {
        let hold = u64::try_from(lease.hold.as_nanos()).unwrap_or(u64::MAX);
        let timeout = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Leases {
            pending: hold.max(timeout),
            table: Table::new(lease.max_keys, OnFull::RejectNewKeys),
            max_batch: lease.max_batch,
            hold,
            generation: AtomicU64::new(0),
            served: AtomicU64::new(0),
            batches: tokio::sync::Notify::new(),
        }
    }

    /// Serves a request of `cost` for `key` at `now` from the units held, if enough are held
    /// and still valid.
    pub(crate) fn serve(&self, key: &K, gcras: &[Gcra], now: u64, cost: u32) -> Option<Decision> {
        if cost == 0 {
            return None;
        }
        let hash = self.table.hash(key);
        let generation = self.generation.load(Ordering::Acquire);
        let served = self
            .table
            .upsert(
                hash,
                key,
                false,
                || now,
                |h, _| {
                    if h.generation != generation || now >= h.until || h.units < cost {
                        return None;
                    }
                    let d = local_decision(gcras, &h.tats, h.units, now, cost);
                    let d = d.with_taken(h.hand_out(h.units, gcras.len(), cost));
                    h.units -= cost;
                    Some(d)
                },
                |_| Absent::Done(None),
            )
            .ok()
            .flatten();
        if served.is_some() {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        served
    }

    /// The batch to ask for a request of `cost` that the lease did not serve (at most
    /// `max_fit`, the smallest burst), and the units of an expired lease to give back first.
    /// Makes room for the key: a key that finds none asks for its cost alone.
    pub(crate) fn plan(&self, key: &K, now: u64, cost: u32, max_fit: u32) -> Plan {
        let hash = self.table.hash(key);
        let generation = self.generation.load(Ordering::Acquire);
        let hold = self.hold;
        let pending = self.pending;
        let max_batch = self.max_batch.min(max_fit);
        let fresh = Held {
            units: 0,
            until: now,
            since: now,
            taken: 0,
            batch: 1,
            pending_until: 0,
            forget_at: now.saturating_add(hold.saturating_mul(2)),
            generation,
            tats: [0; MAX_QUOTAS],
            slices: [[0; 2]; MAX_QUOTAS],
            carried: 0,
            carried_slices: [[0; 2]; MAX_QUOTAS],
        };
        let batch = self.table.upsert(
            hash,
            key,
            false,
            || now,
            |h, _| {
                if h.generation == generation && now < h.until && h.units >= cost {
                    // A batch arrived since the lease failed to serve this request: it is
                    // served from it, where a batch of its own would leave the instance
                    // holding two, more than `max_batch`.
                    return Plan {
                        batch: cost,
                        wait: false,
                        ready: true,
                        generation,
                        cost,
                    };
                }
                if h.generation == generation && now < h.pending_until {
                    // Another request is taking a batch: this one waits for it, whether the
                    // lease is live or expired (each request that finds an expired lease would
                    // otherwise take a batch of its own, and the instance hold them all).
                    return Plan {
                        batch: cost,
                        wait: true,
                        ready: false,
                        generation,
                        cost,
                    };
                }
                if h.generation != generation {
                    // Taken under other quotas: dropped (they are not the ones in force).
                    let batch = h.batch;
                    *h = fresh;
                    h.batch = batch;
                } else if now >= h.until {
                    // Expired with units left: they are gone (Redis restored them by time
                    // alone meanwhile), and the next batch is what one hold used.
                    if h.units > 0 {
                        h.batch = h.taken.saturating_sub(h.units).max(1);
                        h.units = 0;
                    }
                } else if h.taken > 0 && now.saturating_sub(h.since) < hold / 2 {
                    // Spent in under half its hold: twice as much next time.
                    h.batch = h.batch.saturating_mul(2);
                }
                h.batch = h.batch.clamp(1, max_batch.max(1));
                let batch = h.batch.max(cost);
                if batch > cost {
                    h.pending_until = now.saturating_add(pending);
                }
                Plan {
                    batch,
                    wait: false,
                    ready: false,
                    generation,
                    cost,
                }
            },
            |_| {
                Absent::Insert(
                    Plan {
                        batch: cost,
                        wait: false,
                        ready: false,
                        generation,
                        cost,
                    },
                    fresh,
                )
            },
        );
        batch.unwrap_or(Plan {
            batch: cost,
            wait: false,
            ready: false,
            generation,
            cost,
        })
    }

    /// Records a batch of `batch` units that Redis gave for the request `planned` sent at
    /// `sent_at` (its decision `d`); returns the request's decision.
    ///
    /// A batch planned under quotas that were replaced while it was on its way is not held:
    /// its units were granted by the old quotas, and are dropped as those held at the change.
    pub(crate) fn took(
        &self,
        key: &K,
        gcras: &[Gcra],
        sent_at: u64,
        planned: &Plan,
        batch: u32,
        d: &Decision,
    ) -> Decision {
        let cost = planned.cost;
        let generation = self.generation.load(Ordering::Acquire);
        if planned.generation != generation {
            self.batches.notify_waiters();
            return *d;
        }
        let mut tats = [0; MAX_QUOTAS];
        for (t, s) in tats.iter_mut().zip(d.states()) {
            *t = sent_at.saturating_add(s.reset_after_nanos());
        }
        let hash = self.table.hash(key);
        let hold = self.hold;
        let kept = batch - cost;
        let recorded = self.table.upsert(
            hash,
            key,
            false,
            || sent_at,
            |h, now| {
                if h.generation != generation || now >= h.until {
                    h.units = 0;
                }
                // Units left of the lease so far keep its end, and the new ones share it: none
                // is handed out more than a hold after it was taken.
                let until = sent_at.saturating_add(hold);
                h.until = if h.units > 0 {
                    h.until.min(until)
                } else {
                    until
                };
                h.generation = generation;
                if batch > cost {
                    // The batch on its way arrived. A request that asked for its cost alone
                    // (tired of waiting) leaves a batch still on its way pending.
                    h.pending_until = 0;
                }
                h.new_batch(gcras.len(), batch, Reservation::of(d, batch).spots);
                h.units = h.units.saturating_add(kept);
                h.forget_at = h.until.saturating_add(hold);
                h.since = sent_at;
                // The later of two answers is the one that knows more.
                for (old, new) in h.tats.iter_mut().zip(tats) {
                    *old = (*old).max(new);
                }
                let held = h.units.saturating_add(cost);
                let d = local_decision(gcras, &h.tats, held, sent_at, cost);
                d.with_taken(h.hand_out(held, gcras.len(), cost))
            },
            // Dropped since the plan (the table was full): the units are lost to this instance,
            // and come back in Redis within the burst period.
            |_| Absent::Done(*d),
        );
        self.batches.notify_waiters();
        recorded.unwrap_or(*d)
    }

    /// A batch that Redis refused (`halve`: the next one is half as large) or did not answer.
    pub(crate) fn refused(&self, key: &K, halve: bool) {
        let hash = self.table.hash(key);
        self.table.update_or_remove(hash, key, |h| {
            if halve {
                h.batch = (h.batch / 2).max(1);
            }
            h.pending_until = 0;
            true
        });
        self.batches.notify_waiters();
    }

    /// The batch that `plan` asks for, on its way until [`Pending::answered`]: a request
    /// dropped before (its future cancelled) no longer holds up the others, which would
    /// otherwise wait for a batch that never comes, for up to a hold.
    pub(crate) fn pending<'a>(&'a self, key: &'a K, plan: &Plan) -> Pending<'a, K> {
        Pending {
            leases: self,
            key,
            armed: plan.batch > plan.cost,
        }
    }

    /// Takes every unit held at `now` under a live lease (of the quotas in force), for them
    /// to be given back, with the end of each lease: a give-back that cannot leave before
    /// then is not sent. The units of expired leases are dropped, never returned.
    pub(crate) fn drain(&self, now: u64) -> Vec<(K, u32, u64)> {
        let mut keys = Vec::new();
        self.table.for_each(|k, h| {
            if h.units > 0 {
                keys.push(k.clone());
            }
        });
        let generation = self.generation.load(Ordering::Acquire);
        keys.into_iter()
            .filter_map(|k| {
                let hash = self.table.hash(&k);
                let units = self
                    .table
                    .upsert(
                        hash,
                        &k,
                        false,
                        || 0,
                        |h, _| {
                            if h.generation == generation && now < h.until {
                                (std::mem::take(&mut h.units), h.until)
                            } else {
                                // Never given back; an expired lease's units still size the
                                // key's next batch.
                                (0, 0)
                            }
                        },
                        |_| Absent::Done((0, 0)),
                    )
                    .unwrap_or((0, 0));
                (units.0 > 0).then_some((k, units.0, units.1))
            })
            .collect()
    }

    /// Takes every unit held of `key` at `now` under a live lease (of the quotas in force),
    /// for them to be given back: the key went into debt, which no unit taken before it may
    /// pass. An expired lease's units are dropped, never returned.
    pub(crate) fn take(&self, key: &K, now: u64) -> u32 {
        let hash = self.table.hash(key);
        let generation = self.generation.load(Ordering::Acquire);
        let mut units = 0;
        self.table.update_or_remove(hash, key, |h| {
            let live = h.generation == generation && now < h.until;
            let held = std::mem::take(&mut h.units);
            if live {
                units = held;
            }
            true
        });
        units
    }

    /// A future that completes when a batch arrives or is refused; to be created (and
    /// enabled) before [`plan`](Self::plan), so that no batch arriving in between is missed.
    pub(crate) fn taken(&self) -> tokio::sync::futures::Notified<'_> {
        self.batches.notified()
    }

    /// The quotas changed: units held under the old ones are not used.
    pub(crate) fn quotas_changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// How long a lease is used at most.
    pub(crate) fn hold(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.hold)
    }

    /// Requests served from leases.
    pub(crate) fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

/// A batch on its way for a key (see [`Leases::pending`]).
pub(crate) struct Pending<'a, K: Hash + Eq + Clone> {
    leases: &'a Leases<K>,
    key: &'a K,
    armed: bool,
}

impl<K: Hash + Eq + Clone> Pending<'_, K> {
    /// Redis answered (or the batch was not asked for): the request records the batch itself
    /// ([`Leases::took`] or [`Leases::refused`]).
    pub(crate) fn answered(&mut self) {
        self.armed = false;
    }
}

impl<K: Hash + Eq + Clone> Drop for Pending<'_, K> {
    fn drop(&mut self) {
        if self.armed {
            // Whatever Redis granted it is lost to this instance, and comes back in Redis
            // within the burst period.
            self.leases.refused(self.key, false);
        }
    }
}

/// The decision for a request of `cost` served from a lease of `held` units (the request's
/// included), by quotas whose stored times in Redis are `tats`: the state Redis would hold
/// with the units still held given back.
fn local_decision(
    gcras: &[Gcra],
    tats: &[u64; MAX_QUOTAS],
    held: u32,
    now: u64,
    cost: u32,
) -> Decision {
    let mut shadow = [0u64; MAX_QUOTAS];
    for ((s, &t), g) in shadow.iter_mut().zip(tats).zip(gcras) {
        *s = t.saturating_sub(g.interval.saturating_mul(u64::from(held)));
    }
    let n = gcras.len().min(MAX_QUOTAS);
    let (d, _) = gcra::decide(gcras, &mut shadow[..n], now, cost);
    if d.is_allowed() {
        // What it took is its part of the batch's slice (see [`Held::hand_out`]).
        d
    } else {
        // Only when the times the instance knows are behind what it holds (answers that
        // crossed): the units are real, so the request is admitted with the state known.
        Decision::from_store(Outcome::Allowed, 0, d.states())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn leases(max_batch: u32, hold_ms: u64) -> Leases<&'static str> {
        Leases::new(
            &Lease::new(max_batch, Duration::from_millis(hold_ms)),
            Duration::from_millis(50),
        )
    }

    /// Redis in miniature: the decision of taking `n` from one quota stored at `tat`.
    fn redis(g: &Gcra, tat: &mut u64, now: u64, n: u32) -> Decision {
        let mut t = [*tat];
        let (d, _) = gcra::decide(std::slice::from_ref(g), &mut t, now, n);
        *tat = t[0];
        d
    }

    #[test]
    fn the_first_request_takes_its_cost_then_batches_double_up_to_the_bound() {
        // 1000/s burst 100.
        let g = Gcra::new(MS, 100 * MS);
        let l = leases(16, 100);
        let mut tat = 0;
        let mut batches = Vec::new();
        let now = 0;
        for _ in 0..60 {
            if l.serve(&"k", &[g], now, 1).is_some() {
                continue;
            }
            let plan = l.plan(&"k", now, 1, 100);
            let d = redis(&g, &mut tat, now, plan.batch);
            assert!(d.is_allowed());
            let mine = l.took(&"k", &[g], now, &plan, plan.batch, &d);
            assert!(mine.is_allowed());
            batches.push(plan.batch);
        }
        assert_eq!(batches[..6], [1, 2, 4, 8, 16, 16]);
        // Everything admitted was taken; what is held is the difference.
        let taken: u32 = batches.iter().sum();
        let held = l.drain(now);
        assert_eq!(taken - 60, held.first().map_or(0, |h| h.1));
    }

    /// A lease of 8 grown from nothing at time 0, with 7 units left.
    fn grown_to_eight(l: &Leases<&'static str>, g: &Gcra) {
        let mut tat = 0;
        loop {
            if l.serve(&"k", &[*g], 0, 1).is_some() {
                continue;
            }
            let plan = l.plan(&"k", 0, 1, 100);
            let d = redis(g, &mut tat, 0, plan.batch);
            let _ = l.took(&"k", &[*g], 0, &plan, plan.batch, &d);
            if plan.batch == 8 {
                break;
            }
        }
    }

    /// A request the lease could not serve, planned after another's batch arrived, is told
    /// to try the lease again: a batch of its own would leave the instance holding two, more
    /// than `max_batch` (four threads on one key once held 14 of 8).
    #[test]
    fn a_plan_made_after_a_batch_arrived_takes_no_batch_of_its_own() {
        let g = Gcra::new(MS, 100 * MS);
        let l = leases(8, 100);
        grown_to_eight(&l, &g);
        // The lease holds 7: a plan made now (its request having found none a moment ago)
        // asks for nothing and says so.
        let plan = l.plan(&"k", MS, 1, 100);
        assert!(plan.ready && !plan.wait);
        assert_eq!(plan.batch, 1);
        for _ in 0..7 {
            assert!(l.serve(&"k", &[g], MS, 1).is_some());
        }
        // Spent: the next plan takes a batch again, and it was not marked on its way before.
        let plan = l.plan(&"k", MS, 1, 100);
        assert!(!plan.ready && !plan.wait);
        assert_eq!(plan.batch, 8);
    }

    /// Units held that the lease would not serve are no reason to skip a batch: those taken
    /// under replaced quotas, those of an expired lease, and too few for the request's cost.
    #[test]
    fn a_plan_is_ready_only_for_units_the_lease_would_serve() {
        let g = Gcra::new(MS, 100 * MS);
        let changed = leases(8, 100);
        grown_to_eight(&changed, &g);
        changed.quotas_changed();
        assert!(!changed.plan(&"k", MS, 1, 100).ready);
        let expired = leases(8, 100);
        grown_to_eight(&expired, &g);
        assert!(!expired.plan(&"k", 100 * MS, 1, 100).ready);
        let costly = leases(8, 100);
        grown_to_eight(&costly, &g);
        let plan = costly.plan(&"k", MS, 8, 100);
        assert!(!plan.ready);
        assert_eq!(plan.batch, 8);
        // Each time the plan says "ready", the lease serves.
        let l = leases(8, 100);
        grown_to_eight(&l, &g);
        while l.plan(&"k", MS, 2, 100).ready {
            assert!(l.serve(&"k", &[g], MS, 2).is_some());
        }
        assert!(l.serve(&"k", &[g], MS, 2).is_none());
    }

    #[test]
    fn an_expired_lease_is_not_used_and_its_units_are_never_given_back() {
        let g = Gcra::new(MS, 100 * MS);
        let l = leases(8, 100);
        grown_to_eight(&l, &g);
        let hold = 100 * MS;
        assert!(
            l.serve(&"k", &[g], hold, 1).is_none(),
            "expired at the hold"
        );
        // At the hold, Redis has restored the 7 by time alone: none goes back.
        assert!(l.drain(hold).is_empty());
        // One unit of the 8 was spent in its hold: the next batch is 1, with nothing to give.
        assert_eq!(l.plan(&"k", hold, 1, 100).batch, 1);
        assert!(l.drain(hold).is_empty());
    }

    #[test]
    fn units_of_a_live_lease_go_back_until_the_hold_ends() {
        let g = Gcra::new(MS, 100 * MS);
        let l = leases(8, 100);
        grown_to_eight(&l, &g);
        assert_eq!(l.drain(100 * MS - 1), [("k", 7, 100 * MS)]);
        assert!(l.drain(100 * MS - 1).is_empty(), "given back once");
    }

    #[test]
    fn a_refused_batch_halves_the_next_and_a_batch_fits_the_burst() {
        let l = leases(64, 100);
        let g = Gcra::new(MS, 100 * MS);
        let mut tat = 0;
        let now = 0;
        for _ in 0..20 {
            if l.serve(&"k", &[g], now, 1).is_some() {
                continue;
            }
            let plan = l.plan(&"k", now, 1, 5);
            assert!(plan.batch <= 5, "{plan:?}");
            let d = redis(&g, &mut tat, now, plan.batch);
            let _ = l.took(&"k", &[g], now, &plan, plan.batch, &d);
        }
        l.refused(&"k", true);
        // A plan is made once the lease can serve no more.
        while l.serve(&"k", &[g], 50 * MS, 1).is_some() {}
        assert_eq!(l.plan(&"k", 50 * MS, 1, 5).batch, 2);
        // A cost above the batch asks for the cost itself.
        assert_eq!(l.plan(&"k", 50 * MS, 3, 5).batch, 3);
    }

    #[test]
    fn a_local_decision_reports_the_state_with_the_held_units_given_back() {
        // 10/s burst 10: interval 100 ms.
        let g = Gcra::new(100 * MS, 1_000 * MS);
        let l = leases(4, 1_000);
        let mut tat = 0;
        // Batches 1, 2, 4: seven taken, three served.
        let mut served = Vec::new();
        for _ in 0..7 {
            let d = match l.serve(&"k", &[g], 0, 1) {
                Some(d) => d,
                None => {
                    let plan = l.plan(&"k", 0, 1, 10);
                    let d = redis(&g, &mut tat, 0, plan.batch);
                    l.took(&"k", &[g], 0, &plan, plan.batch, &d)
                }
            };
            served.push(d.remaining());
        }
        // Alone on the key, the instance reports what a plain limiter would: 9, 8, ..., 3.
        assert_eq!(served, [9, 8, 7, 6, 5, 4, 3]);
    }

    #[test]
    fn units_taken_under_replaced_quotas_are_not_used() {
        let g = Gcra::new(MS, 100 * MS);
        let l = leases(8, 100);
        let mut tat = 0;
        for _ in 0..4 {
            if l.serve(&"k", &[g], 0, 1).is_none() {
                let plan = l.plan(&"k", 0, 1, 100);
                let d = redis(&g, &mut tat, 0, plan.batch);
                let _ = l.took(&"k", &[g], 0, &plan, plan.batch, &d);
            }
        }
        l.quotas_changed();
        assert!(l.serve(&"k", &[g], 0, 1).is_none());
        assert!(l.drain(0).is_empty());
    }
}
