//! The penalty box: keys that keep getting rejected are banned for a while, longer each time.
//!
//! A [`PenaltyBox`] on a [`RateLimitLayer`](crate::RateLimitLayer) counts *strikes*: every
//! request of a key that the layer's quotas reject because of the key's own traffic is one (and
//! [`Penalties::strike`] records one from anywhere else, e.g. a failed login found after the
//! response). A refusal for the server's state is not: a new key turned away because the table
//! is full ([`Decision::is_store_full`]), a decision of a store's failure policy or local
//! fallback, a missing key, or a dry run (on either store: a dry-run layer still answers a ban
//! recorded otherwise, and lets the request through). The rules, for each key:
//!
//! * **Counting.** The first strike opens a run of `within`; `strikes` strikes inside the run
//!   ban the key. A strike after the run has ended opens a new run, counting from 1: `strikes - 1`
//!   strikes followed by quiet never ban.
//! * **Ban.** The strike that completes a run bans the key at once, and that very request is
//!   answered as banned. While banned, every request of the key is turned away
//!   before the quotas are asked: it never reaches the handler and consumes nothing. Strikes
//!   during a ban do not count (requests that raced the ban cannot lengthen it).
//! * **Escalation.** The `n`-th ban of a key lasts `ban × 2^(n-1)`, at most `max_ban`
//!   (default 24 hours, or `ban` if that is longer): `ban`, `2 ban`, `4 ban`, …, `max_ban`.
//! * **Forgiveness.** A key that has gone `forget_after` (default: `max_ban`) since its last ban
//!   ended without a new ban starts again from the first ban.
//! * **Answer.** `429 Too Many Requests` by default (or the status given to
//!   [`PenaltyBox::status`]), with `Retry-After` (and gRPC pushback) the time at which a retry
//!   is admitted: the end of the ban, or later when the quotas that refused the request that
//!   brought the ban admit it later (whole seconds, rounded up). A client that waits as told is
//!   served, never struck again, unless the quotas are lowered meanwhile: its retry is then
//!   judged by the new quotas (a refusal is a strike), and told the new time. That time is
//!   measured at the ban, with the quotas then in force: a live change during the ban does
//!   not rewrite it (a raise may admit a retry sooner once the ban is over). `RateLimit`
//!   fields agree: every quota `r=0`, `t` at least that wait. The rejection's kind is [`RejectionKind::Banned`](crate::response::RejectionKind::Banned).
//!
//! # Memory
//!
//! The state of a key is a few numbers counted against the layer's one bound, `max_keys`, with
//! the quota state of its tiers, of which records take at most half (so that bans can never
//! take every place from new clients): a key is tracked while it has a run open, a ban, or an offence
//! not yet forgotten. When there is no place, idle entries go first, then quota state (under
//! [`OnFull::EvictNearestIdle`]), then keys with strikes only (they lose them), then, only for
//! a key that its strike bans, keys whose bans are over but on record. A banned key is never
//! evicted. A strike that finds no place is not recorded (its request is still limited by the
//! quotas).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{key, penalty::PenaltyBox, Quota, RateLimitLayer};
//!
//! // Five rejections within a minute ban the client for 10 minutes, then 20, 40, ... up to a day.
//! let login = RateLimitLayer::new(Quota::per_minute(5))
//!     .key(key::PeerIp)
//!     .penalty_box(PenaltyBox::new(5, Duration::from_secs(60), Duration::from_secs(600)));
//! # let _ = login;
//! ```

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::clock::Clock;
use crate::decision::{Decision, Outcome};
use crate::error::ConfigError;
use crate::keyed::{Absent, Bound, Entry, OnFull, Room, Table};

/// The longest ban when none is set: one day (or the first ban, if longer).
pub const DEFAULT_MAX_BAN: Duration = Duration::from_secs(24 * 60 * 60);

/// When a key is banned, and for how long. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct PenaltyBox {
    strikes: u32,
    within: Duration,
    ban: Duration,
    max_ban: Option<Duration>,
    forget_after: Option<Duration>,
    status: StatusCode,
}

