//! How a [`RedisRateLimiter`](super::RedisRateLimiter) decides: the mechanism under its
//! public API.
//!
//! # Implementation details
//! A decision is answered in this process when it already knows it (a ban or a rejection
//! cached, a unit of a lease), else by one script call (see `script.rs`) on the store, else
//! by the failure policy (`fallback.rs`). With a lease, a hot key's request may wait for
//! another request's batch, or take a batch itself (`lease.rs` plans it); the whole decision
//! waits at most the store's timeout. Refunds and settlements move the key's times in one
//! script call and bring this instance's caches up to date.

use std::sync::Arc;

use ::redis::Script;
use arc_swap::ArcSwap;

use super::ban::Penalty;
use super::deny::DenyCache;
use super::fallback::Fallback;
use super::key::{write_guarded, RedisKey, TagGuard};
use super::lease::Leases;
use super::script::{decision_args, decision_of, decision_script, micros, time_arg, Arg, Renewals};
use super::store::{Failure, RedisStore};
use crate::algo::gcra::Gcra;
use crate::algo::Rule;
use crate::clock::Clock;
use crate::decision::{Decision, Outcome, Reservation};
use crate::error::ConfigError;
use crate::limiter::wait::Lines;
use crate::quota::Quota;

/// A Redis limiter's settings, caches and calls, shared by its clones.
pub(super) struct Inner<K> {
    pub(super) name: Box<str>,
    /// The quotas in force: read once per decision, replaced whole by
    /// [`RedisRateLimiter::set_quotas`](super::limiter::RedisRateLimiter::set_quotas).
    pub(super) limits: Arc<ArcSwap<Limits>>,
    pub(super) store: RedisStore,
    /// `<prefix><name length>:<name>:`, with an unclosed `{` closed.
    pub(super) key_prefix: Box<[u8]>,
    /// How keys are kept from forming a Redis Cluster hash tag.
    pub(super) tag_guard: TagGuard,
    pub(super) clock: Clock,
    /// Whether to send the clock's time to the script rather than use the server's `TIME`.
    pub(super) local_time: bool,
    pub(super) deny: Option<DenyCache<K>>,
    /// Batches of hot keys' quota taken from Redis, handed out locally.
    pub(super) leases: Option<Leases<K>>,
    /// The penalty box, decided in Redis with the quotas.
    pub(super) penalty: Option<Penalty<K>>,
    /// Its script calls, in the metrics.
    pub(super) meter: crate::observe::RedisMeter,
    /// Its decisions through `check_n`, in the metrics.
    #[cfg(feature = "metrics")]
    pub(super) decisions: Option<crate::observe::LimiterMeter>,
    /// The tasks of this process waiting in `until_ready_n`, in one line per key.
    pub(super) waiters: Lines<K>,
    /// What decides while Redis does not answer.
    pub(super) fallback: Fallback<K>,
    /// Held while the limiter lives: its unnamed key names are taken in its store.
    pub(super) _claim: Option<Arc<()>>,
    /// The walks that lengthen its keys' expiry after a live change.
    pub(super) walks: super::expiry::Walks,
    /// Held through each live change, so that changes made at once from several clones are
    /// written one at a time: the quotas in force, the fallback's, and the renewals measured
    /// against the quotas each change replaced, all of one change.
    pub(super) changing: std::sync::Mutex<()>,
}

/// A set of quotas and their numbers for the script, swapped as one.
pub(super) struct Limits {
    pub(super) quotas: Arc<[Quota]>,
    /// The quotas rounded to whole microseconds, in nanoseconds.
    pub(super) rules: Box<[Rule]>,
    /// The same as GCRA, when every quota is one (the deny cache decides those locally).
    pub(super) gcras: Box<[Gcra]>,
    /// The changes of warm-up curves that make the keys idle at them new.
    pub(super) renewals: Renewals,
    /// How many changes were made before these quotas (wrapping), as the local fallback's
    /// limiter counts them: what a decision they judge is stamped with.
    pub(super) generation: u16,
}

