//! Plain settings of the layers, and their configuration-file form (feature `serde`).
//!
//! The limits that may change while serving, as plain values: [`Quota`] and
//! [`Policy`](crate::Policy) for rate limits, [`ConcurrencySettings`] and [`ShapeSettings`]
//! for the other two layers. Each builds a layer ([`ConcurrencySettings::layer`],
//! [`ShapeSettings::layer`]) and is applied to a running one through its handle
//! ([`ConcurrencyHandle::apply`](crate::ConcurrencyHandle::apply),
//! [`ShapeHandle::apply`](crate::ShapeHandle::apply),
//! [`RateLimitHandle::apply`](crate::RateLimitHandle::apply)).
//!
//! # Configuration files
//! With the `serde` feature, every type here, [`Quota`] and [`Policy`](crate::Policy) implement
//! `Serialize` and `Deserialize`. Durations are strings: an integer and a unit, `ns`, `us`,
//! `ms`, `s`, `m`, `h` or `d`, repeated from the largest unit down (`"500ms"`, `"1s"`,
//! `"1h30m"`); they are written back in that form, in the largest units that fit.
//! A quota reads `count` requests `per` period, with an optional `burst` and `name`, and a
//! `kind`: `"gcra"` (the default), `"fixed_window"`, `"sliding_log"` or `"sliding_window"`
//! (then `per` is the window, and there is no burst). Values
//! are checked as the builders check them, and an error names the field (a duration error
//! quotes the string instead; a format such as TOML adds where it is); unknown fields are errors, so that a misspelt limit is never
//! silently ignored.
//!
//! ```
//! # #[cfg(feature = "serde")] {
//! use tollgate::settings::ShapeSettings;
//! use tollgate::{Policy, Quota};
//!
//! let policy: Policy = serde_json::from_str(
//!     r#"{ "name": "free", "quotas": [ { "count": 10, "per": "1s", "burst": 20 },
//!                                       { "count": 1000, "per": "1d" } ] }"#,
//! ).unwrap();
//! assert_eq!(policy.quotas()[0], Quota::per_second(10).burst(20));
//! assert_eq!(policy.quotas()[1], Quota::per_day(1000));
//!
//! let err = serde_json::from_str::<Quota>(r#"{ "count": 0, "per": "1s" }"#).unwrap_err();
//! assert!(err.to_string().contains("count"), "{err}");
//! let err = serde_json::from_str::<Quota>(r#"{ "count": 5, "per": "1 fortnight" }"#);
//! assert!(err.unwrap_err().to_string().contains("invalid duration \"1 fortnight\""));
//!
//! let shape: ShapeSettings =
//!     serde_json::from_str(r#"{ "rate": { "count": 5, "per": "1s" }, "max_wait": "2s" }"#)
//!         .unwrap();
//! assert_eq!(shape.max_wait, Some(std::time::Duration::from_secs(2)));
//! # }
//! ```

use std::time::Duration;

use crate::quota::Quota;

/// The settings of a [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) that may change
/// while serving.
///
/// In a configuration file: `max = 100` and, optionally,
/// `queue = { max_waiting = 50, max_wait = "1s" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct ConcurrencySettings {
    /// The most requests in flight at once (per key, for a keyed limit).
    pub max: usize,
    /// Lets requests over the limit wait, if set.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub queue: Option<QueueSettings>,
}

/// How many requests may wait for a concurrency permit, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct QueueSettings {
    /// The most requests waiting at once.
    pub max_waiting: usize,
    /// The longest a request waits.
    #[cfg_attr(feature = "serde", serde(with = "duration"))]
    pub max_wait: Duration,
}

/// The settings of a [`ShapeLayer`](crate::ShapeLayer) that may change while serving.
///
/// In a configuration file: `rate = { count = 10, per = "1s" }` and, optionally,
/// `max_waiting = 20` and `max_wait = "2s"` (the names of a concurrency limit's queue; the
/// former `max_queue` and `max_delay` are still read).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct ShapeSettings {
    /// The rate: one request per emission interval of this quota.
    pub rate: Quota,
    /// The most requests waiting per key.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none", alias = "max_queue")
    )]
    pub max_waiting: Option<usize>,
    /// The longest a request may be made to wait.
    #[cfg_attr(
        feature = "serde",
        serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "duration::option",
            alias = "max_delay"
        )
    )]
    pub max_wait: Option<Duration>,
}

