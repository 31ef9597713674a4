//! [`MissingKey`]: the policy every layer applies to a request without a key.

use http::StatusCode;

use crate::error::ConfigError;

/// What to do with a request whose key cannot be extracted (no such header, no peer address).
///
/// The same policy for every layer of the crate. Never a 500, never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissingKey<K> {
    /// Answer with this status (400 by default; 401 suits a missing API key).
    Reject(StatusCode),
    /// Count such requests under this one shared key.
    UseKey(K),
    /// Let the request through unlimited.
    Allow,
}

impl<K> Default for MissingKey<K> {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// The key of a request, once the policy has been applied.
pub(crate) enum Resolved<K> {
    /// Count the request under this key.
    Key(K),
    /// Let it through unlimited.
    Pass,
    /// Turn it away with this status.
    Reject(StatusCode),
}

impl<K: Clone> MissingKey<K> {
    /// What this policy says about a request without a key.
    #[inline]
    pub(crate) fn apply(&self) -> Resolved<K> {
        match self {
            MissingKey::UseKey(key) => Resolved::Key(key.clone()),
            MissingKey::Allow => Resolved::Pass,
            MissingKey::Reject(status) => Resolved::Reject(*status),
        }
    }
}

impl<K> MissingKey<K> {
    /// A rejection status must be a client or server error.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match self {
            MissingKey::Reject(s) if !(s.is_client_error() || s.is_server_error()) => {
                Err(ConfigError::InvalidStatus(s.as_u16()))
            }
            _ => Ok(()),
        }
    }
}
