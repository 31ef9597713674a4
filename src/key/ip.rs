//! IP-address keys: the TCP peer, and the client behind trusted proxies.

use std::net::{IpAddr, SocketAddr};

use super::{KeyError, KeyExtractor, RequestHead};

/// The address of the TCP peer (axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` in the
/// request extensions). IPv6 addresses are grouped by their /64 prefix.
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
    pub fn new() -> Self {
        Self::default()
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

fn group(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let bits = u128::from(v6);
            let mask = match v6_prefix {
                0 => 0,
                p if p >= 128 => u128::MAX,
                p => u128::MAX << (128 - u32::from(p)),
            };
            IpAddr::V6((bits & mask).into())
        }
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;
    fn extract(&self, req: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        peer_addr(req)
            .map(|a| group(a.ip(), self.v6_prefix))
            .ok_or(KeyError::new("no peer address (serve with ConnectInfo)"))
    }
}

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
