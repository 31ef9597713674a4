//! Rendering of `Retry-After`, `RateLimit-Policy` and `RateLimit` header fields
//! (draft-ietf-httpapi-ratelimit-headers-10), shared by every layer.
//!
//! Mapping of GCRA onto the draft's fields, per quota:
//!
//! | field | parameter | value |
//! |---|---|---|
//! | `RateLimit-Policy` | `q` | the burst: requests an idle client may send at once |
//! | `RateLimit-Policy` | `w` | seconds to earn the whole burst back (`burst × T`, rounded up), so `q/w` is the rate |
//! | `RateLimit` | `r` | whole requests still admissible now |
//! | `RateLimit` | `t` | seconds until the quota is back to its full burst (rounded up) |
//!
//! A concurrency limit is one `RateLimit-Policy` item with `q` = the most requests in flight,
//! `qu="concurrent-requests"` and no window.
//!
//! `Retry-After` is a whole number of seconds, rounded up and never `0` when the client must
//! wait (RFC 9110 §10.2.3).

use std::time::Duration;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, BytesMut};
use http::HeaderValue;

use crate::error::ConfigError;
use crate::gcra::Decision;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit` (legacy, on request).
pub static X_RATELIMIT_LIMIT: http::HeaderName = http::HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (legacy, on request).
pub static X_RATELIMIT_REMAINING: http::HeaderName =
    http::HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (legacy, on request).
pub static X_RATELIMIT_RESET: http::HeaderName = http::HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` for a wait of `d`: whole seconds rounded up, at least 1.
pub fn retry_after_value(d: Duration) -> HeaderValue {
    // The usual short waits without an allocation: under a flood, rejections are the hot path.
    const SHORT: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    let secs = ceil_secs(d).max(1);
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

pub(crate) fn integer_value(n: u64) -> HeaderValue {
    let mut buf = itoa_buf();
    HeaderValue::from_bytes(fmt_u64(n, &mut buf)).unwrap_or(HeaderValue::from_static("0"))
}

type ItoaBuf = [u8; 20];

fn itoa_buf() -> ItoaBuf {
    [0; 20]
}

/// The decimal digits of `n`, written at the end of `buf`.
fn fmt_u64(mut n: u64, buf: &mut ItoaBuf) -> &[u8] {
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

/// Checks that a policy name can be written as a structured-field string without escapes.
pub(crate) fn check_name(name: &str) -> Result<(), ConfigError> {
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

/// A `RateLimit-Policy` item for a limit on concurrent requests:
/// `"name";q=max;qu="concurrent-requests"` (no window: the quota is not spent over time).
pub(crate) fn concurrency_policy(name: &str, max: usize) -> HeaderValue {
    let s = format!("\"{name}\";q={max};qu=\"concurrent-requests\"");
    HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static(""))
}

/// Slots of each thread's cache of rendered `RateLimit` values. A policy always uses the slot
/// its id picks, so that a few layers or tiers answering on one thread (a stack of layers, the
/// tiers of one layer) keep their own last value instead of evicting each other's.
const SLOTS: usize = 8;

/// The most quotas of a policy whose `RateLimit` value is cached; more are rendered each time.
const CACHED_QUOTAS: usize = 4;

/// What a rendered `RateLimit` value says: the policy and, per quota, (remaining, seconds
/// until reset). Quotas beyond `len` are zero.
#[derive(Clone, Copy, PartialEq, Eq)]
struct RenderedKey {
    id: u64,
    len: usize,
    items: [(u64, u64); CACHED_QUOTAS],
}

thread_local! {
    /// The last `RateLimit` value rendered on this thread, per slot.
    static LAST_RATELIMIT: RefCell<[Option<(RenderedKey, HeaderValue)>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
    /// The last `Retry-After` value of 10 seconds or more rendered on this thread.
    static LAST_RETRY_AFTER: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
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
    /// `items` holds, per quota, its name, burst and burst period.
    pub(crate) fn new(items: &[(String, u64, Duration)], extra: Option<&str>) -> Self {
        let mut s = String::new();
        for (i, (name, q, w)) in items.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!("\"{name}\";q={q};w={}", ceil_secs(*w).max(1)));
            if let Some(extra) = extra {
                s.push_str(extra);
            }
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        PolicyHeaders {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            prefixes: items
                .iter()
                .map(|(n, _, _)| format!("\"{n}\";r=").into_bytes().into())
                .collect(),
            policy: HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("")),
        }
    }

    /// The `RateLimit-Policy` value (built once).
    pub(crate) fn policy(&self) -> HeaderValue {
        self.policy.clone()
    }

    /// The `RateLimit` value for `d`.
    pub(crate) fn ratelimit(&self, d: &Decision) -> HeaderValue {
        self.ratelimit_items(d.states().iter().map(|s| (s.remaining(), s.reset_after())))
    }

    /// The `RateLimit` value for items of (remaining, time until reset), in policy order.
    ///
    /// Under a flood one key gets the same answer again and again (`r=0`, the same `t`), and
    /// a key far from its limit gets `r` = burst - 1 each time: each thread keeps the last
    /// value it rendered for each policy and hands out a clone of it (a reference count, no
    /// allocation, no formatting).
    pub(crate) fn ratelimit_items(
        &self,
        mut items: impl Iterator<Item = (u64, Duration)>,
    ) -> HeaderValue {
        if self.prefixes.len() > CACHED_QUOTAS {
            return self.render(items.map(|(r, reset)| (r, ceil_secs(reset))));
        }
        let mut key = RenderedKey {
            id: self.id,
            len: 0,
            items: [(0, 0); CACHED_QUOTAS],
        };
        for (slot, (remaining, reset)) in key.items[..self.prefixes.len()]
            .iter_mut()
            .zip(items.by_ref())
        {
            *slot = (remaining, ceil_secs(reset));
            key.len += 1;
        }
        LAST_RATELIMIT.with(|cache| {
            let mut cache = cache.borrow_mut();
            let slot = &mut cache[self.slot()];
            if let Some((k, v)) = &*slot {
                if *k == key {
                    return v.clone();
                }
            }
            let v = self.render(key.items[..key.len].iter().copied());
            *slot = Some((key, v.clone()));
            v
        })
    }

    /// The slot of this thread's cache that holds this policy's last `RateLimit` value.
    fn slot(&self) -> usize {
        (self.id % SLOTS as u64) as usize
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
    fn integers_render_exactly() {
        for n in [0u64, 7, 10, 99, 100, 12345, u64::MAX] {
            assert_eq!(integer_value(n), n.to_string().as_str());
        }
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
        let one =
            |name: &str| PolicyHeaders::new(&[(name.to_owned(), 5, Duration::from_secs(5))], None);
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
            .map(|(n, q)| ((*n).to_owned(), *q, Duration::from_secs(*q)))
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
        assert_eq!(
            p.ratelimit_items(item(u64::MAX, Duration::from_secs(u64::MAX))),
            format!("\"p\";r={};t={}", u64::MAX, u64::MAX).as_str()
        );
        assert_eq!(p.ratelimit_items(item(0, Duration::ZERO)), "\"p\";r=0;t=0");
        assert_eq!(p.ratelimit_items(std::iter::empty()), "");
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
    }
}
