//! The allow list every layer shares: client addresses (CIDR ranges) and keys that no limit,
//! queue or ban applies to.
//!
//! * **Addresses** are matched against the client address the layer's key extractor resolves
//!   ([`KeyExtractor::client_ip`]): with [`ClientIp`](crate::key::ClientIp) the address it
//!   trusts behind proxies (a forwarding header from an untrusted peer is never read), with
//!   any other extractor the TCP peer address. Addresses are compared in canonical form, so
//!   `::ffff:192.0.2.1` is `192.0.2.1` and `::ffff:192.0.2.0/120` is `192.0.2.0/24`.
//! * **Keys** are matched against the key the extractor found, after it found one.
//!
//! An allowed request goes through as a skipped one does: uncounted, without `RateLimit`
//! fields, never rejected or delayed.

use std::collections::HashSet;
use std::net::IpAddr;

use crate::error::ConfigError;
use crate::key::{peer_addr, Cidr, KeyExtractor, RequestHead};

/// Addresses and keys let through without limits.
#[derive(Clone)]
pub(crate) struct AllowList<K> {
    cidrs: Vec<Cidr>,
    keys: HashSet<K>,
}

impl<K> Default for AllowList<K> {
    fn default() -> Self {
        AllowList {
            cidrs: Vec::new(),
            keys: HashSet::new(),
        }
    }
}

impl<K: Eq + std::hash::Hash> AllowList<K> {
    /// Adds the range `cidr` (`"10.0.0.0/8"`, `"2001:db8::/32"`, a bare address).
    pub(crate) fn add_ip(&mut self, cidr: &str) -> Result<(), ConfigError> {
        let parsed = Cidr::parse(cidr).ok_or_else(|| ConfigError::InvalidAllowedIp(cidr.into()))?;
        if !self.cidrs.contains(&parsed) {
            self.cidrs.push(parsed);
        }
        Ok(())
    }

    /// Adds a key.
    pub(crate) fn add_key(&mut self, key: K) {
        self.keys.insert(key);
    }

    /// The same ranges for another key type; whether keys were lost on the way.
    pub(crate) fn rekey<K2>(self) -> (AllowList<K2>, bool) {
        let lost = !self.keys.is_empty();
        let list = AllowList {
            cidrs: self.cidrs,
            keys: HashSet::new(),
        };
        (list, lost)
    }

    /// Whether the list allows nothing, so that requests need not be looked at.
    #[inline]
    pub(crate) fn has_ips(&self) -> bool {
        !self.cidrs.is_empty()
    }

    /// Whether the client address of `head`, as `extractor` resolves it, is allowed.
    pub(crate) fn allows_ip<E: KeyExtractor>(&self, extractor: &E, head: &RequestHead<'_>) -> bool {
        let ip: Option<IpAddr> = extractor
            .client_ip(head)
            .or_else(|| peer_addr(head).map(|a| a.ip()))
            .map(|ip| ip.to_canonical());
        ip.is_some_and(|ip| self.cidrs.iter().any(|c| c.contains(ip)))
    }

    /// Whether `key` is allowed.
    #[inline]
    pub(crate) fn allows_key(&self, key: &K) -> bool {
        !self.keys.is_empty() && self.keys.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::key::{ClientIp, Header, KeyExtractorExt, PeerIp};

    fn request(peer: &str, xff: Option<&str>) -> http::Request<()> {
        let mut b = http::Request::builder();
        if let Some(x) = xff {
            b = b.header("x-forwarded-for", x);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn office() -> AllowList<()> {
        let mut list = AllowList::default();
        list.add_ip("203.0.113.0/24").unwrap();
        list
    }

    #[test]
    fn an_ipv4_mapped_peer_is_matched_as_ipv4() {
        let req = request("[::ffff:203.0.113.9]:1000", None);
        assert!(office().allows_ip(&PeerIp, &RequestHead::new(&req)));
        let req = request("[::ffff:198.51.100.9]:1000", None);
        assert!(!office().allows_ip(&PeerIp, &RequestHead::new(&req)));
    }

    #[test]
    fn a_mapped_range_is_the_ipv4_range_it_maps() {
        let mut list: AllowList<()> = AllowList::default();
        list.add_ip("::ffff:203.0.113.0/120").unwrap();
        let req = request("203.0.113.77:1000", None);
        assert!(list.allows_ip(&PeerIp, &RequestHead::new(&req)));
    }

    #[test]
    fn a_forwarded_header_is_read_only_through_the_extractor_that_trusts_it() {
        // A client outside the office claims an office address.
        let spoofed = request("198.51.100.9:1000", Some("203.0.113.9"));
        let head = RequestHead::new(&spoofed);
        assert!(!office().allows_ip(&PeerIp, &head));
        assert!(!office().allows_ip(&Header::new("x-api-key"), &head));
        // ClientIp reads the header only from a trusted proxy; this peer is not one.
        let behind = ClientIp::new().trust_proxy("10.0.0.0/8");
        assert!(!office().allows_ip(&behind, &head));
        // The same header through our proxy is the client's address.
        let proxied = request("10.0.0.2:1000", Some("203.0.113.9"));
        assert!(office().allows_ip(&behind, &RequestHead::new(&proxied)));
        // Also as a part of a tuple or an `or`, whatever its position.
        let tuple = (Header::new("x-user"), behind.clone());
        assert!(office().allows_ip(&tuple, &RequestHead::new(&proxied)));
        let either = Header::new("x-user").or(behind);
        assert!(office().allows_ip(&either, &RequestHead::new(&proxied)));
        // Without trust, the proxy itself is the client, and it is not in the office.
        assert!(!office().allows_ip(&PeerIp, &RequestHead::new(&proxied)));
    }

    #[test]
    fn no_address_is_never_allowed() {
        let req = http::Request::new(());
        assert!(!office().allows_ip(&PeerIp, &RequestHead::new(&req)));
    }

    #[test]
    fn bad_entries_are_reported_and_keys_do_not_follow_a_new_key_type() {
        let mut list: AllowList<u32> = AllowList::default();
        assert_eq!(
            list.add_ip("10.0.0.0/33"),
            Err(ConfigError::InvalidAllowedIp("10.0.0.0/33".into()))
        );
        list.add_ip("10.0.0.0/8").unwrap();
        list.add_key(7);
        assert!(list.allows_key(&7) && !list.allows_key(&8));
        let (moved, lost): (AllowList<String>, bool) = list.rekey();
        assert!(lost && moved.has_ips());
    }
}
