//! [`MissingKey`]: the policy every layer applies to a request without a key.

use http::StatusCode;

use crate::error::ConfigError;

/// What to do with a request whose key cannot be extracted (no such header, no peer address).
///
/// The same policy for every layer of the crate. Never a 500, never a panic.
///
/// `MissingKey::reject(401)` is `MissingKey::Reject(StatusCode::UNAUTHORIZED)`. With
/// [`PeerIp`](struct@crate::key::PeerIp) or [`ClientIp`](crate::key::ClientIp), a server that is not
/// served with `into_make_service_with_connect_info::<SocketAddr>()` has no peer address for
/// any request, so every request gets this answer: the default `400` then means "fix the
/// server", not "the client is wrong".
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
    /// [`MissingKey::Reject`] with the status `code`, without spelling a `StatusCode`:
    /// `MissingKey::reject(401)`.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::MissingKey;
    /// assert_eq!(MissingKey::<()>::reject(401), MissingKey::Reject(StatusCode::UNAUTHORIZED));
    /// ```
    ///
    /// # Panics
    /// At the caller's line, when `code` is not a client or server error status (400–599).
    #[track_caller]
    #[must_use]
    pub fn reject(code: u16) -> Self {
        match Self::try_reject(code) {
            Ok(policy) => policy,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// [`reject`](Self::reject) for a status read at run time:
    /// [`ConfigError::InvalidStatus`] unless `code` is a client or server error (400–599).
    ///
    /// ```
    /// use tollgate::{ConfigError, MissingKey};
    /// assert!(MissingKey::<()>::try_reject(401).is_ok());
    /// assert_eq!(MissingKey::<()>::try_reject(200), Err(ConfigError::InvalidStatus(200)));
    /// ```
    pub fn try_reject(code: u16) -> Result<Self, ConfigError> {
        match StatusCode::from_u16(code) {
            Ok(status) if status.is_client_error() || status.is_server_error() => {
                Ok(MissingKey::Reject(status))
            }
            _ => Err(ConfigError::InvalidStatus(code)),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_takes_the_status_as_a_number() {
        assert_eq!(
            MissingKey::<()>::reject(401),
            MissingKey::Reject(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            MissingKey::<()>::reject(599),
            MissingKey::Reject(StatusCode::from_u16(599).unwrap_or(StatusCode::BAD_REQUEST))
        );
    }

    #[test]
    #[should_panic(expected = "rejection status 200 is not a 4xx or 5xx status")]
    fn reject_refuses_a_success_status() {
        let _ = MissingKey::<()>::reject(200);
    }

    #[test]
    #[should_panic(expected = "rejection status 1000 is not a 4xx or 5xx status")]
    fn reject_refuses_a_number_that_is_no_status() {
        let _ = MissingKey::<()>::reject(1000);
    }
}
