//! Ranges of addresses (CIDR), as trusted proxies are given.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A range of addresses, `a.b.c.d/n` or `x:x::x/n`; a bare address is a range of one.
///
/// Host bits below the prefix are ignored (`10.1.2.3/8` is `10.0.0.0/8`). An IPv4-mapped IPv6
/// range of at least /96 is stored as the IPv4 range it maps, because addresses are compared
/// in their canonical form (IPv4-mapped IPv6 as IPv4).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    /// The network address, host bits cleared.
    net: IpAddr,
    /// The prefix length, at most 32 for IPv4 and 128 for IPv6.
    len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d`, `a.b.c.d/n` (n ≤ 32), `x:x::x`, `x:x::x/n` (n ≤ 128) or `[x:x::x]`,
    /// surrounding whitespace allowed. `None` for anything else.
    pub(crate) fn parse(s: &str) -> Option<Cidr> {
        let s = s.trim();
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s, None),
        };
        let addr = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .map_or_else(
                || addr.parse::<IpAddr>().ok(),
                |a| a.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
            )?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            // Digits only: `u8::from_str` would also take "+8".
            Some(l) if !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit()) => {
                l.parse::<u8>().ok().filter(|&l| l <= max)?
            }
            Some(_) => return None,
        };
        Some(Cidr::new(addr, len))
    }

    pub(super) fn new(addr: IpAddr, len: u8) -> Cidr {
        match addr {
            IpAddr::V4(v4) => Cidr {
                net: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(len))),
                len,
            },
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) if len >= 96 => Cidr::new(IpAddr::V4(v4), len - 96),
                _ => Cidr {
                    net: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(len))),
                    len,
                },
            },
        }
    }

    /// Whether `ip` (in canonical form: IPv4-mapped IPv6 as IPv4) is in the range.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => u32::from(ip) & mask32(self.len) == u32::from(net),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.len) == u128::from(net)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The netmask of an IPv4 prefix of `len` bits (`len` above 32 means 32).
pub(super) fn mask32(len: u8) -> u32 {
    match len {
        0 => 0,
        l => u32::MAX << (32 - u32::from(l.min(32))),
    }
}

/// The netmask of an IPv6 prefix of `len` bits (`len` above 128 means 128).
pub(super) fn mask128(len: u8) -> u128 {
    match len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l.min(128))),
    }
}