impl Limits {
    pub(super) fn new(quotas: Vec<Quota>) -> Result<Self, ConfigError> {
        Limits::replacing(quotas, None, 0)
    }

    /// `quotas` in place of `old` at `now`: they judge the state every key stored (see
    /// [`RateLimiter::set_quotas`](crate::RateLimiter::set_quotas)).
    pub(super) fn replacing(
        quotas: Vec<Quota>,
        old: Option<&Limits>,
        now: u64,
    ) -> Result<Self, ConfigError> {
        crate::limiter::check_quotas(&quotas)?;
        let mut rules = quotas
            .iter()
            .map(micros)
            .collect::<Result<Box<[Rule]>, _>>()?;
        let old_rules = old.map_or(&[][..], |o| &o.rules[..]);
        Rule::replacing(&mut rules, old_rules, now);
        let renewals = old.map_or_else(Renewals::default, |o| {
            o.renewals.after(old_rules, &rules, now)
        });
        let gcras: Box<[Gcra]> = rules.iter().filter_map(Rule::as_gcra).copied().collect();
        Ok(Limits {
            quotas: quotas.into(),
            rules,
            gcras,
            renewals,
            generation: old.map_or(0, |o| o.generation.wrapping_add(1)),
        })
    }

    /// The script's arguments for these quotas (see [`decision_args`]).
    pub(super) fn args<'a>(
        &self,
        cost: Arg<'a>,
        time: Arg<'a>,
        taken: Option<&Reservation>,
    ) -> Vec<Arg<'a>> {
        decision_args(&self.rules, &self.renewals, cost, time, taken)
    }
}

/// How many batches of other requests a request waits for at most before it asks Redis for
/// its own cost.
const MAX_LEASE_WAITS: u32 = 3;

impl<K: RedisKey + std::hash::Hash + Eq + Clone + Send + Sync> Inner<K> {
    #[inline]
    pub(super) fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The decision the deny cache already knows, without a round trip.
    #[inline]
    pub(super) fn local(&self, key: &K, cost: u32, now: u64) -> Option<Decision> {
        if let Some(p) = &self.penalty {
            // Rejections must reach Redis to count as strikes: only bans are answered here.
            let left = p.known_ban(key, now)?;
            let limits = self.limits.load();
            return Some(Decision::banned(&limits.rules, left).stamped(limits.generation));
        }
        if cost == 0 {
            return None;
        }
        let limits = self.limits.load();
        if let Some(leases) = &self.leases {
            if let Some(d) = leases.serve(key, &limits.gcras, now, cost) {
                return Some(d.stamped(limits.generation));
            }
        }
        self.known_refused(key, &limits, now, cost)
    }

    /// The rejection of a request of `cost` for `key` at `now` that the deny cache knows.
    #[inline]
    fn known_refused(&self, key: &K, limits: &Limits, now: u64, cost: u32) -> Option<Decision> {
        let deny = self.deny.as_ref()?;
        let d = deny.check(key, &limits.gcras, now, cost)?;
        Some(d.stamped(limits.generation))
    }

