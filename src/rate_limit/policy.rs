//! [`Policy`]: a named set of quotas, decided together.

use std::borrow::Cow;

use crate::decision::MAX_QUOTAS;
use crate::error::ConfigError;
use crate::headers::{self, PolicyHeaders};
use crate::quota::Quota;

/// A named set of quotas applied together to each key (all or nothing), e.g. "10 per second
/// and 10 000 per day".
///
/// The name appears in the `RateLimit-Policy` and `RateLimit` header fields, selects the
/// tier, and is part of the Redis keys.
///
/// # Names
/// * A bare [`Quota`] converts into a policy named after it: its [`Quota::named`] name, else
///   its rate, e.g. `"10-per-1s"`, `"5-per-1m"`, `"1000-per-1h"`, `"250-per-500ms"`. So two
///   layers without names say which limit answered, in headers and in rejection hooks.
/// * Each quota of a policy is one item of the header fields. A quota with its own name
///   ([`Quota::named`]) keeps it. Otherwise the first quota takes the policy's name, and each
///   further unnamed one the policy's name followed by its rate: adding a quota never renames
///   the ones before it.
///
/// ```
/// use tollgate::{Policy, Quota};
/// assert_eq!(Policy::from(Quota::per_second(10)).name(), "10-per-1s");
/// // Items: "api" (10 per second) and "api-10000-per-1d".
/// let api = Policy::new("api", Quota::per_second(10)).quota(Quota::per_day(10_000));
/// # let _ = api;
/// ```
///
/// ```
/// use tollgate::{Policy, Quota};
/// let free = Policy::new("free", Quota::per_second(10)).quota(Quota::per_day(10_000));
/// assert_eq!(free.name(), "free");
/// assert_eq!(free.quotas().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub(crate) name: Cow<'static, str>,
    pub(crate) quotas: Vec<Quota>,
    /// Named after its first quota, not by the user: each unnamed quota takes its own rate.
    derived: bool,
    /// Named after its first quota's own name ([`Quota::named`], a name for the header
    /// fields), not by the user: the name is not a choice to share Redis keys.
    quota_named: bool,
}

impl Policy {
    /// A policy named `name` with a first quota.
    ///
    /// The name must be printable ASCII without `"` or `\` (it is written into headers); an
    /// invalid name is reported when the layer is built.
    #[must_use]
    pub fn new(name: impl Into<Cow<'static, str>>, quota: Quota) -> Self {
        Policy {
            name: name.into(),
            quotas: vec![quota],
            derived: false,
            quota_named: false,
        }
    }

    /// The same policy under another name.
    pub(crate) fn renamed(self, name: Cow<'static, str>) -> Self {
        Policy {
            name,
            derived: false,
            quota_named: false,
            ..self
        }
    }

    /// Adds a quota (at most 4 per policy: more is [`ConfigError::TooManyQuotas`] from the
    /// layer's `validate()`, or a panic naming it when the layer is applied).
    #[must_use]
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// Whether the name was derived from the first quota (its rate, or its name for the
    /// header fields) rather than given to the policy: such a name is not a choice to share
    /// Redis keys with another layer of that name.
    #[cfg(feature = "redis")]
    pub(crate) fn is_derived(&self) -> bool {
        self.derived || self.quota_named
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quotas, in order.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        headers::check_name(&self.name)?;
        if self.quotas.len() > MAX_QUOTAS {
            return Err(ConfigError::TooManyQuotas {
                got: self.quotas.len(),
                max: MAX_QUOTAS,
            });
        }
        Ok(())
    }

    /// The header names of the quotas (see [Names](Policy#names)); a name that would repeat
    /// an earlier item's gets its position appended.
    pub(crate) fn item_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::with_capacity(self.quotas.len());
        for (i, q) in self.quotas.iter().enumerate() {
            let mut name = match q.name() {
                Some(n) => n.to_owned(),
                None if self.derived => rate_name(q),
                None if i == 0 => self.name.to_string(),
                None => format!("{}-{}", self.name, rate_name(q)),
            };
            if names.contains(&name) {
                name = format!("{name}-{}", i + 1);
            }
            names.push(name);
        }
        names
    }

    /// The header fields of the quotas.
    pub(crate) fn headers(&self) -> PolicyHeaders {
        self.headers_of(&self.quotas)
    }

    /// The header fields of this policy with each quota at `share` (see
    /// [`Quota::scaled`]); `None` when a scaled quota is not valid.
    pub(crate) fn scaled_headers(&self, share: f64) -> Option<PolicyHeaders> {
        let scaled = self
            .quotas
            .iter()
            .map(|q| q.scaled(share).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(self.headers_of(&scaled))
    }

    /// The header fields of `quotas` (this policy's, or the same scaled) under this policy's
    /// item names.
    fn headers_of(&self, quotas: &[Quota]) -> PolicyHeaders {
        let items: Vec<_> = self
            .item_names()
            .into_iter()
            .zip(quotas)
            .map(|(name, q)| (name, u64::from(q.burst_size()), q.count(), q.period()))
            .collect();
        PolicyHeaders::new(&items, None)
    }
}

impl From<Quota> for Policy {
    /// A policy named after the quota: its own name, else its rate (`"10-per-1s"`).
    fn from(quota: Quota) -> Self {
        match quota.name() {
            Some(name) => Policy {
                quota_named: true,
                ..Policy::new(name.to_owned(), quota)
            },
            None => Policy {
                name: rate_name(&quota).into(),
                quotas: vec![quota],
                derived: true,
                quota_named: false,
            },
        }
    }
}

/// A quota's rate as a name: `"{count}-per-{period}"`, the period in the largest unit that
/// divides it (`d`, `h`, `m`, `s`, `ms`, `us`, `ns`).
pub(crate) fn rate_name(q: &Quota) -> String {
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let nanos = q.period().as_nanos();
    let (size, unit) = UNITS
        .iter()
        .copied()
        .find(|(size, _)| nanos % size == 0)
        .unwrap_or((1, "ns"));
    format!("{}-per-{}{unit}", q.count(), nanos / size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bare_quota_is_named_after_its_rate_in_the_largest_unit_that_divides_it() {
        let name = |q: Quota| Policy::from(q).name().to_owned();
        assert_eq!(name(Quota::per_second(10)), "10-per-1s");
        assert_eq!(name(Quota::per_minute(5)), "5-per-1m");
        assert_eq!(name(Quota::per_hour(1000)), "1000-per-1h");
        assert_eq!(name(Quota::per_day(1)), "1-per-1d");
        assert_eq!(
            name(Quota::new(250, Duration::from_millis(500))),
            "250-per-500ms"
        );
        assert_eq!(name(Quota::new(3, Duration::from_secs(90))), "3-per-90s");
        assert_eq!(
            name(Quota::new(1, Duration::from_nanos(1_001))),
            "1-per-1001ns"
        );
        assert_eq!(name(Quota::per_second(1).named("login")), "login");
    }

    #[test]
    fn adding_a_quota_never_renames_the_ones_before_it() {
        let one = Policy::new("api", Quota::per_second(10));
        assert_eq!(one.item_names(), ["api"]);
        let two = one.quota(Quota::per_day(10_000));
        assert_eq!(two.item_names(), ["api", "api-10000-per-1d"]);
        let bare = Policy::from(Quota::per_second(10)).quota(Quota::per_hour(100));
        assert_eq!(bare.item_names(), ["10-per-1s", "100-per-1h"]);
        let named = Policy::new("api", Quota::per_second(1).named("burst"))
            .quota(Quota::per_second(1).named("burst"));
        assert_eq!(named.item_names(), ["burst", "burst-2"]);
    }
}