impl PenaltyBox {
    /// Bans a key for `ban` after `strikes` rejections within `within` of the first; repeat
    /// offences are banned twice as long each time, up to [`max_ban`](Self::max_ban).
    ///
    /// `strikes`, `within` and `ban` must not be zero: a layer given such a penalty box
    /// reports [`ConfigError::InvalidPenaltyBox`] from `validate`, and panics when applied.
    pub fn new(strikes: u32, within: Duration, ban: Duration) -> Self {
        PenaltyBox {
            strikes,
            within,
            ban,
            max_ban: None,
            forget_after: None,
            status: StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The longest a ban may grow to (default [`DEFAULT_MAX_BAN`], or the first ban if that
    /// is longer). Equal to the first ban, bans never escalate. Shorter is an error.
    pub fn max_ban(mut self, max_ban: Duration) -> Self {
        self.max_ban = Some(max_ban);
        self
    }

    /// How long a key must go without a ban, after its last ban ended, before its offences
    /// are forgotten and its next ban is the first again (default: the longest ban).
    pub fn forget_after(mut self, quiet: Duration) -> Self {
        self.forget_after = Some(quiet);
        self
    }

    /// The status a banned key is answered with (default `429`); a 4xx or 5xx status.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The status banned requests are answered with.
    pub fn answer_status(&self) -> StatusCode {
        self.status
    }

    /// Checks the settings; the error says which one cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |why| Err(ConfigError::InvalidPenaltyBox(why));
        if self.strikes == 0 {
            return invalid("strikes must be at least 1");
        }
        if self.within.is_zero() {
            return invalid("the window for strikes must be longer than zero");
        }
        if self.ban.is_zero() {
            return invalid("the ban must be longer than zero");
        }
        if self.max_ban.is_some_and(|m| m < self.ban) {
            return invalid("max_ban must be at least the first ban");
        }
        if !(self.status.is_client_error() || self.status.is_server_error()) {
            return Err(ConfigError::InvalidStatus(self.status.as_u16()));
        }
        Ok(())
    }

    pub(crate) fn rules(&self) -> Rules {
        let max_ban = self.max_ban.unwrap_or(DEFAULT_MAX_BAN.max(self.ban));
        Rules {
            strikes: self.strikes,
            within: nanos(self.within),
            ban: nanos(self.ban),
            max_ban: nanos(max_ban),
            forget_after: nanos(self.forget_after.unwrap_or(max_ban)),
        }
    }
}

/// Whether a refusal counts as a strike: one the key's own traffic caused (its quotas were
/// spent, or it asked for more than a burst). A new key turned away because the table is full,
/// a decision the store's failure policy or local fallback made while the store was away, and
/// anything admitted are not the key's offence.
pub(crate) fn is_offence(decision: &Decision) -> bool {
    matches!(decision.outcome(), Outcome::Limited | Outcome::Exceeds)
        && !decision.is_degraded()
        && !decision.is_store_full()
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The penalty box's numbers, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) strikes: u32,
    pub(crate) within: u64,
    pub(crate) ban: u64,
    pub(crate) max_ban: u64,
    pub(crate) forget_after: u64,
}

impl Rules {
    /// The length of the `offence`-th ban (1 for the first): `ban × 2^(offence-1)`, at most
    /// `max_ban`, without overflow for any `offence`.
    pub(crate) fn ban_length(&self, offence: u32) -> u64 {
        let doublings = offence.saturating_sub(1);
        let length = match 1u64.checked_shl(doublings) {
            Some(factor) if doublings < 64 => self.ban.saturating_mul(factor),
            _ => u64::MAX,
        };
        length.min(self.max_ban)
    }
}

/// What recording a strike did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strike {
    /// Counted: the key has this many strikes in its current run, not yet enough for a ban.
    Counted(u32),
    /// This strike banned the key for this long (its `offence`-th ban).
    Banned {
        /// The length of the ban.
        ban: Duration,
        /// Which ban of the key this is, 1 for the first since its offences were forgotten.
        offence: u32,
    },
    /// The key was already banned, for this much longer; the strike does not count.
    AlreadyBanned(Duration),
    /// The strike could not be recorded: the table is full of banned keys.
    NotRecorded,
}

/// The penalty state of one key, in nanoseconds of the box's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Record {
    /// When the current run of strikes ends (meaningless while `strikes` is 0).
    pub(crate) run_end: u64,
    /// Strikes in the current run.
    pub(crate) strikes: u32,
    /// Bans not yet forgotten.
    pub(crate) offences: u32,
    /// The current or last ban ends at this time (0: none).
    pub(crate) banned_until: u64,
    /// When the request that brought the current ban is admitted: the end of the ban, or later
    /// if the quotas that refused it admit it later. What a banned key is told to wait for.
    pub(crate) retry_at: u64,
}