    /// The decision of Redis, or of the failure policy; with a [`Lease`](super::Lease), a
    /// batch for the key taken with it when the key is hot.
    ///
    /// The whole decision waits at most the store's timeout from here: waiting for another
    /// request's batch and its own call share one deadline.
    pub(super) async fn remote(&self, key: &K, cost: u32, now: u64) -> Decision {
        let inner = self;
        let deadline = inner.store.deadline();
        // While Redis does not answer, no batch can be taken: a request waiting for another's
        // batch would wait the timeout twice. Each asks for its own cost, as without a lease.
        let Some(leases) = inner
            .leases
            .as_ref()
            .filter(|_| cost > 0 && !inner.store.is_down())
        else {
            return self.decide(key, cost, now, None).await;
        };
        let limits = inner.limits.load_full();
        let max_fit = u32::try_from(limits.gcras.iter().map(Gcra::burst).min().unwrap_or(1))
            .unwrap_or(u32::MAX);
        let mut plan;
        let mut waits = 0;
        // The time of the request's first look; after a wait, the clock is read again.
        let mut at = now;
        loop {
            let taken = leases.taken();
            let mut taken = std::pin::pin!(taken);
            taken.as_mut().enable();
            plan = leases.plan(key, at, cost, max_fit);
            if plan.ready {
                if let Some(d) = leases.serve(key, &limits.gcras, at, cost) {
                    return d.stamped(limits.generation);
                }
                // Another request took the units first: plan again, a few times at most.
                if waits == MAX_LEASE_WAITS {
                    break;
                }
                waits += 1;
                continue;
            }
            // Another request of this instance is taking a batch: its answer comes as soon as
            // this request's own would, and may serve it. A few times at most, then the
            // request asks Redis for its cost alone.
            if !plan.wait || waits == MAX_LEASE_WAITS {
                break;
            }
            if inner.store.is_down() {
                // A batch waited for got no answer between this request's last look and its
                // new wait (so its wake-up may have been missed): no batch is coming.
                return self.fallback.unanswered(key, cost, &limits.rules);
            }
            waits += 1;
            let until = deadline.min(tokio::time::Instant::now() + leases.hold());
            let _ = tokio::time::timeout_at(until, taken).await;
            at = self.now().max(at);
            if let Some(d) = leases.serve(key, &limits.gcras, at, cost) {
                return d.stamped(limits.generation);
            }
            if inner.store.is_down() || tokio::time::Instant::now() >= deadline {
                // The batch waited for got no answer, or the decision's time is up: asking
                // Redis again would wait past the timeout.
                return self.fallback.unanswered(key, cost, &limits.rules);
            }
        }
        // The decision's first call has the store's whole timeout unless the request waited
        // for a batch; a call after another has what is left of it. (A call cut short that
        // gets no answer says nothing about Redis: it is no outage.)
        let mut limit = (waits > 0).then_some(deadline);
        // Dropped before the answer, the request no longer holds up the others.
        let mut pending = leases.pending(key, &plan);
        if plan.batch > cost {
            // A batch already known to be refused is not asked for.
            if self.known_refused(key, &limits, now, plan.batch).is_some() {
                pending.answered();
                leases.refused(key, true);
            } else {
                let answer = self.ask(key, plan.batch, now, limit).await;
                limit = Some(deadline);
                pending.answered();
                let d = match answer {
                    Ok(d) => d,
                    Err(failure) => {
                        // The failure policy decides the cost alone (asking Redis again would
                        // wait as long).
                        leases.refused(key, false);
                        return self.fallback.failed(key, cost, &limits.rules, failure);
                    }
                };
                if d.is_allowed() {
                    let took = leases.took(key, &limits.gcras, now, &plan, plan.batch, &d);
                    return took.stamped(limits.generation);
                }
                leases.refused(key, true);
                // The refusal says what the key has left: the cost alone may be known to be
                // refused too (no second call), or what is left may be taken as the batch.
                if let Some(refused) = self.known_refused(key, &limits, now, cost) {
                    return refused;
                }
                let left = u32::try_from(d.remaining()).unwrap_or(u32::MAX);
                if left > cost && left < plan.batch {
                    match self.ask(key, left, now, limit).await {
                        Ok(d) if d.is_allowed() => {
                            let took = leases.took(key, &limits.gcras, now, &plan, left, &d);
                            return took.stamped(limits.generation);
                        }
                        Ok(_) => {}
                        Err(failure) => {
                            return self.fallback.failed(key, cost, &limits.rules, failure)
                        }
                    }
                }
            }
        }
        let d = self.decide(key, cost, now, limit).await;
        if d.is_allowed() && !d.is_degraded() {
            // A batch of the cost alone: how soon the key needs the next one sizes that one.
            let took = leases.took(key, &limits.gcras, now, &plan, cost, &d);
            return took.stamped(limits.generation);
        }
        d
    }

