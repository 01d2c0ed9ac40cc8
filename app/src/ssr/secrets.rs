//! Secrets Vaultcap issues (vault keys, API tokens): shown once, stored as
//! a SHA-256 hash. They carry about 238 bits of randomness, so a fast hash
//! is safe and lets a lookup be one index probe.

use std::fmt;

use rand::{distributions::Alphanumeric, Rng};
use sha2::{Digest, Sha256};

/// How many characters of a secret (after its kind prefix) are kept to
/// show which secret is which.
const SHOWN_CHARS: usize = 8;
/// The longest prefix ever kept, whatever was presented.
pub const MAX_PREFIX_CHARS: usize = 12;

/// A freshly generated secret. Its `Debug` never prints the plaintext.
pub struct Secret {
    pub plaintext: String,
    pub hash: Vec<u8>,
    /// The part that may be shown again, e.g. `vk_4fZq81Ab`.
    pub prefix: String,
}

impl Secret {
    /// `kind` starts the secret so people and secret scanners can tell
    /// what it is: `vk_` for vault keys, `vct_` for API tokens.
    pub fn generate(kind: &str) -> Self {
        let body: String = rand::thread_rng()
            .sample_iter(Alphanumeric)
            .take(40)
            .map(char::from)
            .collect();
        let plaintext = format!("{kind}{body}");
        Self {
            hash: hash(&plaintext),
            prefix: prefix(&plaintext),
            plaintext,
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

pub fn hash(plaintext: &str) -> Vec<u8> {
    Sha256::digest(plaintext.as_bytes()).to_vec()
}

/// The shown part of a presented secret, for the audit log even when the
/// secret is unknown (never more than the kind and a few characters, and
/// at most [`MAX_PREFIX_CHARS`] in all).
pub fn prefix(plaintext: &str) -> String {
    let kind_len = plaintext.find('_').map(|i| i + 1).unwrap_or(0);
    plaintext
        .chars()
        .take(MAX_PREFIX_CHARS.min(kind_len + SHOWN_CHARS))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_long_random_and_hashed() {
        let (a, b) = (Secret::generate("vk_"), Secret::generate("vk_"));
        assert_ne!(a.plaintext, b.plaintext);
        assert_eq!(a.plaintext.len(), 43);
        assert_eq!(a.hash, hash(&a.plaintext));
        assert_eq!(a.prefix.len(), 11);
        assert!(a.plaintext.starts_with(&a.prefix));
        assert!(!format!("{a:?}").contains(&a.plaintext));
    }

    #[test]
    fn a_presented_prefix_never_exceeds_twelve_characters() {
        assert_eq!(prefix("vct_abcdefghijkl"), "vct_abcdefgh");
        assert_eq!(prefix("sk_live_0123456789"), "sk_live_012");
        assert_eq!(prefix(&format!("{}_rest", "x".repeat(100))), "x".repeat(12));
        assert_eq!(prefix("short"), "short");
    }
}
