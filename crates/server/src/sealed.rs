//! Secrets at rest: tenants' registry passwords and webhooks' signing
//! secrets are kept in the store sealed with a key of the server's
//! (`--secret-key-file`), so that a copy of the database (a backup, a
//! replica, a stolen disk) does not give them away.
//!
//! A sealed value is `ebb-sealed:v1:<key id>:<base64 of nonce and
//! ciphertext>`: ChaCha20-Poly1305 (ring's), a random 96-bit nonce each
//! time, and the row it belongs to as associated data, so that a sealed
//! value moved to another row does not open. The key id (8 hex digits of
//! a hash of the key) says which key sealed it: a server given another
//! key refuses to start rather than serve without its secrets. A value
//! an earlier release stored in the clear opens as it is, and start-up
//! seals it.

use std::path::Path;
use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};

const PREFIX: &str = "ebb-sealed:v1:";

/// The server's key for secrets at rest.
#[derive(Clone)]
pub struct SecretKey {
    key: Arc<LessSafeKey>,
    id: String,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.id)
    }
}

/// A stored value, opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    Sealed(String),
    /// Stored in the clear by an earlier release: to be sealed.
    Clear(String),
}

/// Why a stored sealed value did not open: `row` is the row it was
/// stored in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsealable {
    #[error("{row}: a sealed value without its key id")]
    NoKeyId { row: String },
    #[error(
        "{row}: sealed with key {id}, and this server's --secret-key-file is key {ours}: give every server \
         of the cluster the same key file"
    )]
    OtherKey { row: String, id: String, ours: String },
    #[error("{row}: a sealed value that is not base64")]
    NotBase64 { row: String },
    #[error("{row}: a sealed value too short")]
    TooShort { row: String },
    #[error("{row}: a bad nonce")]
    BadNonce { row: String },
    #[error("{row}: a sealed value that does not open (damaged, or another row's)")]
    DoesNotOpen { row: String },
    #[error("{row}: not text once opened")]
    NotText { row: String },
}

/// Why the key file could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("--secret-key-file {}: {source}", path.display())]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("--secret-key-file {}: the system's random source: {why}", path.display())]
    Entropy { path: std::path::PathBuf, why: getrandom::Error },
    #[error("--secret-key-file {}: not a key: 64 hex digits (32 bytes) on one line", path.display())]
    NotAKey { path: std::path::PathBuf },
}

impl Opened {
    pub fn value(self) -> String {
        match self {
            Opened::Sealed(v) | Opened::Clear(v) => v,
        }
    }
}