    /// The decision of Redis for a request of `cost`, or of the failure policy, by
    /// `deadline` if there is one.
    async fn decide(
        &self,
        key: &K,
        cost: u32,
        now: u64,
        deadline: Option<tokio::time::Instant>,
    ) -> Decision {
        match self.ask(key, cost, now, deadline).await {
            Ok(d) => d,
            Err(failure) => {
                let limits = self.limits.load();
                self.fallback.failed(key, cost, &limits.rules, failure)
            }
        }
    }

    /// The decision of Redis for a request of `cost`, answered within the store's timeout (and
    /// by `deadline` if there is one); why there is none otherwise.
    async fn ask(
        &self,
        key: &K,
        cost: u32,
        now: u64,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Decision, Failure> {
        let inner = self;
        // One set of quotas for the whole decision, whatever changes while it is on its way.
        let limits = inner.limits.load_full();
        let args = limits.args(
            Arg::Int(u64::from(cost)),
            time_arg(inner.local_time, now),
            None,
        );
        let redis_key = self.redis_key(key);
        let reply = match &inner.penalty {
            Some(p) => {
                let ban_key = p.key(key);
                let args = p.args(args, time_arg(inner.local_time, now));
                let keys: [&[u8]; 2] = [&redis_key, &ban_key];
                inner
                    .store
                    .try_eval_script(p.script(), &keys, &args, &inner.meter, deadline)
                    .await
            }
            None => {
                let script = decision_script(&limits.rules, false);
                inner
                    .store
                    .try_eval_script(script, &[&redis_key], &args, &inner.meter, deadline)
                    .await
            }
        };
        let reply = reply?;
        let d = decision_of(&limits.rules, &reply, cost).ok_or_else(|| {
            inner.store.bad_reply_on(&inner.meter, &redis_key);
            Failure::Key
        })?;
        let d = d.stamped(limits.generation);
        if d.outcome() == Outcome::Banned {
            if let Some(p) = &inner.penalty {
                p.banned(key, now, &d, &reply);
            }
        }
        if let Some(deny) = &inner.deny {
            match d.outcome() {
                // With a penalty box, every rejection must reach Redis as a strike.
                Outcome::Limited if inner.penalty.is_none() => deny.remember(key, now, cost, &d),
                // The key moved on: a cached rejection must not report stale times.
                Outcome::Allowed if cost > 0 => deny.admitted(key, now, &d),
                _ => {}
            }
        }
        Ok(d)
    }

    /// The Redis key that holds the state of `key` (see
    /// [`RedisRateLimiter::redis_key`](super::RedisRateLimiter::redis_key)).
    pub(super) fn redis_key(&self, key: &K) -> Vec<u8> {
        let mut name = Vec::with_capacity(self.key_prefix.len() + 32);
        name.extend_from_slice(&self.key_prefix);
        write_guarded(&mut name, key, self.tag_guard);
        name
    }

    /// Gives back to Redis the units held under a live lease (see
    /// [`RedisRateLimiter::return_leases`](super::limiter::RedisRateLimiter::return_leases)(super::RedisRateLimiter::return_leases)).
    pub(super) async fn return_leases(&self) {
        let Some(leases) = &self.leases else {
            return;
        };
        let held = leases.drain(self.now());
        let all = async {
            // A few hundred calls at a time, each batch pipelined on the connection.
            for chunk in held.chunks(RETURN_AT_ONCE) {
                let calls: Vec<_> = chunk
                    .iter()
                    .map(|(key, units, until)| {
                        Box::pin(async move {
                            // A lease that expired while earlier give-backs were on their way
                            // is not given back: Redis restores its units by time alone.
                            if self.now() < *until {
                                let _ = self.give_back(key, *units).await;
                            }
                        })
                    })
                    .collect();
                join_all(calls).await;
            }
        };
        // One deadline for all of them: what is not back by then is lost to the fleet.
        let _ = tokio::time::timeout(self.store.timeout, all).await;
    }

    /// Gives back a request of `cost` admitted earlier for `key` (a layer inside rejected
    /// it), in one script call: each quota's time moves back by `cost` emission intervals,
    /// never before now. A cached rejection of the key is brought up to date (or dropped).
    /// A refund Redis does not answer in time is lost, and logged as an outage.
    pub(super) async fn refund(&self, key: &K, taken: &Reservation) {
        let cost = taken.cost;
        if cost == 0 {
            return;
        }
        // A negative cost is a refund to the script.
        self.adjust(key, &format!("-{cost}"), Some(taken)).await;
    }

    /// Gives back `units` of an expired lease of `key`, as [`refund`](Self::refund); whether
    /// Redis answered.
    async fn give_back(&self, key: &K, units: u32) -> bool {
        self.adjust(key, &format!("-{units}"), None).await.is_some()
    }

    /// Settles a request that reserved `reserved` for `key` at the `actual` cost known after
    /// its response, in one script call: gives back the difference (as [`refund`]), or charges
    /// it even over the limit (the key goes into debt). Returns the key's state after
    /// settling; `None` when Redis did not answer in time (the reservation stands).
    ///
    /// [`refund`]: Self::refund
    pub(super) async fn settle(
        &self,
        key: &K,
        taken: &Reservation,
        actual: u32,
    ) -> Option<Decision> {
        let reserved = taken.cost;
        let cost = match actual.cmp(&reserved) {
            std::cmp::Ordering::Less => format!("-{}", reserved - actual),
            // "+c" charges c whatever the limit.
            std::cmp::Ordering::Greater => format!("+{}", actual - reserved),
            std::cmp::Ordering::Equal => "0".to_owned(),
        };
        let settled = self.adjust(key, &cost, Some(taken)).await;
        if actual > reserved {
            // A debt stands: units this instance holds of the key, taken before it, are not
            // handed out past it, and go back as `return_leases` gives them.
            if let Some(leases) = &self.leases {
                let units = leases.take(key, self.now());
                if units > 0 {
                    let back = self.adjust(key, &format!("-{units}"), None).await;
                    return back.or(settled);
                }
            }
        }
        settled
    }

    /// Runs the script with a signed cost that moves the key's times whatever the limit (a
    /// refund, or a charge), and brings a cached rejection of the key up to date.
    async fn adjust(&self, key: &K, cost: &str, taken: Option<&Reservation>) -> Option<Decision> {
        let inner = self;
        let now = self.now();
        let limits = inner.limits.load_full();
        // A reservation the script did not fill in (a request admitted before its spots
        // were known) is given back as a lease's units are; one it filled in never has
        // `none()`'s spots (see `decision_of`).
        let taken = taken.filter(|t| t.spots != Reservation::none().spots);
        let args = Arg::Bytes(cost.as_bytes());
        let args = limits.args(args, time_arg(inner.local_time, now), taken);
        let script = decision_script(&limits.rules, true);
        let reply = inner
            .store
            .eval_script(script, &[&self.redis_key(key)], &args, &inner.meter)
            .await?;
        match decision_of(&limits.rules, &reply, 0) {
            Some(d) => {
                let d = d.stamped(limits.generation);
                if let Some(deny) = &inner.deny {
                    deny.admitted(key, now, &d);
                }
                Some(d)
            }
            None => {
                inner.store.bad_reply(&inner.meter);
                None
            }
        }
    }

    /// Runs the penalty box alone (see [`Penalty::only`]).
    pub(super) async fn penalty_only(&self, script: &Script, key: &K) -> Option<u64> {
        let inner = self;
        let p = inner.penalty.as_ref()?;
        let now = self.now();
        let time = time_arg(inner.local_time, now);
        p.only(
            &inner.store,
            &inner.meter,
            script,
            &self.redis_key(key),
            key,
            now,
            time,
        )
        .await
    }
}

/// How many give-backs [`RedisRateLimiter::return_leases`](super::limiter::RedisRateLimiter::return_leases) sends at once.
const RETURN_AT_ONCE: usize = 256;

/// Runs `calls` concurrently until all are done (each wake polls those left: for a few
/// hundred at most).
pub(super) async fn join_all<F: std::future::Future<Output = ()> + Unpin>(mut calls: Vec<F>) {
    std::future::poll_fn(|cx| {
        calls.retain_mut(|c| std::pin::Pin::new(c).poll(cx).is_pending());
        if calls.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}
