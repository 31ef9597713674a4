//! [`RedisKey`]: how a limiter key is written into a Redis key name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::rc::Rc;
use std::sync::Arc;

/// Writes a limiter key as the bytes of a Redis key name.
///
/// The encoding must be unambiguous within one key type: two different keys must never write
/// the same bytes. Implemented for the key types of the built-in extractors (`()`, `IpKey`, `IpAddr`,
/// `Box<[u8]>`, `Arc<str>`), for strings, byte strings, integers and `bool`, and for tuples of
/// up to four of them, whose parts are each written as `<length>:<bytes>`.
///
/// The full name of a key is `<prefix><scope length>:<scope>:<key>`, e.g.
/// `tollgate:5:login:203.0.113.9` (see [`RedisStore::prefix`](super::RedisStore::prefix); the
/// scope is the policy's name, with a digest when it was not given, see
/// [`RedisRateLimiter`](super::RedisRateLimiter#keys)).
///
/// # Redis Cluster hash tags
/// Redis Cluster places a key by its hash tag, the bytes between its first `{` and the next
/// `}`, when there is one. The bytes of a limiter key come from clients, so they never form
/// one: when they contain a `{` (and the prefix and policy name contain none), the name gets
/// `{}` before them, e.g. `tollgate:5:login:{}{x}` for the key `{x}`, and Redis then hashes
/// the whole name, as for any other key. A client cannot pin its keys onto one node with a
/// tag. A prefix or policy name that has a `{` decides instead: a tag in them (`app{1}:`) puts
/// every key of the limiter in one slot, and an unclosed `{` is closed right after the policy
/// name (`tollgate:5:a{b:}:<key>`), which does the same.
///
/// ```
/// use tollgate::redis::RedisKey;
///
/// let mut out = Vec::new();
/// ("tenant", 42u64).write_key(&mut out);
/// assert_eq!(out, b"6:tenant2:42");
///
/// // A key type of your own: write something unique to it.
/// #[derive(Clone, PartialEq, Eq, Hash, Debug)]
/// struct UserId(u64);
/// impl RedisKey for UserId {
///     fn write_key(&self, out: &mut Vec<u8>) {
///         self.0.write_key(out)
///     }
/// }
/// ```
pub trait RedisKey {
    /// Appends this key's bytes to `out`.
    fn write_key(&self, out: &mut Vec<u8>);
}

impl<T: RedisKey + ?Sized> RedisKey for &T {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Box<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Arc<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Rc<T> {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl RedisKey for () {
    fn write_key(&self, _: &mut Vec<u8>) {}
}

impl RedisKey for [u8] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

impl RedisKey for Vec<u8> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self)
    }
}

impl RedisKey for str {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes())
    }
}

impl RedisKey for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes())
    }
}

impl RedisKey for bool {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.push(if *self { b'1' } else { b'0' })
    }
}

/// Writes `Display` output straight into the buffer.
fn write_display(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    use std::io::Write;
    // Writing into a `Vec` cannot fail.
    let _ = write!(out, "{v}");
}

macro_rules! display_key {
    ($($t:ty),*) => {$(
        impl RedisKey for $t {
            fn write_key(&self, out: &mut Vec<u8>) {
                write_display(out, self)
            }
        }
    )*};
}

// Decimal integers; addresses in their canonical text form (IPv6 compressed, lower case).
display_key!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);
display_key!(IpAddr, Ipv4Addr, Ipv6Addr, crate::key::IpKey);

/// `1:<first>` or `2:<second>`: the two sides of a fallback key never meet.
impl<A: RedisKey, B: RedisKey> RedisKey for crate::key::Either<A, B> {
    fn write_key(&self, out: &mut Vec<u8>) {
        match self {
            crate::key::Either::First(k) => {
                out.extend_from_slice(b"1:");
                k.write_key(out);
            }
            crate::key::Either::Second(k) => {
                out.extend_from_slice(b"2:");
                k.write_key(out);
            }
        }
    }
}

/// How the bytes of a limiter key are kept from forming a Redis Cluster hash tag, decided once
/// from the fixed part of the name (`<prefix><policy length>:<policy>:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TagGuard {
    /// No `{` in the fixed part: a key with a `{` gets `{}` first (an empty tag, so the whole
    /// name is hashed).
    EmptyTagBeforeBrace,
    /// The fixed part holds the first `{` and a `}` after it: the key cannot change the tag.
    Decided,
}

/// Makes the fixed part of a name safe for any key after it, and says what keys need: an
/// unclosed `{` in it is closed with `}` (appended), so that no `}` of a key can end a tag.
pub(crate) fn guard_fixed_part(fixed: &mut Vec<u8>) -> TagGuard {
    let Some(open) = fixed.iter().position(|&b| b == b'{') else {
        return TagGuard::EmptyTagBeforeBrace;
    };
    if !fixed[open..].contains(&b'}') {
        fixed.push(b'}');
    }
    TagGuard::Decided
}