impl SecretKey {
    pub fn from_bytes(bytes: [u8; 32]) -> SecretKey {
        use sha2::Digest;
        let hash = sha2::Sha256::new().chain_update(b"ebb secret key id\0").chain_update(bytes).finalize();
        let id = ebb_api::hex(&hash[..4]);
        let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &bytes).expect("a 32-byte key"));
        SecretKey { key: Arc::new(key), id }
    }

    /// The key in `path` (32 random bytes, hex), made there (0600) if
    /// the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<SecretKey, KeyFileError> {
        let io = |source| KeyFileError::Io { path: path.to_path_buf(), source };
        if !path.exists() {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes)
                .map_err(|why| KeyFileError::Entropy { path: path.to_path_buf(), why })?;
            let hex = ebb_api::hex(&bytes);
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            file.write_all(format!("{hex}\n").as_bytes()).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let text = text.trim();
        let bytes: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect::<Option<_>>()
            .filter(|b: &Vec<u8>| b.len() == 32)
            .ok_or_else(|| KeyFileError::NotAKey { path: path.to_path_buf() })?;
        Ok(SecretKey::from_bytes(bytes.try_into().expect("32 bytes")))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `value` sealed for the row `row` (its kind and key, as text).
    pub fn seal(&self, value: &str, row: &str) -> String {
        use base64::Engine;
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the system's random source");
        let mut sealed = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(row.as_bytes()),
                &mut sealed,
            )
            .expect("sealing cannot fail for values this size");
        let mut both = nonce.to_vec();
        both.extend(sealed);
        format!("{PREFIX}{}:{}", self.id, base64::engine::general_purpose::STANDARD_NO_PAD.encode(both))
    }

    /// A stored value of the row `row`, opened; an error names what is
    /// wrong (another key's, or damaged).
    pub fn open(&self, stored: &str, row: &str) -> Result<Opened, Unsealable> {
        use base64::Engine;
        let Some(rest) = stored.strip_prefix(PREFIX) else { return Ok(Opened::Clear(stored.to_string())) };
        let named = || row.to_string();
        let (id, body) = rest.split_once(':').ok_or_else(|| Unsealable::NoKeyId { row: named() })?;
        if id != self.id {
            return Err(Unsealable::OtherKey { row: named(), id: id.to_string(), ours: self.id.clone() });
        }
        let mut both = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(body)
            .map_err(|_| Unsealable::NotBase64 { row: named() })?;
        if both.len() < NONCE_LEN {
            return Err(Unsealable::TooShort { row: named() });
        }
        let mut sealed = both.split_off(NONCE_LEN);
        let nonce =
            Nonce::try_assume_unique_for_key(&both).map_err(|_| Unsealable::BadNonce { row: named() })?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(row.as_bytes()), &mut sealed)
            .map_err(|_| Unsealable::DoesNotOpen { row: named() })?;
        String::from_utf8(plain.to_vec())
            .map(Opened::Sealed)
            .map_err(|_| Unsealable::NotText { row: named() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_with_its_key_and_row_only() {
        let key = SecretKey::from_bytes([7; 32]);
        let sealed = key.seal("hunter2", "login:1:registry.example.com");
        assert!(sealed.starts_with(&format!("ebb-sealed:v1:{}:", key.id())) && !sealed.contains("hunter2"));
        assert_ne!(sealed, key.seal("hunter2", "login:1:registry.example.com"), "a nonce each time");
        assert_eq!(key.open(&sealed, "login:1:registry.example.com"), Ok(Opened::Sealed("hunter2".into())));
        let moved = key.open(&sealed, "login:2:registry.example.com");
        assert_eq!(moved, Err(Unsealable::DoesNotOpen { row: "login:2:registry.example.com".into() }));
        assert!(moved.unwrap_err().to_string().contains("another row's"));
        let other = SecretKey::from_bytes([8; 32]);
        let refused = other.open(&sealed, "login:1:registry.example.com").unwrap_err();
        assert!(matches!(&refused, Unsealable::OtherKey { id, .. } if id == key.id()), "{refused:?}");
        assert!(refused.to_string().contains("same key file"), "{refused}");
        assert_eq!(key.open("whsec_clear", "webhook:1"), Ok(Opened::Clear("whsec_clear".into())));
        for damaged in
            ["ebb-sealed:v1:", &format!("ebb-sealed:v1:{}:!!", key.id()), &sealed[..sealed.len() - 2]]
        {
            assert!(key.open(damaged, "login:1:registry.example.com").is_err(), "{damaged}");
        }
    }

    #[test]
    fn a_key_file_is_made_0600_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ebb-sealed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret.key");
        let _ = std::fs::remove_file(&path);
        let made = SecretKey::load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = SecretKey::load_or_create(&path).unwrap();
        assert_eq!(made.id(), again.id());
        std::fs::write(&path, "not hex\n").unwrap();
        let refused = SecretKey::load_or_create(&path).unwrap_err();
        assert!(
            matches!(refused, KeyFileError::NotAKey { .. }) && refused.to_string().contains("64 hex digits")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest::proptest! {
        /// Whatever the database holds, opening it answers without
        /// panicking.
        #[test]
        fn any_stored_text_opens_or_is_refused(text in ".{0,120}", tail in "[A-Za-z0-9+/]{0,60}") {
            let key = SecretKey::from_bytes([7; 32]);
            let _ = key.open(&text, "row");
            let _ = key.open(&format!("ebb-sealed:v1:{}:{tail}", key.id()), "row");
        }
    }
}
