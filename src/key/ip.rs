//! IP-address keys: the TCP peer, and the client behind trusted proxies.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::{KeyError, KeyExtractor, RequestHead};

/// The address of the TCP peer (axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` in the
/// request extensions).
///
/// IPv6 addresses are grouped by their /64 prefix by default (one host usually owns a whole
/// /64, so counting single addresses would let it rotate through 2^64 keys); see
/// [`ipv6_prefix`](PeerIp::ipv6_prefix). IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, as seen
/// on dual-stack sockets) are keyed as the IPv4 address. A request without a peer address has
/// no key ([`KeyError`]).
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tollgate::key::{KeyExtractor, PeerIp, RequestHead};
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:1:2:3:4:5:6]:443".parse::<SocketAddr>()?);
/// let head = RequestHead::new(&req);
/// assert_eq!(PeerIp::new().extract(&head)?, "2001:db8:1:2::".parse::<IpAddr>()?);
/// assert_eq!(PeerIp::new().ipv6_prefix(48).extract(&head)?, "2001:db8:1::".parse::<IpAddr>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp { v6_prefix: 64 }
    }
}

impl PeerIp {
    /// Keys requests by the peer address, IPv6 grouped by /64.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Groups IPv6 addresses by their first `bits` bits: `128` keys every address on its own,
    /// `48` keys a whole site, `0` puts all of IPv6 in one bucket. Values above 128 mean 128.
    /// IPv4 addresses are never grouped.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }
}

pub(crate) fn peer_addr(req: &RequestHead<'_>) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = req
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(ci.0);
    }
    req.extensions.get::<SocketAddr>().copied()
}

/// The key of `ip`: IPv4-mapped IPv6 becomes IPv4, other IPv6 is cut to `v6_prefix` bits.
fn group(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(v6_prefix))),
    }
}

/// The netmask of an IPv6 prefix of `len` bits (`len` above 128 means 128).
fn mask128(len: u8) -> u128 {
    match len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l.min(128))),
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;
    fn extract(&self, req: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        peer_addr(req)
            .map(|a| group(a.ip(), self.v6_prefix))
            .ok_or(MISSING_PEER)
    }
}

const MISSING_PEER: KeyError = KeyError::new("no peer address (serve with ConnectInfo)");

/// The client address behind trusted proxies.
#[derive(Debug, Clone, Default)]
pub struct ClientIp {
    peer: PeerIp,
}

impl KeyExtractor for ClientIp {
    type Key = IpAddr;
    fn extract(&self, req: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        self.peer.extract(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn request(peer: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        if let Some(peer) = peer {
            req.extensions_mut().insert(SocketAddr::new(ip(peer), 4000));
        }
        req
    }

    fn key<E: KeyExtractor<Key = IpAddr>>(ex: &E, req: &Request<()>) -> IpAddr {
        ex.extract(&RequestHead::new(req)).unwrap()
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let req = request(Some("2001:db8:1:2:3:4:5:6"));
        assert_eq!(key(&PeerIp::new(), &req), ip("2001:db8:1:2::"));
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(48), &req),
            ip("2001:db8:1::")
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(128), &req),
            ip("2001:db8:1:2:3:4:5:6")
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(200), &req),
            ip("2001:db8:1:2:3:4:5:6")
        );
        assert_eq!(key(&PeerIp::new().ipv6_prefix(0), &req), ip("::"));
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(0), &request(Some("1.2.3.4"))),
            ip("1.2.3.4")
        );
    }

    #[test]
    fn ipv4_mapped_becomes_ipv4() {
        let req = request(Some("::ffff:203.0.113.7"));
        assert_eq!(key(&PeerIp::new(), &req), ip("203.0.113.7"));
        assert_eq!(key(&PeerIp::new().ipv6_prefix(0), &req), ip("203.0.113.7"));
    }

    #[test]
    fn missing_peer_is_key_error() {
        assert!(PeerIp::new()
            .extract(&RequestHead::new(&request(None)))
            .is_err());
    }
}
