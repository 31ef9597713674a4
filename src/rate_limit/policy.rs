//! [`Policy`]: a named set of quotas, decided together.

use std::borrow::Cow;

use crate::error::ConfigError;
use crate::gcra::MAX_QUOTAS;
use crate::headers::{self, PolicyHeaders};
use crate::quota::Quota;

/// A named set of quotas applied together to each key (all or nothing), e.g. "10 per second
/// and 10 000 per day".
///
/// The name appears in the `RateLimit-Policy` and `RateLimit` header fields and selects the
/// tier. A bare [`Quota`] converts into a policy named `"default"`.
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
        }
    }

    /// Adds a quota (at most 4 per policy).
    #[must_use]
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
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

    /// The header names of the quotas: their own, or the policy's (suffixed when several).
    pub(crate) fn headers(&self) -> PolicyHeaders {
        let many = self.quotas.len() > 1;
        let items: Vec<_> = self
            .quotas
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let name = match q.name() {
                    Some(n) => n.to_owned(),
                    None if many => format!("{}-{}", self.name, i + 1),
                    None => self.name.to_string(),
                };
                (name, u64::from(q.burst_size()), q.count(), q.period())
            })
            .collect();
        PolicyHeaders::new(&items, None)
    }
}

impl From<Quota> for Policy {
    fn from(quota: Quota) -> Self {
        Policy::new("default", quota)
    }
}