/// Writes `key` after the fixed part already in `out`, so that its bytes never form a tag.
pub(crate) fn write_guarded(out: &mut Vec<u8>, key: &(impl RedisKey + ?Sized), guard: TagGuard) {
    let start = out.len();
    key.write_key(out);
    if guard == TagGuard::EmptyTagBeforeBrace && out[start..].contains(&b'{') {
        out.splice(start..start, *b"{}");
    }
}

/// Writes one part of a composite key as `<length>:<bytes>`.
fn write_part(out: &mut Vec<u8>, part: &impl RedisKey) {
    let start = out.len();
    part.write_key(out);
    let len = out.len() - start;
    let mut prefix = Vec::with_capacity(8);
    write_display(&mut prefix, len);
    prefix.push(b':');
    out.splice(start..start, prefix);
}

macro_rules! tuple_key {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: RedisKey),+> RedisKey for ($($name,)+) {
            fn write_key(&self, out: &mut Vec<u8>) {
                $(write_part(out, &self.$idx);)+
            }
        }
    };
}

tuple_key!(A 0);
tuple_key!(A 0, B 1);
tuple_key!(A 0, B 1, C 2);
tuple_key!(A 0, B 1, C 2, D 3);

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(k: impl RedisKey) -> Vec<u8> {
        let mut out = Vec::new();
        k.write_key(&mut out);
        out
    }

    #[test]
    fn built_in_key_types_write_readable_bytes() {
        assert_eq!(bytes(()), b"");
        assert_eq!(bytes("abc"), b"abc");
        assert_eq!(bytes(Box::<[u8]>::from(&b"k\x00y"[..])), b"k\x00y");
        assert_eq!(bytes(Arc::<str>::from("/users/{id}")), b"/users/{id}");
        assert_eq!(bytes(IpAddr::from([203, 0, 113, 9])), b"203.0.113.9");
        // PeerIp's key writes the same bytes as the address it stands for.
        let ip = crate::key::IpKey::from(IpAddr::from([203, 0, 113, 9]));
        assert_eq!(bytes(ip), b"203.0.113.9");
        assert_eq!(
            bytes("2001:db8::1".parse::<IpAddr>().unwrap()),
            b"2001:db8::1"
        );
        assert_eq!(bytes(-42i64), b"-42");
    }

    /// The bytes Redis Cluster hashes for a key name: its hash tag, or the whole name.
    fn hashed(name: &[u8]) -> &[u8] {
        if let Some(open) = name.iter().position(|&b| b == b'{') {
            if let Some(len) = name[open + 1..].iter().position(|&b| b == b'}') {
                if len > 0 {
                    return &name[open + 1..open + 1 + len];
                }
            }
        }
        name
    }

    fn guarded(fixed: &[u8], key: &(impl RedisKey + ?Sized)) -> Vec<u8> {
        let mut out = fixed.to_vec();
        let guard = guard_fixed_part(&mut out);
        write_guarded(&mut out, key, guard);
        out
    }

    #[test]
    fn key_bytes_never_form_a_hash_tag() {
        for key in [
            "{victim}", "a{b}c", "{", "}", "{}", "}{x}", "{{a}}", "plain",
        ] {
            let name = guarded(b"tollgate:3:api:", key);
            assert_eq!(hashed(&name), &name[..], "{key}: the whole name is hashed");
        }
        assert_eq!(guarded(b"t:1:a:", "{victim}"), b"t:1:a:{}{victim}");
        // Without a `{`, a key's name is as before.
        assert_eq!(guarded(b"t:1:a:", "a}b"), b"t:1:a:a}b");
        assert_eq!(guarded(b"t:1:a:", &("{x}", 1u8)), b"t:1:a:{}3:{x}1:1");
    }

    #[test]
    fn a_tag_in_the_prefix_or_name_decides_the_slot_for_every_key() {
        for key in ["{victim}", "}", "x}{y}", "plain"] {
            assert_eq!(hashed(&guarded(b"app{7}:3:api:", key)), b"7");
            // An unclosed `{` is closed before the key, so the key cannot end the tag.
            assert_eq!(hashed(&guarded(b"t:3:a{b:", key)), b"b:");
            assert_eq!(
                hashed(&guarded(b"{}t:1:a:", key)),
                &guarded(b"{}t:1:a:", key)[..]
            );
        }
    }

    #[test]
    fn guarded_names_of_different_keys_never_collide() {
        let keys = ["", "{", "{}", "{}{", "a", "{}a", "{a", "}", "{{}}", "{}{}"];
        let mut names: Vec<Vec<u8>> = keys.iter().map(|k| guarded(b"p:", *k)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), keys.len());
    }

    #[test]
    fn tuple_parts_are_length_prefixed_so_splits_never_collide() {
        assert_eq!(bytes(("a:b", "c")), b"3:a:b1:c");
        assert_ne!(bytes(("ab", "c")), bytes(("a", "bc")));
        assert_ne!(bytes(("1:a", "")), bytes(("", "a")));
        assert_eq!(bytes((1u8, (), "x")), b"1:10:1:x");
    }
}
