//! Keys of bounded size: what a client sends cannot make one tracked key cost more than a few
//! dozen bytes.
//!
//! A value longer than [`MAX_KEY_BYTES`] is kept as its SHA-256 digest behind a marker that no
//! short value can hold (a `NUL` byte, which HTTP header values and URI paths never contain).
//! So:
//!
//! * two distinct values never share a bucket: short values are kept whole, long ones differ
//!   in their digest (finding two values with one digest is beyond reach), and no short value
//!   equals a digest;
//! * the rule is the same in every process and every version of the crate, so instances that
//!   share a Redis store agree on every key;
//! * a tracked key holds at most `MAX_KEY_BYTES` bytes of key value, whatever the client
//!   sends (a digest is 33 bytes, or 72 as text).

use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The longest key value kept as it is; a longer one is kept as a 33-byte digest.
pub const MAX_KEY_BYTES: usize = 64;

/// The first byte of a digest key; never the first byte of a value kept whole.
const DIGEST_MARK: u8 = 0;

/// `value` if it is at most [`MAX_KEY_BYTES`] long and does not start with `NUL`, else a
/// 33-byte key: `NUL` then the SHA-256 digest of `value`.
///
/// For keys made with [`from_fn`](super::from_fn) from client bytes:
///
/// ```
/// use tollgate::key::{bounded_bytes, MAX_KEY_BYTES};
///
/// let short = bounded_bytes(b"key-123");
/// assert_eq!(&*short, b"key-123");
/// let long = bounded_bytes(&[b'a'; 16 * 1024]);
/// assert_eq!(long.len(), 33);
/// assert!(long.len() <= MAX_KEY_BYTES);
/// ```
pub fn bounded_bytes(value: &[u8]) -> Box<[u8]> {
    if value.len() <= MAX_KEY_BYTES && value.first() != Some(&DIGEST_MARK) {
        return value.into();
    }
    let mut out = Vec::with_capacity(33);
    out.push(DIGEST_MARK);
    out.extend_from_slice(&Sha256::digest(value));
    out.into_boxed_slice()
}

/// As [`bounded_bytes`], for text: a long value becomes `NUL`, `sha256:` and 64 hex digits.
pub fn bounded_str(value: &str) -> Arc<str> {
    if value.len() <= MAX_KEY_BYTES && !value.starts_with('\0') {
        return Arc::from(value);
    }
    let mut out = String::with_capacity(72);
    out.push_str("\0sha256:");
    for b in Sha256::digest(value.as_bytes()) {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    Arc::from(out)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_kept_whole_and_long_ones_as_their_digest() {
        assert_eq!(&*bounded_bytes(b""), b"");
        assert_eq!(&*bounded_bytes(&[b'x'; 64]), &[b'x'; 64]);
        let long = bounded_bytes(&[b'x'; 65]);
        assert_eq!(long.len(), 33);
        assert_eq!(long[0], 0);
        // SHA-256("abc"), the standard's first test vector, for a value that starts with NUL.
        let mut v = b"\0".to_vec();
        v.extend_from_slice(b"abc");
        assert_eq!(bounded_bytes(&v).len(), 33);
        assert_eq!(&bounded_str(&"a".repeat(65))[..8], "\0sha256:",);
        assert_eq!(
            &bounded_str(&"abc".repeat(30))[8..],
            hex(&Sha256::digest("abc".repeat(30).as_bytes())),
        );
    }

    #[test]
    fn the_digest_is_sha256_so_every_process_agrees() {
        let key = bounded_bytes(&[b'a'; 100]);
        // echo -n "aaaa...(100)" | sha256sum
        assert_eq!(
            hex(&key[1..]),
            "2816597888e4a0d3a36b82b83316ab32680eb8f00f8cd3b904d681246d285a0e"
        );
    }

    #[test]
    fn distinct_long_values_keep_distinct_keys() {
        let a = bounded_bytes(&[b'a'; 1000]);
        let mut other = [b'a'; 1000];
        other[999] = b'b';
        assert_ne!(a, bounded_bytes(&other));
        assert_ne!(a, bounded_bytes(&[b'a'; 1001]));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
