//! Private keys at rest: the key of a secrets key file (the control plane's
//! `--secrets-key-file`, the auth service's `--keys-secret-file`) and the
//! AEAD that seals private keys in the database: certificates' keys in the
//! control plane's versions, signing keys in the auth service's table.
//!
//! * The key file holds 32 bytes: 64 hex digits (surrounding whitespace
//!   ignored, e.g. `openssl rand -hex 32 > secrets.key`) or the 32 raw bytes.
//! * Each private key is sealed with AES-256-GCM (ring) under that key, with a
//!   fresh 96-bit nonce from the OS for every record, stored beside the
//!   ciphertext, and the owner's name (a certificate's name, a signing key's
//!   kid) as associated data: a sealed key moved to another name does not open. Every commit seals
//!   the keys of its version again; random nonces stay safe for 2^32 seals
//!   per key (NIST SP 800-38D), billions of commits away.
//! * The database keeps one check value sealed with the key (table
//!   `secrets_key_check`), written with the first private key ever stored, so
//!   a start with another key file, or none, is refused before anything is
//!   served (the control plane's `Store::open_with`).
//!
//! Neither the key nor a plaintext ever appears in a log line or an error.

use std::fmt;
use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};

/// Bytes in a secrets key.
pub const SECRETS_KEY_LEN: usize = 32;

/// Associated data of the check value (no certificate name can be it: names
/// have no spaces).
const CHECK_AAD: &[u8] = b"gateway secrets key check";
/// Plaintext of the check value.
const CHECK_PLAINTEXT: &[u8] = b"gateway secrets key v1";

/// The key that seals private keys in the database. Its `Debug` shows nothing of it.
pub struct SecretsKey {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

/// One sealed secret as the database stores it (a protobuf message inside
/// the stored configuration; see `migrations/0003_certificates.sql`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SealedKey {
    /// The certificate the key belongs to: the associated data.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The 12-byte nonce it was sealed with.
    #[prost(bytes = "vec", tag = "2")]
    pub nonce: Vec<u8>,
    /// Ciphertext and the 16-byte tag.
    #[prost(bytes = "vec", tag = "3")]
    pub ciphertext: Vec<u8>,
}

/// Why the key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretsKeyError {
    /// The file cannot be read.
    #[error("cannot read secrets key file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not hold a key.
    #[error(
        "secrets key file {path} must hold 32 bytes: 64 hex digits (e.g. `openssl rand -hex 32 > {name}`) or the 32 raw bytes; it holds {len} bytes that are neither"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// Its file name, for the example command.
        name: String,
        /// Its length.
        len: usize,
    },
}

/// A sealed value that does not open: another key, another name, or
/// tampered bytes (AES-GCM cannot tell which).
#[derive(Debug, thiserror::Error)]
#[error("cannot be decrypted with this secrets key (another key, or altered data)")]
pub struct OpenError;

