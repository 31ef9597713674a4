//! Rendering of `Retry-After`, `RateLimit-Policy` and `RateLimit` header fields
//! (draft-ietf-httpapi-ratelimit-headers-10), shared by every layer.
//!
//! Mapping of GCRA onto the draft's fields, per quota:
//!
//! | field | parameter | value |
//! |---|---|---|
//! | `RateLimit-Policy` | `q`, `w` | `q` requests per `w` seconds: the quota's rate, exactly (see below) |
//! | `RateLimit` | `r` | whole requests still admissible now |
//! | `RateLimit` | `t` | seconds until the quota is back to its full burst (rounded up) |
//!
//! `q` and `w` are chosen so that `q / w` is the rate the quota enforces, `count / period`,
//! wherever a whole number of seconds allows it ([`policy_window`]):
//!
//! 1. **Burst form.** When the burst period `burst × period / count` is a whole number of
//!    seconds, `q` = the burst and `w` = the burst period: an idle client may send `q` at once,
//!    and `q / w` is the rate (`per_second(10)`: `q=10;w=1`; `per_second(10).burst(20)`:
//!    `q=20;w=2`; `per_minute(7)`: `q=7;w=60`).
//! 2. **Rate form.** Otherwise, the smallest whole `w` for which `w × count / period` is whole,
//!    with `q` = that number (`per_second(100).burst(1)`: `q=100;w=1`; 7 per 1.5 s: `q=14;w=3`).
//!    `q / w` is still the rate, but `q` is not the burst: the client learns the rate, not how
//!    many it may send at once.
//! 3. **Approximation.** When no whole `w` up to 1000 periods gives a whole `q` (periods that are
//!    not a whole number of milliseconds, say), `w` = the period rounded up to whole seconds
//!    and `q` = the requests the quota admits in `w`, rounded down: the advertised rate is
//!    never above the enforced one, and short of it by less than one request per `w`.
//!
//! The emission interval `T` is rounded up to the nanosecond, so the rate a quota enforces is
//! never above `count / period` and short of it by at most 1 ns per request.
//!
//! Every integer is at most 15 digits, the most a structured-field integer may have (RFC 8941
//! §3.3.1): larger values are clamped to 999 999 999 999 999 ([`MAX_INTEGER`]), which only
//! ever understates a limit (a concurrency limit of 2^60, a shaping queue of `usize::MAX`) or a
//! wait (a `Retry-After` of more than 31 million years). Clamped policy items switch to the
//! rate form so that `q / w` stays the rate.
//!
//! A concurrency limit sends nothing unless named with
//! [`ConcurrencyLimitLayer::name`](crate::ConcurrencyLimitLayer::name); then
//! it is one `RateLimit-Policy` item with `q` = the most requests in flight,
//! `qu="concurrent-requests"` and no window.
//!
//! `Retry-After` is a whole number of seconds, rounded up and never `0` when the client must
//! wait (RFC 9110 §10.2.3).

use std::time::Duration;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderValue};

use crate::decision::Decision;
use crate::error::ConfigError;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");

