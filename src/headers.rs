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
    match usize::try_from(secs).ok().and_then(|i| SHORT.get(i)) {
        Some(s) => HeaderValue::from_static(s),
        None => integer_value(secs),
    }
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

thread_local! {
    /// (policy id, remaining, seconds until reset, rendered value) of the last single-quota
    /// `RateLimit` value this thread rendered.
    static LAST_RATELIMIT: RefCell<Option<(u64, u64, u64, HeaderValue)>> = const { RefCell::new(None) };
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
    /// Under a flood one key gets the same answer again and again (`r=0`, the same `t`), so
    /// each thread keeps the last single-quota value it rendered and hands out a clone of it.
    pub(crate) fn ratelimit_items(
        &self,
        mut items: impl Iterator<Item = (u64, Duration)>,
    ) -> HeaderValue {
        if self.prefixes.len() == 1 {
            let Some((remaining, reset)) = items.next() else {
                return HeaderValue::from_static("");
            };
            let secs = ceil_secs(reset);
            return LAST_RATELIMIT.with(|last| {
                let mut last = last.borrow_mut();
                if let Some((id, r, t, v)) = &*last {
                    if (*id, *r, *t) == (self.id, remaining, secs) {
                        return v.clone();
                    }
                }
                let v = self.render(std::iter::once((remaining, reset)));
                *last = Some((self.id, remaining, secs, v.clone()));
                v
            });
        }
        self.render(items)
    }

    fn render(&self, items: impl Iterator<Item = (u64, Duration)>) -> HeaderValue {
        let mut out = BytesMut::with_capacity(40 * self.prefixes.len());
        let mut buf = itoa_buf();
        for (i, (prefix, (remaining, reset))) in self.prefixes.iter().zip(items).enumerate() {
            if i > 0 {
                out.put_slice(b", ");
            }
            out.put_slice(prefix);
            out.put_slice(fmt_u64(remaining, &mut buf));
            out.put_slice(b";t=");
            out.put_slice(fmt_u64(ceil_secs(reset), &mut buf));
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

    #[test]
    fn names_must_be_plain_printable_ascii() {
        assert!(check_name("per-ip").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\"b").is_err());
        assert!(check_name("a\\b").is_err());
        assert!(check_name("é").is_err());
    }
}