/// Durations as strings: `"500ms"`, `"1s"`, `"1h30m"` (see the [module docs](self)).
///
/// For `#[serde(with = "tollgate::settings::duration")]` on a `Duration` field, and
/// `duration::option` on an `Option<Duration>`.
#[cfg(feature = "serde")]
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];

    /// Parses `"1h30m"`, `"500ms"`, ...: integers each followed by a unit, largest first.
    pub fn parse(s: &str) -> Result<Duration, String> {
        let bad = || {
            format!(
                "invalid duration {s:?}: expected an integer and a unit (ns, us, ms, s, m, h, d), \
                 e.g. \"500ms\", \"1s\", \"1h30m\""
            )
        };
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(bad());
        }
        let mut total: u128 = 0;
        let mut last_unit = u128::MAX;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let unit_len = rest[digits..]
                .bytes()
                .take_while(u8::is_ascii_alphabetic)
                .count();
            if digits == 0 || unit_len == 0 {
                return Err(bad());
            }
            let n: u128 = rest[..digits].parse().map_err(|_| bad())?;
            let unit = &rest[digits..digits + unit_len];
            let (_, size) = UNITS.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
            if *size >= last_unit {
                return Err(bad());
            }
            last_unit = *size;
            total = n
                .checked_mul(*size)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
            rest = &rest[digits + unit_len..];
        }
        let secs = u64::try_from(total / 1_000_000_000).map_err(|_| bad())?;
        Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
    }

    /// Writes `d` in the largest units that fit: `"1h30m"`, `"1500ms"` is `"1s500ms"`.
    pub fn format(d: Duration) -> String {
        let mut nanos = d.as_nanos();
        if nanos == 0 {
            return "0s".to_owned();
        }
        let mut out = String::new();
        for (unit, size) in UNITS {
            if nanos >= size {
                out.push_str(&format!("{}{unit}", nanos / size));
                nanos %= size;
            }
        }
        out
    }

    /// Serializes a `Duration` as a string.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*d))
    }

    /// Deserializes a `Duration` from a string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }

    /// The same, for `Option<Duration>`.
    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        /// Serializes an `Option<Duration>` as a string, or none.
        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => s.serialize_some(&super::format(*d)),
                None => s.serialize_none(),
            }
        }

        /// Deserializes an `Option<Duration>` from a string, or none.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let s = Option::<String>::deserialize(d)?;
            s.map(|s| super::parse(&s).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

#[cfg(feature = "serde")]
mod quota_serde {
    use std::borrow::Cow;
    use std::time::Duration;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::{Policy, Quota, QuotaKind};

    /// The algorithm, by name.
    #[derive(Serialize, Deserialize, PartialEq, Eq, Clone, Copy)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Gcra,
        FixedWindow,
        SlidingLog,
        SlidingWindow,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct QuotaForm {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<Kind>,
        count: u32,
        #[serde(with = "super::duration")]
        per: Duration,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        burst: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    }

    impl Serialize for Quota {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let kind = match self.kind() {
                QuotaKind::FixedWindow => Some(Kind::FixedWindow),
                QuotaKind::SlidingLog => Some(Kind::SlidingLog),
                QuotaKind::SlidingWindow => Some(Kind::SlidingWindow),
                _ => None,
            };
            QuotaForm {
                kind,
                count: self.count(),
                per: self.period(),
                burst: (self.burst_size() != self.count()).then_some(self.burst_size()),
                name: self.name().map(str::to_owned),
            }
            .serialize(s)
        }
    }

    impl<'de> Deserialize<'de> for Quota {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let f = QuotaForm::deserialize(d)?;
            let named =
                |e: crate::ConfigError, field: &str| D::Error::custom(format!("{field}: {e}"));
            let field = if f.count == 0 { "count" } else { "per" };
            let made = match f.kind.unwrap_or(Kind::Gcra) {
                Kind::Gcra => Quota::try_new(f.count, f.per),
                Kind::FixedWindow => Quota::try_fixed_window(f.count, f.per),
                Kind::SlidingLog => Quota::try_sliding_log(f.count, f.per),
                Kind::SlidingWindow => Quota::try_sliding_window(f.count, f.per),
            };
            let mut q = made.map_err(|e| named(e, field))?;
            if let Some(b) = f.burst {
                q = q.try_burst(b).map_err(|e| named(e, "burst"))?;
            }
            if let Some(n) = f.name {
                q = q.try_named(n).map_err(|e| named(e, "name"))?;
            }
            Ok(q)
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PolicyForm {
        name: String,
        quotas: Vec<Quota>,
    }

    impl Serialize for Policy {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            PolicyForm {
                name: self.name().to_owned(),
                quotas: self.quotas().to_vec(),
            }
            .serialize(s)
        }
    }

    impl<'de> Deserialize<'de> for Policy {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let f = PolicyForm::deserialize(d)?;
            let mut quotas = f.quotas.into_iter();
            let first = quotas
                .next()
                .ok_or_else(|| D::Error::custom("quotas: a policy needs at least one quota"))?;
            let mut policy = Policy::new(Cow::Owned(f.name), first);
            for q in quotas {
                policy = policy.quota(q);
            }
            policy
                .validate()
                .map_err(|e| D::Error::custom(format!("policy {:?}: {e}", policy.name())))?;
            Ok(policy)
        }
    }
}
