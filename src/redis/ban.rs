//! The penalty box on Redis: the scripts that check a ban, decide the quotas and count the
//! strike in one call, and the local cache of bans Redis has announced.
//!
//! * **One round trip.** With a penalty box, a decision is one `EVALSHA` of a script made of
//!   `ban.lua` around the quota script: the ban is checked first (a banned key's request
//!   consumes nothing), then the quotas decide, then a rejection counts as a strike and may
//!   ban (not for a dry-run layer, whose calls run the same script without the strike:
//!   `DRY_DECIDE`). The penalty state is a second Redis key, `<prefix>ban:<name length>:<name>:<key>`,
//!   which never has the name of a quota key (those start with a digit after the prefix).
//! * **Bans are cached, rejections are not.** A ban Redis announced is answered locally until
//!   it ends, for at most the store's `deny_cache_max_age` (so that a ban lost with Redis's
//!   state is not enforced longer than that). Quota rejections are *not* answered from the
//!   deny cache when a penalty box is on: each must reach Redis to count as a strike, so a
//!   key costs one round trip per rejected request until it is banned, and about one per
//!   `deny_cache_max_age` and instance while banned.
//! * **State loss.** A ban lives in Redis only: after a restart without persistence or a
//!   `FLUSHALL`, bans, strikes and offences are gone, and every instance serves the key again
//!   within `deny_cache_max_age`.

use std::hash::Hash;
use std::time::Duration;

use ::redis::Script;

use super::key::{guard_fixed_part, write_guarded, RedisKey, TagGuard};
use super::script::{
    ban_left, penalty_rules, with_penalty_args, Arg, DECIDE, DRY_DECIDE, MICRO, PARDON,
};
use super::store::RedisStore;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::keyed::{Absent, OnFull, Table};
use crate::observe::RedisMeter;
use crate::penalty::PenaltyBox;

/// A penalty box on Redis: where its state lives, its rules as script arguments, and the bans
/// this instance has seen.
pub(super) struct Penalty<K> {
    /// `<prefix>ban:<name length>:<name>:`, with an unclosed `{` closed.
    key_prefix: Box<[u8]>,
    tag_guard: TagGuard,
    /// strikes, within, ban, max_ban, forget_after (times in microseconds).
    rules: [u64; 5],
    bans: Option<BanCache<K>>,
    /// The script of a decision: [`DECIDE`], or for a dry run, whose quotas' refusals are no
    /// strikes, [`DRY_DECIDE`].
    script: &'static Script,
}

impl<K: RedisKey + Hash + Eq + Clone> Penalty<K> {
    /// Whether `p` can be decided on `store`.
    pub(super) fn check(p: &PenaltyBox, store: &RedisStore) -> Result<(), ConfigError> {
        p.validate()?;
        // The quota key and the penalty key go to one script call: on a cluster they
        // must share a slot, which only a hash tag in the prefix ensures.
        let prefix = &store.prefix;
        // Redis's rule: the bytes between the first `{` and the next `}`, if not empty.
        let tagged = prefix.iter().position(|&b| b == b'{').is_some_and(|open| {
            let rest = &prefix[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .is_some_and(|close| close > 0)
        });
        if store.is_cluster() && !tagged {
            return Err(ConfigError::InvalidPenaltyBox(
                "on Redis Cluster it needs a store prefix with a hash tag, e.g. \"app{1}:\"",
            ));
        }
        Ok(())
    }

    /// The penalty box `p` of the limiter whose keys are named after `scope`, caching bans
    /// for at most `max_age` ns; `strikes`: whether the quotas' refusals are strikes (not in
    /// a dry run).
    pub(super) fn new(
        p: &PenaltyBox,
        store: &RedisStore,
        scope: &str,
        max_age: u64,
        strikes: bool,
    ) -> Self {
        let mut prefix = store.prefix.to_vec();
        prefix.extend_from_slice(b"ban:");
        RedisKey::write_key(&scope.len(), &mut prefix);
        prefix.push(b':');
        prefix.extend_from_slice(scope.as_bytes());
        prefix.push(b':');
        let tag_guard = guard_fixed_part(&mut prefix);
        Penalty {
            key_prefix: prefix.into_boxed_slice(),
            tag_guard,
            rules: penalty_rules(p),
            bans: (store.deny_cache > 0 && max_age > 0)
                .then(|| BanCache::new(store.deny_cache, max_age)),
            script: if strikes { &DECIDE } else { &DRY_DECIDE },
        }
    }

    /// The script of a decision behind the ban.
    pub(super) fn script(&self) -> &'static Script {
        self.script
    }

    /// The Redis key of `key`'s penalty state.
    pub(super) fn key(&self, key: &K) -> Vec<u8> {
        let mut name = Vec::with_capacity(self.key_prefix.len() + 32);
        name.extend_from_slice(&self.key_prefix);
        write_guarded(&mut name, key, self.tag_guard);
        name
    }

    /// `args` followed by the penalty box's, with `time`.
    pub(super) fn args<'a>(&self, args: Vec<Arg<'a>>, time: Arg<'a>) -> Vec<Arg<'a>> {
        with_penalty_args(&self.rules, args, time)
    }