/// [`RATELIMIT_POLICY`] as a constant: each use is a new name made at compile time, with no
/// clone to call (and drop) of the static's shared bytes.
const POLICY_NAME: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
/// [`RATELIMIT`] as a constant, for the same reason.
const RATELIMIT_NAME: http::HeaderName = http::HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit` (legacy, on request).
pub static X_RATELIMIT_LIMIT: http::HeaderName = http::HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (legacy, on request).
pub static X_RATELIMIT_REMAINING: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (legacy, on request).
pub static X_RATELIMIT_RESET: http::HeaderName = http::HeaderName::from_static("x-ratelimit-reset");

/// The largest integer a structured field may carry (RFC 8941 §3.3.1: at most 15 digits).
/// Every integer this crate writes into a header is clamped to it.
pub const MAX_INTEGER: u64 = 999_999_999_999_999;

/// The most bytes a name written into a header may have: quota, policy, tier and shaping
/// names. Four quotas with names this long still fit well within the 4-8 KiB header buffers
/// of common proxies.
pub const MAX_NAME_LEN: usize = 64;

/// Whole seconds, rounded up, saturating at `u64::MAX`.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `Retry-After` for a wait of `d`: whole seconds rounded up, at least 1.
pub fn retry_after_value(d: Duration) -> HeaderValue {
    // The usual short waits without an allocation: under a flood, rejections are the hot path.
    const SHORT: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    let secs = ceil_secs(d).clamp(1, MAX_INTEGER);
    if let Some(s) = usize::try_from(secs).ok().and_then(|i| SHORT.get(i)) {
        return HeaderValue::from_static(s);
    }
    // Longer waits repeat too (a flood against a long window gets the same wait for a whole
    // second): each thread keeps the last one it rendered.
    LAST_RETRY_AFTER.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((s, v)) = &*last {
            if *s == secs {
                return v.clone();
            }
        }
        let v = integer_value(secs);
        *last = Some((secs, v.clone()));
        v
    })
}

/// The header value of the integer `n`, clamped to [`MAX_INTEGER`].
pub(crate) fn integer_value(n: u64) -> HeaderValue {
    let mut buf = itoa_buf();
    HeaderValue::from_bytes(fmt_u64(n, &mut buf)).unwrap_or(HeaderValue::from_static("0"))
}

type ItoaBuf = [u8; 20];

fn itoa_buf() -> ItoaBuf {
    [0; 20]
}

/// The decimal digits of `n` clamped to [`MAX_INTEGER`], written at the end of `buf`.
fn fmt_u64(n: u64, buf: &mut ItoaBuf) -> &[u8] {
    let mut n = n.min(MAX_INTEGER);
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Checks that a name can be written as a structured-field string without escapes, in at
/// most [`MAX_NAME_LEN`] bytes.
pub(crate) fn check_name(name: &str) -> Result<(), ConfigError> {
    if name.len() > MAX_NAME_LEN {
        return Err(ConfigError::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidName(name.to_owned()))
    }
}

/// Appends a layer's items to the `RateLimit-Policy` field and, when given, to `RateLimit`,
/// keeping the items other layers (or the handler) put there: both fields are lists.
///
/// Two items of one name cannot be told apart by a client (two stacked layers both named
/// `"api"`). Layers do not know what they are stacked with when they are built, so the first
/// response that shows such a pair is logged at WARN, naming it, once per process; after that
/// nothing more is checked.
pub(crate) fn append_fields(
    headers: &mut HeaderMap,
    policy: HeaderValue,
    ratelimit: Option<HeaderValue>,
) {
    // `append` says whether the field was there already, hashing the name once, as for
    // `RateLimit`; only then are its earlier items read, for a name shared with the new one.
    let existed = headers.append(POLICY_NAME, policy);
    if existed && !DUPLICATE_WARNED.load(Ordering::Relaxed) {
        find_duplicate(headers);
    }
    if let Some(ratelimit) = ratelimit {
        headers.append(RATELIMIT_NAME, ratelimit);
    }
}

/// Logs an item name of the last `RateLimit-Policy` value (the one just appended) that an
/// earlier value of the field has too.
#[cold]
#[inline(never)]
fn find_duplicate(headers: &HeaderMap) {
    if let Some(name) = last_value_duplicate(headers) {
        warn_duplicate(&name);
    }
}

/// An item name of the last `RateLimit-Policy` value of `headers` that an earlier value has
/// too. The values are read from both ends: the last one taken, the others are the earlier
/// ones, without counting them first.
fn last_value_duplicate(headers: &HeaderMap) -> Option<Vec<u8>> {
    let mut values = headers.get_all(POLICY_NAME).into_iter();
    let added = values.next_back()?;
    duplicate(values, added)
}

/// An item name of `added` (a `RateLimit-Policy` value) that one of the `earlier` values has
/// too.
///
/// Stacked layers append the same values to every response, so a pair of values found
/// without a common name is remembered (on this thread, the last [`CLEAN_PAIRS`]) and not
/// read again. The pairs hold their values: a value at the same address, of the same length,
/// is the same bytes.
fn duplicate<'v>(
    earlier: impl Iterator<Item = &'v HeaderValue>,
    added: &HeaderValue,
) -> Option<Vec<u8>> {
    CLEAN.with(|clean| {
        let mut clean = clean.borrow_mut();
        for v in earlier {
            let known = clean
                .iter()
                .flatten()
                .any(|(a, b)| same_value(a, v) && same_value(b, added));
            if known {
                continue;
            }
            let twice =
                PolicyNames(v.as_bytes()).find(|n| PolicyNames(added.as_bytes()).any(|m| m == *n));
            if let Some(name) = twice {
                return Some(name.to_vec());
            }
            clean.rotate_right(1);
            clean[0] = Some((v.clone(), added.clone()));
        }
        None
    })
}

/// Whether `a` and `b` are views of the same bytes.
fn same_value(a: &HeaderValue, b: &HeaderValue) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

/// How many pairs of `RateLimit-Policy` values each thread remembers as sharing no name.
const CLEAN_PAIRS: usize = 4;

thread_local! {
    /// The last pairs of `RateLimit-Policy` values (an earlier one, the one added after it)
    /// found to share no item name, most recent first.
    static CLEAN: RefCell<[Option<(HeaderValue, HeaderValue)>; CLEAN_PAIRS]> =
        const { RefCell::new([const { None }; CLEAN_PAIRS]) };
}

/// Whether a duplicate item name has been logged.
static DUPLICATE_WARNED: AtomicBool = AtomicBool::new(false);

/// Logs, once per process, that `name` names two items of one response's `RateLimit-Policy`.
#[cold]
#[inline(never)]
fn warn_duplicate(name: &[u8]) {
    if !DUPLICATE_WARNED.swap(true, Ordering::Relaxed) {
        let name = String::from_utf8_lossy(name);
        tracing::warn!(
            name = %name,
            "tollgate: RateLimit-Policy lists two items named {name:?} on one response, which \
             a client cannot tell apart: give the layers on one route different names \
             (`Policy::new(name, ..)`, `Quota::named`, `.name(name)`) (logged once)"
        );
    }
}

/// The item names of a `RateLimit-Policy` value, `"a";q=1;w=1, "b";q=2;qu="x"` giving `a`
/// then `b`; it stops at anything it cannot read (a handler may put anything there).
struct PolicyNames<'a>(&'a [u8]);

impl<'a> Iterator for PolicyNames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        // An item: a quoted name, then parameters `;key=value`, values tokens or quoted.
        let rest = self.0.trim_ascii_start().strip_prefix(b"\"")?;
        let end = rest.iter().position(|&b| b == b'"')?;
        let (name, mut rest) = (&rest[..end], &rest[end + 1..]);
        while let Some(param) = rest.strip_prefix(b";") {
            let eq = param.iter().position(|&b| b == b'=')?;
            let value = &param[eq + 1..];
            rest = match value.strip_prefix(b"\"") {
                Some(quoted) => &quoted[quoted.iter().position(|&b| b == b'"')? + 1..],
                None => {
                    let end = value.iter().position(|&b| b == b';' || b == b',');
                    &value[end.unwrap_or(value.len())..]
                }
            };
        }
        self.0 = match rest.strip_prefix(b",") {
            Some(next) => next,
            None => &[],
        };
        Some(name)
    }
}

/// A `RateLimit-Policy` item for a limit on concurrent requests:
/// `"name";q=max;qu="concurrent-requests"` (no window: the quota is not spent over time).
///
/// `q` is clamped to [`MAX_INTEGER`].
pub(crate) fn concurrency_policy(name: &str, max: usize) -> HeaderValue {
    let q = u64::try_from(max).unwrap_or(u64::MAX).min(MAX_INTEGER);
    let s = format!("\"{name}\";q={q};qu=\"concurrent-requests\"");
    HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static(""))
}

/// `(q, w)` of a `RateLimit-Policy` item for `burst` requests at once and a rate of `count`
/// per `period`, chosen so that `q / w` is the rate (see the [module docs](self) for the
/// three forms). Both are at least 1 and at most [`MAX_INTEGER`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::headers::policy_window;
///
/// let s = Duration::from_secs;
/// assert_eq!(policy_window(3, 3, s(1)), (3, 1));
/// assert_eq!(policy_window(7, 7, s(60)), (7, 60));
/// assert_eq!(policy_window(1, 100, s(1)), (100, 1));
/// ```
pub fn policy_window(burst: u64, count: u32, period: Duration) -> (u64, u64) {
    const NS: u128 = 1_000_000_000;
    let max = u128::from(MAX_INTEGER);
    let p = period.as_nanos().max(1);
    let c = u128::from(count.max(1));
    let b = u128::from(burst.max(1));
    let per_sec = c * NS; // count × 1 s, so that `x s × count / period` = `x × per_sec / p`
                          // 1. The burst form: the burst period is whole seconds.
    if let Some(bp) = b.checked_mul(p) {
        if bp % per_sec == 0 {
            let w = bp / per_sec;
            if (1..=max).contains(&w) && b <= max {
                return (b as u64, w as u64);
            }
        }
    }
    // 2. The rate form: the smallest whole `w` with a whole `q = w × count / period`.
    let g = gcd(p, per_sec);
    let (w, q) = (p / g, per_sec / g);
    let period_secs = p.div_ceil(NS);
    if w <= period_secs.saturating_mul(1000) && w <= max && q <= max {
        return (q as u64, w as u64);
    }
    // 3. An approximation that never overstates the rate.
    let w = period_secs.clamp(1, max);
    let q = (w.saturating_mul(per_sec) / p).clamp(1, max);
    (q as u64, w as u64)
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` fields of one decision: the
/// burst, the requests remaining and the seconds until reset of its
/// [most restrictive](Decision::most_restrictive) quota, so the three numbers always describe
/// the same quota.
///
/// The legacy fields hold one value each, so stacked layers cannot all write theirs: a layer
/// replaces the triple already on a response only when its own is more restrictive (fewer
/// requests remaining, or as few and a longer reset). A response therefore describes the quota,
/// across every layer, that will turn the client away first, whichever layer made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Legacy {
    limit: u64,
    remaining: u64,
    reset: u64,
}

impl Legacy {
    /// The triple of `d`.
    pub(crate) fn of(d: &Decision) -> Self {
        let (limit, remaining, reset) = match d.most_restrictive() {
            Some(s) => (s.limit(), s.remaining(), ceil_secs(s.reset_after())),
            None => (d.limit(), d.remaining(), 0),
        };
        Legacy {
            limit: limit.min(MAX_INTEGER),
            remaining: remaining.min(MAX_INTEGER),
            reset: reset.min(MAX_INTEGER),
        }
    }

    /// Writes the triple into `headers`, unless the triple already there is as restrictive.
    pub(crate) fn apply(self, headers: &mut http::HeaderMap) {
        let read = |name: &http::HeaderName| -> Option<u64> {
            std::str::from_utf8(headers.get(name)?.as_bytes())
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        if let (Some(remaining), Some(reset)) =
            (read(&X_RATELIMIT_REMAINING), read(&X_RATELIMIT_RESET))
        {
            let theirs = (remaining, std::cmp::Reverse(reset));
            if theirs <= (self.remaining, std::cmp::Reverse(self.reset)) {
                return;
            }
        }
        headers.insert(X_RATELIMIT_LIMIT.clone(), integer_value(self.limit));
        headers.insert(X_RATELIMIT_REMAINING.clone(), integer_value(self.remaining));
        headers.insert(X_RATELIMIT_RESET.clone(), integer_value(self.reset));
    }
}

/// Slots of each thread's cache of rendered `RateLimit` values. A policy always uses the slot
/// its id picks, so that a few layers or tiers answering on one thread (a stack of layers, the
/// tiers of one layer) keep their own last value instead of evicting each other's.
const SLOTS: usize = 8;

/// The most quotas of a policy whose `RateLimit` value is cached; more are rendered each time.
const CACHED_QUOTAS: usize = 4;

/// What a rendered `RateLimit` value says: the policy and, per quota, (remaining, seconds
/// until reset). Quotas beyond `len` are zero.
#[derive(Clone, Copy)]
struct RenderedKey {
    id: u64,
    len: usize,
    items: [(u64, u64); CACHED_QUOTAS],
}

impl RenderedKey {
    /// The key of `items` for the policy `id`, clamped as rendered (so values past the largest
    /// integer share one entry); `None` when there are more items than the cache holds.
    #[inline]
    fn of(id: u64, items: impl Iterator<Item = (u64, Duration)>) -> Option<Self> {
        let mut key = RenderedKey {
            id,
            len: 0,
            items: [(0, 0); CACHED_QUOTAS],
        };
        for (remaining, reset) in items {
            let slot = key.items.get_mut(key.len)?;
            *slot = Self::item(remaining, reset);
            key.len += 1;
        }
        Some(key)
    }

    /// One item as the key holds it: clamped as rendered, the reset in whole seconds.
    #[inline]
    fn item(remaining: u64, reset: Duration) -> (u64, u64) {
        (
            remaining.min(MAX_INTEGER),
            ceil_secs(reset).min(MAX_INTEGER),
        )
    }

    /// Whether this is the key of `items` for the policy `id` ([`RenderedKey::of`]), read
    /// without building that key: the repeated answer, the common one, copies nothing.
    #[inline]
    fn matches(&self, id: u64, items: impl Iterator<Item = (u64, Duration)>) -> bool {
        if self.id != id {
            return false;
        }
        let mut len = 0;
        for (remaining, reset) in items {
            let Some(&(r, t)) = self.items[..self.len].get(len) else {
                return false;
            };
            if (r, t) != Self::item(remaining, reset) {
                return false;
            }
            len += 1;
        }
        len == self.len
    }

    /// The slot of this thread's cache that holds the last values of the policy `id`.
    #[inline]
    fn slot(id: u64) -> usize {
        (id % SLOTS as u64) as usize
    }
}

/// A slot of the cache: the key, and the `RateLimit-Policy` and `RateLimit` values for it.
type Cached = Option<(RenderedKey, HeaderValue, HeaderValue)>;

thread_local! {
    /// The last field values handed out on this thread, per slot.
    static LAST_FIELDS: RefCell<[Cached; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
    /// The last `Retry-After` value of 10 seconds or more rendered on this thread.
    static LAST_RETRY_AFTER: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
}

/// The `RateLimit-Policy` and `RateLimit` values of the policy whose id is `id`, for `items`
/// of (remaining, time until reset) in policy order.
///
/// Under a flood one key gets the same answer again and again (`r=0`, the same `t`), and a
/// key far from its limit gets `r` = burst - 1 each time: each thread keeps the last values
/// it handed out for each policy and hands out clones of them (reference counts, no
/// allocation, no formatting). Only when they are not there are the policy's headers asked
/// for (`headers`, which may load them): a policy replaced since `id` was read renders the
/// new policy's values, not cached under the old id.
pub(crate) fn fields<I, H>(
    id: u64,
    items: I,
    headers: impl FnOnce() -> H,
) -> (HeaderValue, HeaderValue)
where
    I: Iterator<Item = (u64, Duration)> + Clone,
    H: std::ops::Deref<Target = PolicyHeaders>,
{
    LAST_FIELDS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let slot = &mut cache[RenderedKey::slot(id)];
        if let Some((k, policy, ratelimit)) = &*slot {
            if k.matches(id, items.clone()) {
                return (policy.clone(), ratelimit.clone());
            }
        }
        let Some(key) = RenderedKey::of(id, items.clone()) else {
            let h = headers();
            return (h.policy(), h.render(items.map(|(r, t)| (r, ceil_secs(t)))));
        };
        let h = headers();
        let ratelimit = h.render(key.items[..key.len].iter().copied());
        if h.id == id {
            *slot = Some((key, h.policy(), ratelimit.clone()));
        }
        (h.policy(), ratelimit)
    })
}

/// The static part of a policy's headers: names and the `RateLimit-Policy` value.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHeaders {
    /// Unique per policy, so a cached value is never taken for another policy's.
    id: u64,
    /// Per quota, `"name";r=` ready to copy.
    prefixes: Box<[Box<[u8]>]>,
    policy: HeaderValue,
}

impl PolicyHeaders {
    /// `items` holds, per quota, its name, burst, count and period (see [`policy_window`]).
    pub(crate) fn new(items: &[(String, u64, u32, Duration)], extra: Option<&str>) -> Self {
        let mut s = String::new();
        for (i, (name, burst, count, period)) in items.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let (q, w) = policy_window(*burst, *count, *period);
            s.push_str(&format!("\"{name}\";q={q};w={w}"));
            if let Some(extra) = extra {
                s.push_str(extra);
            }
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        PolicyHeaders {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            prefixes: items
                .iter()
                .map(|(n, _, _, _)| format!("\"{n}\";r=").into_bytes().into())
                .collect(),
            policy: HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("")),
        }
    }

    /// The `RateLimit-Policy` value (built once).
    pub(crate) fn policy(&self) -> HeaderValue {
        self.policy.clone()
    }

    /// The slot of each thread's cache that holds this policy's last values.
    #[cfg(test)]
    fn slot(&self) -> usize {
        (self.id % SLOTS as u64) as usize
    }

    /// The id of this policy's values in each thread's cache ([`fields`]).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The `RateLimit` value for items of (remaining, time until reset), in policy order,
    /// from this thread's cache when it repeats (see [`fields`]).
    pub(crate) fn ratelimit_items(
        &self,
        items: impl Iterator<Item = (u64, Duration)> + Clone,
    ) -> HeaderValue {
        fields(self.id, items, || self).1
    }

    /// Renders items of (remaining, seconds until reset), in policy order.
    fn render(&self, items: impl Iterator<Item = (u64, u64)>) -> HeaderValue {
        let mut out = BytesMut::with_capacity(40 * self.prefixes.len());
        let mut buf = itoa_buf();
        for (i, (prefix, (remaining, reset_secs))) in self.prefixes.iter().zip(items).enumerate() {
            if i > 0 {
                out.put_slice(b", ");
            }
            out.put_slice(prefix);
            out.put_slice(fmt_u64(remaining, &mut buf));
            out.put_slice(b";t=");
            out.put_slice(fmt_u64(reset_secs, &mut buf));
        }
        HeaderValue::from_maybe_shared(out.freeze()).unwrap_or(HeaderValue::from_static(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(value: &str) -> Vec<&str> {
        PolicyNames(value.as_bytes())
            .map(|n| std::str::from_utf8(n).unwrap())
            .collect()
    }

    #[test]
    fn policy_item_names_are_read_past_every_parameter() {
        assert_eq!(names(r#""api";q=10;w=1"#), ["api"]);
        assert_eq!(
            names(r#""a, b";q=20;w=2, "daily";q=10000;w=86400,"c""#),
            ["a, b", "daily", "c"]
        );
        // A quoted parameter value, with a comma and a quote-free name inside it.
        assert_eq!(
            names(r#""workers";q=8;qu="concurrent-requests", "api";q=1;w=1"#),
            ["workers", "api"]
        );
        assert_eq!(names(r#""x";qu="a, \"y\"""#).first(), Some(&"x"));
    }

    #[test]
    fn policy_item_names_stop_at_what_cannot_be_read() {
        assert!(names("").is_empty());
        assert!(names("api;q=1").is_empty());
        assert_eq!(names(r#""api";q=1, garbage, "b";q=2"#), ["api"]);
        assert!(names(r#""unterminated;q=1"#).is_empty());
        assert_eq!(names(r#""a";q"#), Vec::<&str>::new());
    }

    #[test]
    fn a_pair_of_policy_values_found_clean_is_remembered_and_a_duplicate_after_it_is_still_found() {
        let api = HeaderValue::from_static(r#""api";q=10;w=1"#);
        let db = HeaderValue::from_static(r#""db";q=8;qu="concurrent-requests""#);
        let api_again = HeaderValue::from_static(r#""db2";q=1, "api";q=5;w=1"#);
        for _ in 0..3 {
            assert_eq!(duplicate([&api].into_iter(), &db), None);
        }
        let known = CLEAN.with(|c| {
            c.borrow()
                .iter()
                .flatten()
                .filter(|(a, b)| same_value(a, &api) && same_value(b, &db))
                .count()
        });
        assert_eq!(known, 1);
        // The same earlier value with another one added: read, and its name found.
        assert_eq!(
            duplicate([&api, &db].into_iter(), &api_again),
            Some(b"api".to_vec())
        );
        // Equal bytes at another address are read again, never taken for a remembered value.
        let db1 = HeaderValue::from_str(r#""db";q=1"#).unwrap();
        let db2 = HeaderValue::from_str(r#""db";q=2"#).unwrap();
        assert_eq!(duplicate([&db1].into_iter(), &db2), Some(b"db".to_vec()));
    }

    #[test]
    fn a_second_item_of_one_name_is_found_and_the_field_keeps_both() {
        let mut headers = HeaderMap::new();
        let value = |s: &'static str| HeaderValue::from_static(s);
        append_fields(
            &mut headers,
            value(r#""api";q=10;w=1"#),
            Some(value(r#""api";r=9;t=1"#)),
        );
        append_fields(
            &mut headers,
            value(r#""db";q=8;qu="concurrent-requests""#),
            None,
        );
        append_fields(
            &mut headers,
            value(r#""api";q=5;w=1"#),
            Some(value(r#""api";r=4;t=1"#)),
        );
        let policy: Vec<_> = headers.get_all(&RATELIMIT_POLICY).iter().collect();
        assert_eq!(policy.len(), 3);
        assert_eq!(headers.get_all(&RATELIMIT).iter().count(), 2);
        assert!(DUPLICATE_WARNED.load(Ordering::Relaxed));
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_value(Duration::from_nanos(1)), "1");
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_millis(1000)), "1");
        assert_eq!(retry_after_value(Duration::from_millis(1001)), "2");
        assert_eq!(retry_after_value(Duration::from_secs(9)), "9");
        assert_eq!(retry_after_value(Duration::from_millis(9001)), "10");
        assert_eq!(retry_after_value(Duration::from_secs(86_400)), "86400");
    }

    #[test]
    fn integers_render_exactly_up_to_fifteen_digits() {
        for n in [0u64, 7, 10, 99, 100, 12345, MAX_INTEGER] {
            assert_eq!(integer_value(n), n.to_string().as_str());
        }
        for n in [MAX_INTEGER + 1, u64::MAX] {
            assert_eq!(integer_value(n), "999999999999999");
        }
    }

    #[test]
    fn durations_at_max_saturate() {
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
        assert_eq!(retry_after_value(Duration::MAX), "999999999999999");
        assert_eq!(
            retry_after_value(Duration::from_secs(MAX_INTEGER + 7)),
            "999999999999999"
        );
    }

    #[test]
    fn a_legacy_triple_replaces_only_a_less_restrictive_one() {
        let triple = |l, r, t| Legacy {
            limit: l,
            remaining: r,
            reset: t,
        };
        let read = |h: &http::HeaderMap| {
            [
                &X_RATELIMIT_LIMIT,
                &X_RATELIMIT_REMAINING,
                &X_RATELIMIT_RESET,
            ]
            .map(|n| h.get(n).unwrap().to_str().unwrap().to_owned())
        };
        let mut h = http::HeaderMap::new();
        triple(2, 0, 60).apply(&mut h);
        triple(1000, 997, 1).apply(&mut h);
        assert_eq!(read(&h), ["2", "0", "60"]);
        // As few remaining and a longer reset: more restrictive.
        triple(5, 0, 61).apply(&mut h);
        assert_eq!(read(&h), ["5", "0", "61"]);
        // A tie keeps the one already there (the inner layer's).
        triple(9, 0, 61).apply(&mut h);
        assert_eq!(read(&h), ["5", "0", "61"]);
        // A triple the crate cannot read is replaced.
        h.insert(&X_RATELIMIT_REMAINING, HeaderValue::from_static("junk"));
        triple(1000, 997, 1).apply(&mut h);
        assert_eq!(read(&h), ["1000", "997", "1"]);
    }

    #[test]
    fn concurrency_policy_item_has_quota_unit_and_no_window() {
        assert_eq!(
            concurrency_policy("workers", 8),
            r#""workers";q=8;qu="concurrent-requests""#
        );
    }

    #[test]
    fn the_cached_ratelimit_value_never_crosses_policies_or_values() {
        let one = |name: &str| {
            PolicyHeaders::new(&[(name.to_owned(), 5, 1, Duration::from_secs(1))], None)
        };
        let (a, b) = (one("a"), one("b"));
        let s = Duration::from_secs;
        let item = |r, t| std::iter::once((r, t));
        assert_eq!(a.ratelimit_items(item(0, s(5))), "\"a\";r=0;t=5");
        assert_eq!(a.ratelimit_items(item(0, s(5))), "\"a\";r=0;t=5");
        assert_eq!(b.ratelimit_items(item(0, s(5))), "\"b\";r=0;t=5");
        assert_eq!(b.ratelimit_items(item(1, s(5))), "\"b\";r=1;t=5");
        assert_eq!(
            b.ratelimit_items(item(1, Duration::from_millis(4001))),
            "\"b\";r=1;t=5"
        );
        assert_eq!(b.ratelimit_items(item(1, s(4))), "\"b\";r=1;t=4");
        drop(a);
        // A new policy, perhaps at the old one's address, renders its own name.
        let c = one("c");
        assert_eq!(c.ratelimit_items(item(0, s(5))), "\"c\";r=0;t=5");
    }

    fn policy(quotas: &[(&str, u64)]) -> PolicyHeaders {
        let items: Vec<_> = quotas
            .iter()
            .map(|(n, q)| ((*n).to_owned(), *q, 1, Duration::from_secs(1)))
            .collect();
        PolicyHeaders::new(&items, None)
    }

    /// A value handed out from the cache is the very bytes rendered before.
    fn same_bytes(a: &HeaderValue, b: &HeaderValue) -> bool {
        a.as_bytes().as_ptr() == b.as_bytes().as_ptr()
    }

    #[test]
    fn stacked_policies_on_one_thread_keep_their_own_cached_value() {
        let a = policy(&[("a", 5)]);
        // Another policy on another slot (ids are shared with tests running alongside).
        let b = (0..4 * SLOTS)
            .map(|_| policy(&[("b", 5)]))
            .find(|b| b.slot() != a.slot())
            .unwrap();
        let item = || std::iter::once((4, Duration::from_secs(5)));
        let first_a = a.ratelimit_items(item());
        let first_b = b.ratelimit_items(item());
        assert_eq!(first_a, "\"a\";r=4;t=5");
        assert_eq!(first_b, "\"b\";r=4;t=5");
        for _ in 0..3 {
            assert!(same_bytes(&a.ratelimit_items(item()), &first_a));
            assert!(same_bytes(&b.ratelimit_items(item()), &first_b));
        }
    }

    #[test]
    fn policies_sharing_a_slot_never_answer_with_each_others_value() {
        let a = policy(&[("a", 5)]);
        let b = (0..64 * SLOTS)
            .map(|_| policy(&[("b", 5)]))
            .find(|b| b.slot() == a.slot())
            .unwrap();
        let item = || std::iter::once((0, Duration::from_secs(5)));
        for _ in 0..3 {
            assert_eq!(a.ratelimit_items(item()), "\"a\";r=0;t=5");
            assert_eq!(b.ratelimit_items(item()), "\"b\";r=0;t=5");
        }
    }

    #[test]
    fn a_multi_quota_value_is_cached_and_follows_every_quota() {
        let p = policy(&[("burst", 10), ("hour", 3600)]);
        let s = Duration::from_secs;
        let first = p.ratelimit_items([(9, s(1)), (3599, s(3600))].into_iter());
        assert_eq!(first, "\"burst\";r=9;t=1, \"hour\";r=3599;t=3600");
        let again = p.ratelimit_items([(9, s(1)), (3599, s(3600))].into_iter());
        assert!(same_bytes(&first, &again));
        // Only the second quota moved.
        assert_eq!(
            p.ratelimit_items([(9, s(1)), (3598, s(3600))].into_iter()),
            "\"burst\";r=9;t=1, \"hour\";r=3598;t=3600"
        );
        assert_eq!(
            p.ratelimit_items([(9, s(1)), (3598, Duration::from_millis(3_599_001))].into_iter()),
            "\"burst\";r=9;t=1, \"hour\";r=3598;t=3600"
        );
        assert_eq!(
            p.ratelimit_items([(9, s(1)), (3598, s(3599))].into_iter()),
            "\"burst\";r=9;t=1, \"hour\";r=3598;t=3599"
        );
    }

    #[test]
    fn a_cached_value_is_never_taken_for_fewer_or_more_items_of_its_policy() {
        let p = policy(&[("burst", 10), ("hour", 3600)]);
        let s = Duration::from_secs;
        let both = p.ratelimit_items([(9, s(1)), (3599, s(3600))].into_iter());
        assert_eq!(both, "\"burst\";r=9;t=1, \"hour\";r=3599;t=3600");
        // The first item alone is a prefix of the cached key, not that key.
        let first = p.ratelimit_items(std::iter::once((9, s(1))));
        assert_eq!(first, "\"burst\";r=9;t=1");
        assert!(!same_bytes(&first, &both));
        // Back to both items: the value of the one item is not taken for them.
        let again = p.ratelimit_items([(9, s(1)), (3599, s(3600))].into_iter());
        assert_eq!(again, "\"burst\";r=9;t=1, \"hour\";r=3599;t=3600");
        assert!(!same_bytes(&again, &first));
        assert_eq!(p.ratelimit_items(std::iter::empty()), "");
        assert_eq!(
            p.ratelimit_items([(9, s(1)), (3599, s(3600))].into_iter()),
            "\"burst\";r=9;t=1, \"hour\";r=3599;t=3600"
        );
    }

    mod cache_model {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Against the model of reading every item name of every value: whatever pairs
            /// this thread found clean before (the same values appended again, in another
            /// order, under others), a name the last value shares with an earlier one is
            /// found, and none is found where there is none.
            #[test]
            fn a_name_the_last_policy_value_shares_with_an_earlier_one_is_always_found(
                seq in proptest::collection::vec(
                    proptest::collection::vec(0usize..6, 1..5),
                    1..40,
                )
            ) {
                // Six values, each appended as the same bytes at the same address every time,
                // as a layer appends its own: names drawn from a few, so that some share one.
                let texts = [
                    r#""a";q=1;w=1"#,
                    r#""b";q=2;w=1, "c";q=3;w=1"#,
                    r#""c";q=1;qu="concurrent-requests""#,
                    r#""d";q=1;w=1"#,
                    r#""e";q=1;w=1, "a";q=9;w=9"#,
                    r#""f";q=1;w=1"#,
                ];
                let values: Vec<HeaderValue> =
                    texts.iter().map(|t| HeaderValue::from_static(t)).collect();
                let names = |v: &HeaderValue| -> Vec<Vec<u8>> {
                    PolicyNames(v.as_bytes()).map(<[u8]>::to_vec).collect()
                };
                for stack in seq {
                    let mut headers = HeaderMap::new();
                    for &i in &stack {
                        headers.append(POLICY_NAME, values[i].clone());
                    }
                    let (last, earlier) = stack.split_last().expect("not empty");
                    let added = names(&values[*last]);
                    let shared = earlier
                        .iter()
                        .any(|&i| names(&values[i]).iter().any(|n| added.contains(n)));
                    let found = last_value_duplicate(&headers);
                    prop_assert_eq!(found.is_some(), shared, "stack {:?}", stack);
                    if let Some(name) = found {
                        prop_assert!(added.contains(&name));
                    }
                }
            }

            /// Against the model of no cache at all: whatever came before on this thread (more
            /// items or fewer, a prefix, more than the cache holds, values that repeat), the
            /// value handed out is the one rendered for the items asked.
            #[test]
            fn the_cached_value_is_always_the_value_rendered_for_the_items(
                seq in proptest::collection::vec(
                    proptest::collection::vec((0u64..3, 0u64..4), 0..6),
                    1..40,
                )
            ) {
                let p = policy(&[("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)]);
                for items in seq {
                    let items: Vec<(u64, Duration)> = items
                        .iter()
                        .map(|&(r, t)| (r, Duration::from_millis(t * 700)))
                        .collect();
                    let got = p.ratelimit_items(items.iter().copied());
                    let want = p.render(items.iter().map(|&(r, t)| (r, ceil_secs(t))));
                    prop_assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn more_quotas_than_the_cache_holds_render_every_value() {
        let names = ["a", "b", "c", "d", "e"];
        let quotas: Vec<_> = names.iter().map(|n| (*n, 1)).collect();
        let p = policy(&quotas);
        let s = Duration::from_secs;
        let items = |last| [(0, s(1)), (0, s(1)), (0, s(1)), (0, s(1)), (last, s(1))];
        let want = |last: u64| {
            let mut v: Vec<String> = names[..4]
                .iter()
                .map(|n| format!("\"{n}\";r=0;t=1"))
                .collect();
            v.push(format!("\"e\";r={last};t=1"));
            v.join(", ")
        };
        assert_eq!(p.ratelimit_items(items(0).into_iter()), want(0).as_str());
        assert_eq!(p.ratelimit_items(items(1).into_iter()), want(1).as_str());
        assert_eq!(p.ratelimit_items(items(0).into_iter()), want(0).as_str());
    }

    #[test]
    fn numeric_edges_of_the_cached_value() {
        let p = policy(&[("p", 1)]);
        let item = |r, t| std::iter::once((r, t));
        assert_eq!(p.ratelimit_items(item(0, Duration::ZERO)), "\"p\";r=0;t=0");
        assert_eq!(
            p.ratelimit_items(item(0, Duration::from_nanos(1))),
            "\"p\";r=0;t=1"
        );
        // Clamped to fifteen digits, and cached as clamped: every value past the largest
        // integer is the one rendered value.
        let max = p.ratelimit_items(item(u64::MAX, Duration::MAX));
        assert_eq!(max, "\"p\";r=999999999999999;t=999999999999999");
        let past = p.ratelimit_items(item(MAX_INTEGER + 1, Duration::from_secs(MAX_INTEGER + 1)));
        assert!(same_bytes(&max, &past));
        assert_eq!(p.ratelimit_items(item(0, Duration::ZERO)), "\"p\";r=0;t=0");
        assert_eq!(p.ratelimit_items(std::iter::empty()), "");
    }

    #[test]
    fn repeated_fields_come_from_the_cache_without_asking_for_the_policy() {
        let p = policy(&[("p", 5)]);
        let item = || std::iter::once((3, Duration::from_secs(2)));
        let asked = std::cell::Cell::new(0);
        let headers = || {
            asked.set(asked.get() + 1);
            &p
        };
        let (policy_value, first) = fields(p.id(), item(), headers);
        assert_eq!(policy_value, "\"p\";q=5;w=5");
        assert_eq!(first, "\"p\";r=3;t=2");
        let (again_policy, again) = fields(p.id(), item(), headers);
        assert!(same_bytes(&again, &first));
        assert_eq!(again_policy, policy_value);
        assert_eq!(asked.get(), 1);
        // Another answer asks again.
        let other = fields(
            p.id(),
            std::iter::once((2, Duration::from_secs(2))),
            headers,
        );
        assert_eq!(other.1, "\"p\";r=2;t=2");
        assert_eq!(asked.get(), 2);
    }

    #[test]
    fn a_policy_replaced_after_its_id_was_read_answers_with_the_new_policy() {
        let old = policy(&[("old", 5)]);
        let new = policy(&[("new", 7)]);
        let text = |(p, r): (HeaderValue, HeaderValue)| {
            (
                p.to_str().unwrap().to_owned(),
                r.to_str().unwrap().to_owned(),
            )
        };
        let want = |p: &str, r: &str| (p.to_owned(), r.to_owned());
        let item = || std::iter::once((0, Duration::from_secs(5)));
        // The id read before the replacement, the headers loaded after it.
        assert_eq!(
            text(fields(old.id(), item(), || &new)),
            want("\"new\";q=7;w=7", "\"new\";r=0;t=5")
        );
        // Not cached under the old id: the old policy still answers as itself.
        assert_eq!(
            text(fields(old.id(), item(), || &old)),
            want("\"old\";q=5;w=5", "\"old\";r=0;t=5")
        );
        assert_eq!(
            text(fields(new.id(), item(), || &new)),
            want("\"new\";q=7;w=7", "\"new\";r=0;t=5")
        );
        assert_eq!(
            text(fields(old.id(), item(), || &old)),
            want("\"old\";q=5;w=5", "\"old\";r=0;t=5")
        );
    }

    #[test]
    fn a_repeated_long_retry_after_is_the_value_rendered_before() {
        let first = retry_after_value(Duration::from_secs(86_400));
        assert_eq!(first, "86400");
        let again = retry_after_value(Duration::from_millis(86_399_001));
        assert!(same_bytes(&first, &again));
        assert_eq!(retry_after_value(Duration::from_secs(86_399)), "86399");
        assert_eq!(retry_after_value(Duration::from_secs(3)), "3");
        assert_eq!(retry_after_value(Duration::from_secs(86_400)), "86400");
        assert_eq!(retry_after_value(Duration::from_secs(10)), "10");
    }

    #[test]
    fn names_must_be_plain_printable_ascii() {
        assert!(check_name("per-ip").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\"b").is_err());
        assert!(check_name("a\\b").is_err());
        assert!(check_name("é").is_err());
        assert!(check_name(&"n".repeat(MAX_NAME_LEN)).is_ok());
        assert_eq!(
            check_name(&"n".repeat(10_000)),
            Err(ConfigError::NameTooLong {
                len: 10_000,
                max: MAX_NAME_LEN
            })
        );
    }
}