impl SecretsKey {
    /// A key from its bytes (which must be secret and random).
    pub fn from_bytes(bytes: &[u8; SECRETS_KEY_LEN]) -> Self {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes)
            .expect("AES-256-GCM takes exactly 32 bytes of key");
        SecretsKey {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        }
    }

    /// Reads the key file: 64 hex digits (whitespace around them ignored) or 32 raw bytes.
    pub fn load(path: &Path) -> Result<Self, SecretsKeyError> {
        let bytes = std::fs::read(path).map_err(|source| SecretsKeyError::Read {
            path: path.to_owned(),
            source,
        })?;
        let hex = std::str::from_utf8(&bytes)
            .ok()
            .map(str::trim)
            .filter(|t| t.len() == 2 * SECRETS_KEY_LEN)
            .and_then(|t| gateway_hex::decode(t).ok());
        let raw = match hex {
            Some(decoded) => decoded,
            None if bytes.len() == SECRETS_KEY_LEN => bytes,
            None => {
                return Err(SecretsKeyError::Format {
                    path: path.to_owned(),
                    name: path
                        .file_name()
                        .map_or_else(|| "secrets.key".into(), |n| n.to_string_lossy().into()),
                    len: bytes.len(),
                });
            }
        };
        let key: [u8; SECRETS_KEY_LEN] = raw
            .try_into()
            .expect("both branches hold exactly SECRETS_KEY_LEN bytes");
        warn_if_readable_by_others(path);
        Ok(SecretsKey::from_bytes(&key))
    }

    /// Seals `plaintext` for the certificate `name`.
    pub fn seal(&self, name: &str, plaintext: &[u8]) -> SealedKey {
        let (nonce, ciphertext) = self.seal_with(name.as_bytes(), plaintext);
        SealedKey {
            name: name.to_owned(),
            nonce,
            ciphertext,
        }
    }

    /// Opens what [`SecretsKey::seal`] sealed.
    pub fn open(&self, sealed: &SealedKey) -> Result<Vec<u8>, OpenError> {
        self.open_with(sealed.name.as_bytes(), &sealed.nonce, &sealed.ciphertext)
    }

    /// Seals `plaintext` with `owner` (a signing key's kid) as associated data: (nonce, ciphertext).
    pub fn seal_bytes(&self, owner: &[u8], plaintext: &[u8]) -> (Vec<u8>, Vec<u8>) {
        self.seal_with(owner, plaintext)
    }

    /// Opens what [`SecretsKey::seal_bytes`] sealed for `owner`.
    pub fn open_bytes(
        &self,
        owner: &[u8],
        nonce: &[u8],
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, OpenError> {
        self.open_with(owner, nonce, ciphertext)
    }

    /// A fresh check value: (nonce, ciphertext) of a fixed plaintext.
    pub fn check_value(&self) -> (Vec<u8>, Vec<u8>) {
        self.seal_with(CHECK_AAD, CHECK_PLAINTEXT)
    }

    /// Whether `(nonce, ciphertext)` is a check value made with this key.
    pub fn verifies(&self, nonce: &[u8], ciphertext: &[u8]) -> bool {
        self.open_with(CHECK_AAD, nonce, ciphertext)
            .is_ok_and(|p| p == CHECK_PLAINTEXT)
    }

    fn seal_with(&self, aad: &[u8], plaintext: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("the OS random number generator failed");
        let mut in_out = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut in_out,
            )
            .expect("AES-GCM seals any input shorter than 64 GiB");
        (nonce.to_vec(), in_out)
    }

    fn open_with(&self, aad: &[u8], nonce: &[u8], ciphertext: &[u8]) -> Result<Vec<u8>, OpenError> {
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| OpenError)?;
        let mut in_out = ciphertext.to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut in_out,
            )
            .map_err(|_| OpenError)?;
        Ok(plain.to_vec())
    }
}

/// A key file others can read protects nothing: say so, loudly, once.
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the secrets key file is readable by other users; make it mode 0600 (chmod 600)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SecretsKey {
        SecretsKey::from_bytes(&[byte; SECRETS_KEY_LEN])
    }

    #[test]
    fn sealed_keys_open_only_with_the_same_key_and_name() {
        let k = key(1);
        let plain = b"-----BEGIN PRIVATE KEY-----\nMIG...\n";
        let a = k.seal("edge", plain);
        let b = k.seal("edge", plain);
        assert_ne!(a.nonce, b.nonce, "a fresh nonce per record");
        assert_ne!(a.ciphertext, b.ciphertext);
        assert_eq!(a.nonce.len(), NONCE_LEN);
        assert_eq!(a.ciphertext.len(), plain.len() + 16);
        assert!(!a.ciphertext.windows(10).any(|w| w == &plain[..10]));
        assert_eq!(k.open(&a).unwrap(), plain);
        assert!(key(2).open(&a).is_err(), "another key");
        let moved = SealedKey {
            name: "other".into(),
            ..a.clone()
        };
        assert!(k.open(&moved).is_err(), "the name is the associated data");
        let mut flipped = a.clone();
        flipped.ciphertext[0] ^= 1;
        assert!(k.open(&flipped).is_err(), "tampered");
        let short = SealedKey {
            nonce: vec![0; 3],
            ..a
        };
        assert!(k.open(&short).is_err());
    }

    #[test]
    fn the_check_value_tells_the_right_key() {
        let (nonce, sealed) = key(1).check_value();
        assert!(key(1).verifies(&nonce, &sealed));
        assert!(!key(2).verifies(&nonce, &sealed));
        assert_eq!(format!("{:?}", key(1)), "SecretsKey(..)");
    }

    #[test]
    fn key_files_are_hex_or_raw() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let hex = write("hex.key", format!("{}\n", "ab".repeat(32)).as_bytes());
        let raw = write("raw.key", &[0xab; 32]);
        let (nonce, sealed) = SecretsKey::load(&hex).unwrap().check_value();
        assert!(SecretsKey::load(&raw).unwrap().verifies(&nonce, &sealed));
        for (name, bytes) in [
            ("short.key", b"abcd".as_slice()),
            ("nothex.key", "zz".repeat(32).as_bytes()),
            ("long.key", &[1u8; 33]),
        ] {
            let e = SecretsKey::load(&write(name, bytes)).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("must hold 32 bytes: 64 hex digits"), "{text}");
            assert!(text.contains(name), "{text}");
        }
        let e = SecretsKey::load(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(e, SecretsKeyError::Read { .. }), "{e}");
    }
}