impl Record {
    /// Records a strike at `now`, all in one step. `retry` is how long the quotas that refused
    /// the request make it wait (0: no wait, or none known). Returns the strike and, when the
    /// key is banned, the wait until a retry is admitted (the ban and the quotas; else 0).
    pub(crate) fn strike(&mut self, rules: &Rules, now: u64, retry: u64) -> (Strike, u64) {
        let retry_at = now.saturating_add(retry);
        if self.banned_until > now {
            let left = self.banned_until - now;
            self.retry_at = self.retry_at.max(retry_at);
            return (
                Strike::AlreadyBanned(Duration::from_nanos(left)),
                self.wait(now),
            );
        }
        if self.offences > 0 && now >= self.banned_until.saturating_add(rules.forget_after) {
            self.offences = 0;
        }
        if self.strikes == 0 || now >= self.run_end {
            self.strikes = 0;
            self.run_end = now.saturating_add(rules.within);
        }
        self.strikes = self.strikes.saturating_add(1);
        if self.strikes < rules.strikes {
            return (Strike::Counted(self.strikes), 0);
        }
        self.offences = self.offences.saturating_add(1);
        let ban = rules.ban_length(self.offences);
        self.banned_until = now.saturating_add(ban);
        self.retry_at = self.banned_until.max(retry_at);
        self.strikes = 0;
        self.run_end = 0;
        let strike = Strike::Banned {
            ban: Duration::from_nanos(ban),
            offence: self.offences,
        };
        (strike, self.wait(now))
    }

    /// Nanoseconds of ban left at `now` (0: not banned).
    #[inline]
    pub(crate) fn ban_left(&self, now: u64) -> u64 {
        self.banned_until.saturating_sub(now)
    }

    /// Nanoseconds a banned key waits at `now` until a retry is admitted: the ban, and the
    /// quotas' wait for the request that brought it (0: not banned).
    #[inline]
    pub(crate) fn wait(&self, now: u64) -> u64 {
        if self.banned_until <= now {
            return 0;
        }
        self.banned_until.max(self.retry_at) - now
    }

    /// Where the record stands in the order of eviction (see [`Held`]).
    fn rank(&self, now: u64, forget_after: u64) -> u8 {
        if self.banned_until > now {
            RANK_BANNED
        } else if self.offences > 0 && now < self.banned_until.saturating_add(forget_after) {
            RANK_OFFENDER
        } else {
            RANK_STRIKES
        }
    }
}

/// A key with strikes only: the first to go when a new key needs room.
const RANK_STRIKES: u8 = 1;
/// A key with bans on record: goes only to make room for a key that is banned.
const RANK_OFFENDER: u8 = 2;
/// A banned key: never evicted.
const RANK_BANNED: u8 = 3;

/// A record and the rules it was made under (the table asks when it is idle).
///
/// When the table is full, room for a new key is made in this order: idle entries first (they
/// decide nothing), then the quota state of keys (in a layer, whose bound the penalty box
/// shares), then keys with strikes only, then, and only for a key that this very strike bans,
/// keys whose bans are over but on record. A banned key is never evicted: a flood of one-off
/// strikes cannot wash away the history of a repeat offender.
pub(crate) struct Held {
    record: Record,
    forget_after: u64,
}

impl Entry for Held {
    const MIN_RANK: u8 = RANK_STRIKES;

    fn idle_at(&self) -> u64 {
        let r = &self.record;
        let run = if r.strikes > 0 { r.run_end } else { 0 };
        let offences = if r.offences > 0 {
            r.banned_until.saturating_add(self.forget_after)
        } else {
            0
        };
        run.max(offences).max(r.banned_until)
    }

    fn evictable(&self, now: u64) -> bool {
        self.record.banned_until <= now
    }

    fn rank(&self, now: u64) -> u8 {
        self.record.rank(now, self.forget_after)
    }
}

/// The penalty state of a layer's keys: which are banned, and the strikes of the others.
///
/// Cheap to clone; clones share the state. Get it from
/// [`RateLimitLayer::penalties`](crate::RateLimitLayer::penalties) to record strikes that the
/// layer cannot see itself (a failed login, found once the handler has answered), to ask
/// whether a key is banned, or to lift a ban.
pub struct Penalties<K> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    table: Table<K, Held>,
    rules: Rules,
    clock: Clock,
}