    /// The time until a retry of `key` is admitted at `now`, if this instance knows a ban.
    pub(super) fn known_ban(&self, key: &K, now: u64) -> Option<u64> {
        self.bans.as_ref()?.left(key, now)
    }

    /// Remembers the ban of `key` that Redis announced with `d` (its `reply`), for a request
    /// sent at `now`.
    pub(super) fn banned(&self, key: &K, now: u64, d: &Decision, reply: &[i64]) {
        if let Some(bans) = &self.bans {
            // Until the ban ends, not until the retry it told: from then on the quotas
            // decide, and may admit another request sooner.
            let wait = ns(d.retry_after());
            bans.remember(key, now, wait, ban_left(reply).unwrap_or(wait));
        }
    }

    /// Runs the penalty box alone (`script`: `STRIKE` or `PEEK`) for `key`, whose quota key is
    /// `quota_key`, at `now` sent as `time`; the ban left, `Some(0)` when not banned, `None`
    /// when Redis did not answer.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn only(
        &self,
        store: &RedisStore,
        meter: &RedisMeter,
        script: &Script,
        quota_key: &[u8],
        key: &K,
        now: u64,
        time: Arg<'_>,
    ) -> Option<u64> {
        let args = self.args(Vec::new(), time);
        let ban_key = self.key(key);
        // The quota key is never touched by these scripts; it is passed for the slot.
        let keys: [&[u8]; 2] = [quota_key, &ban_key];
        let reply = store.eval_script(script, &keys, &args, meter).await?;
        match reply.as_slice() {
            [3, left, ..] => {
                let left = u64::try_from(*left).ok()?.saturating_mul(MICRO);
                // The reply's wait may be later than the ban (the quotas that refused the
                // request that brought it); the callers ask how long the key is banned.
                let ban = ban_left(&reply).unwrap_or(left);
                if let Some(bans) = &self.bans {
                    bans.remember(key, now, left, ban);
                }
                Some(ban)
            }
            [_, _] => Some(0),
            _ => {
                store.bad_reply(meter);
                None
            }
        }
    }

    /// Lifts `key`'s ban and forgets its strikes and offences, in Redis and in this instance.
    pub(super) async fn pardon(&self, store: &RedisStore, meter: &RedisMeter, key: &K) {
        if let Some(bans) = &self.bans {
            bans.forget(key);
        }
        let _ = store
            .eval_script(&PARDON, &[&self.key(key)], &[], meter)
            .await;
    }
}

/// The time a decision says to wait, in ns.
fn ns(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A ban Redis announced, as this instance remembers it (limiter clock, ns).
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// When the ban ends: from then on the quotas decide.
    ends: u64,
    /// When a retry is admitted, as Redis said (the ban's end, or later when the quotas
    /// that refused the request that brought the ban admit it later).
    retry_at: u64,
    /// Until when the ban is answered without asking Redis.
    trusted_until: u64,
}

impl crate::keyed::Entry for Cached {
    fn idle_at(&self) -> u64 {
        self.trusted_until
    }
}

/// The bans this instance has seen Redis announce.
pub(crate) struct BanCache<K> {
    table: Table<K, Cached>,
    max_age: u64,
}

impl<K: Hash + Eq + Clone> BanCache<K> {
    pub(crate) fn new(max_entries: usize, max_age: u64) -> Self {
        BanCache {
            table: Table::new(max_entries, OnFull::RejectNewKeys),
            max_age,
        }
    }

    /// Nanoseconds until a retry of `key` is admitted at `now`, if a ban is known, still
    /// trusted and not over.
    pub(crate) fn left(&self, key: &K, now: u64) -> Option<u64> {
        let hash = self.table.hash(key);
        let c = self.table.get(hash, key, now, |c| *c)?;
        (now < c.trusted_until && now < c.ends).then(|| c.retry_at.max(c.ends) - now)
    }

    /// Remembers that Redis said `key` is banned for `ban` ns and a retry is admitted in
    /// `wait` ns, for a request sent at `sent_at` (never later than when Redis answered, so
    /// the ban is never thought to end later).
    ///
    /// A ban already known to last past `sent_at` keeps the later of the two retries: a
    /// reply about the ban alone (`ban_left`) does not know the quotas that refused the
    /// request that brought it, and must not shorten the retry that request was told.
    pub(crate) fn remember(&self, key: &K, sent_at: u64, wait: u64, ban: u64) {
        let left = ban.min(wait);
        let entry = Cached {
            ends: sent_at.saturating_add(left),
            retry_at: sent_at.saturating_add(wait),
            trusted_until: sent_at.saturating_add(left.min(self.max_age)),
        };
        let hash = self.table.hash(key);
        let _ = self.table.upsert(
            hash,
            key,
            false,
            || sent_at,
            |e, _| {
                let retry_at = if e.ends > sent_at {
                    entry.retry_at.max(e.retry_at)
                } else {
                    entry.retry_at
                };
                *e = Cached { retry_at, ..entry };
            },
            |_| Absent::Insert((), entry),
        );
    }

    /// Forgets what is known of `key`'s ban.
    pub(crate) fn forget(&self, key: &K) {
        let hash = self.table.hash(key);
        self.table.remove_if(hash, |k, _| k == key);
    }
}