impl<K> Clone for Penalties<K> {
    fn clone(&self) -> Self {
        Penalties {
            inner: self.inner.clone(),
        }
    }
}

impl<K> fmt::Debug for Penalties<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Penalties")
            .field("rules", &self.inner.rules)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Penalties<K> {
    /// The state for `config`, on `clock`, counting its keys in `bound` with those of the
    /// tables that share it (a layer's quotas): `max_keys` is one bound for both. Records take
    /// at most half of it, so that bans can never take every place from new clients.
    pub(crate) fn sharing(config: &PenaltyBox, clock: Clock, bound: &Arc<Bound>) -> Self {
        let penalties = Self::new(config, clock, (bound.max_keys() / 2).max(1));
        penalties.inner.table.share(bound.clone());
        let inner: Arc<dyn Room> = penalties.inner.clone();
        bound.join(Arc::downgrade(&inner));
        penalties
    }
}

impl<K: Hash + Eq + Clone> Room for Inner<K>
where
    K: Send + Sync,
{
    fn drop_idle(&self) -> bool {
        self.table.drop_idle(self.clock.now())
    }

    fn evict(&self, rank: u8, spare: Option<u64>) -> bool {
        self.table.evict_for_other(self.clock.now(), rank, spare)
    }

    fn idle_in(&self) -> u64 {
        self.table.idle_in(self.clock.now())
    }
}

impl<K: Hash + Eq + Clone> Penalties<K> {
    /// The state for `config`, on `clock`, tracking at most `max_keys` keys.
    pub(crate) fn new(config: &PenaltyBox, clock: Clock, max_keys: usize) -> Self {
        Penalties {
            inner: Arc::new(Inner {
                // Strike-only keys give way to new ones; banned keys never do.
                table: Table::new(max_keys, OnFull::EvictNearestIdle),
                rules: config.rules(),
                clock,
            }),
        }
    }

    /// Builds the state of a penalty box that is used without a layer: strikes recorded with
    /// [`strike`](Self::strike), bans read with [`ban_left`](Self::ban_left), e.g. around a
    /// [`RateLimiter`](crate::RateLimiter) or in a handler.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::penalty::{Penalties, PenaltyBox, Strike};
    /// use tollgate::Clock;
    ///
    /// let (clock, _time) = Clock::manual();
    /// let boxed = PenaltyBox::new(2, Duration::from_secs(60), Duration::from_secs(30));
    /// let penalties = Penalties::<&str>::try_new(&boxed, clock, 10_000)?;
    /// assert_eq!(penalties.strike(&"mallory"), Strike::Counted(1));
    /// assert!(matches!(penalties.strike(&"mallory"), Strike::Banned { offence: 1, .. }));
    /// assert_eq!(penalties.ban_left(&"mallory"), Some(Duration::from_secs(30)));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn try_new(
        config: &PenaltyBox,
        clock: Clock,
        max_keys: usize,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        if max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        Ok(Self::new(config, clock, max_keys))
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.inner.clock.now()
    }

    /// Nanoseconds of ban left for `key` at `now` (0: not banned).
    #[inline]
    pub(crate) fn ban_left_at(&self, key: &K, now: u64) -> u64 {
        let hash = self.inner.table.hash(key);
        self.inner
            .table
            .get(hash, key, now, |h| h.record.ban_left(now))
            .unwrap_or(0)
    }

    /// Nanoseconds `key` is told to wait at `now` if it is banned: until the ban ends and the
    /// quotas admit the request that brought it (0: not banned).
    #[inline]
    pub(crate) fn wait_at(&self, key: &K, now: u64) -> u64 {
        let hash = self.inner.table.hash(key);
        self.inner
            .table
            .get(hash, key, now, |h| h.record.wait(now))
            .unwrap_or(0)
    }

    /// Records a strike against `key` at `now`, for a request the quotas make wait `retry`
    /// nanoseconds (0: none); with it, the wait of a banned key (see [`Record::strike`]).
    pub(crate) fn strike_at(&self, key: &K, now: u64, retry: u64) -> (Strike, u64) {
        let rules = self.inner.rules;
        let hash = self.inner.table.hash(key);
        let forget_after = rules.forget_after;
        let result = self.inner.table.upsert(
            hash,
            key,
            false,
            || now,
            |held, now| held.record.strike(&rules, now, retry),
            |now| {
                let mut record = Record::default();
                let result = record.strike(&rules, now, retry);
                Absent::Insert(
                    result,
                    Held {
                        record,
                        forget_after,
                    },
                )
            },
        );
        result.unwrap_or((Strike::NotRecorded, 0))
    }

    /// Records a strike against `key` now: a rejection, a failed login, anything the key
    /// should not do too often. The strike that completes a run bans the key; see the
    /// [module docs](self) for the rules.
    pub fn strike(&self, key: &K) -> Strike {
        self.strike_at(key, self.now(), 0).0
    }

    /// How long `key` is still banned, or `None` if it is not.
    pub fn ban_left(&self, key: &K) -> Option<Duration> {
        match self.ban_left_at(key, self.now()) {
            0 => None,
            left => Some(Duration::from_nanos(left)),
        }
    }

    /// Forgets everything about `key`: its ban, its strikes and its offences.
    pub fn pardon(&self, key: &K) {
        let hash = self.inner.table.hash(key);
        self.inner.table.remove_if(hash, |k, _| k == key);
    }

    /// The number of keys tracked (banned, with strikes, or with offences not yet forgotten).
    pub fn len(&self) -> usize {
        self.inner.table.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn rules(strikes: u32, within: u64, ban: u64, max_ban: u64, forget: u64) -> Rules {
        Rules {
            strikes,
            within: within * S,
            ban: ban * S,
            max_ban: max_ban * S,
            forget_after: forget * S,
        }
    }

    #[test]
    fn ban_lengths_double_up_to_the_cap_without_overflow() {
        let r = rules(1, 1, 10, 75, 100);
        let lengths: Vec<u64> = (1..=5).map(|n| r.ban_length(n) / S).collect();
        assert_eq!(lengths, [10, 20, 40, 75, 75]);
        for n in [63, 64, 65, 1000, u32::MAX] {
            assert_eq!(r.ban_length(n), 75 * S);
        }
        let huge = Rules {
            ban: u64::MAX / 2 + 1,
            max_ban: u64::MAX,
            ..r
        };
        assert_eq!(huge.ban_length(2), u64::MAX);
    }

    #[test]
    fn a_record_counts_a_run_bans_at_the_threshold_and_ignores_strikes_while_banned() {
        let r = rules(3, 60, 10, 1000, 1000);
        let mut rec = Record::default();
        let t = 5 * S;
        assert_eq!(rec.strike(&r, t, 0).0, Strike::Counted(1));
        assert_eq!(rec.strike(&r, t + S, 0).0, Strike::Counted(2));
        let (strike, left) = rec.strike(&r, t + 2 * S, 0);
        assert_eq!(
            strike,
            Strike::Banned {
                ban: Duration::from_secs(10),
                offence: 1
            }
        );
        assert_eq!(left, 10 * S);
        assert_eq!(
            rec.strike(&r, t + 3 * S, 0).0,
            Strike::AlreadyBanned(Duration::from_secs(9))
        );
        assert_eq!(rec.offences, 1);
    }

    #[test]
    fn a_run_ends_after_its_window_and_counts_again_from_one() {
        let r = rules(3, 60, 10, 1000, 1000);
        let mut rec = Record::default();
        rec.strike(&r, S, 0);
        rec.strike(&r, 2 * S, 0);
        // The run opened at 1 s ends at 61 s.
        assert_eq!(rec.strike(&r, 61 * S, 0).0, Strike::Counted(1));
        assert_eq!(rec.strike(&r, 62 * S, 0).0, Strike::Counted(2));
    }

    #[test]
    fn offences_are_forgotten_after_the_quiet_period_not_before() {
        let r = rules(1, 60, 10, 1000, 100);
        let mut rec = Record::default();
        rec.strike(&r, S, 0); // banned until 11 s
                              // 1 ns before the quiet period ends: second offence, 20 s.
        let mut early = rec;
        assert!(matches!(
            early.strike(&r, 111 * S - 1, 0).0,
            Strike::Banned { offence: 2, .. }
        ));
        assert!(matches!(
            rec.strike(&r, 111 * S, 0).0,
            Strike::Banned { offence: 1, .. }
        ));
    }
}
