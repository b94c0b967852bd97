//! An agent's identity: its Ed25519 key and DID, kept in a 0600 key file.
//!
//! ```
//! use scd_did::Identity;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("identity.json");
//! let id = Identity::load_or_create(&path).unwrap();
//! assert_eq!(Identity::load_or_create(&path).unwrap().did(), id.did());
//! assert!(format!("{id:?}").contains(id.did()));
//! ```

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::document::{did_document_to_json, wba_document_path, VERIFICATION_METHOD_TYPE};
use crate::error::{Error, Result};
use crate::key::{did_key, key_multibase};
use crate::pb;

/// The identity file's JSON (the key is base58btc; the file is mode 0600).
#[derive(Serialize, Deserialize)]
struct IdentityFile {
    did: String,
    ed25519_secret_key: String,
}

/// An agent's Ed25519 signing key and DID. `Debug` and `Display` show the
/// DID only, never the key.
pub struct Identity {
    key: SigningKey,
    did: String,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("did", &self.did).finish_non_exhaustive()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.did)
    }
}

impl Identity {
    /// A fresh random key with its `did:key`.
    pub fn generate() -> Identity {
        Identity::from_signing_key(SigningKey::from_bytes(&rand::random()))
    }

    /// The identity of an existing key, as its `did:key`.
    pub fn from_signing_key(key: SigningKey) -> Identity {
        let did = did_key(&key.verifying_key());
        Identity { key, did }
    }

    /// The same key under a `did:wba` DID (its document must then list this
    /// key, see [`Identity::write_wba_document`]); or under its own did:key.
    pub fn with_did(self, did: &str) -> Result<Identity> {
        if did.starts_with("did:wba:") {
            wba_document_path(Path::new("."), did)?;
        } else if did != did_key(&self.verifying_key()) {
            return Err(Error::Did { did: did.to_string(), reason: "neither a did:wba nor this key's did:key".into() });
        }
        Ok(Identity { key: self.key, did: did.to_string() })
    }

    /// Loads the identity at `path` (JSON: `did`, `ed25519_secret_key`), or
    /// creates one (a new did:key) there on first start, with mode 0600.
    /// An existing file that others may read (any group/other permission
    /// bit) is refused, as ssh refuses such a key.
    pub fn load_or_create(path: &Path) -> Result<Identity> {
        let io = |source| Error::Io { path: path.to_path_buf(), source };
        match std::fs::read(path) {
            Ok(bytes) => {
                Self::check_mode(path)?;
                let bad = |reason: String| Error::IdentityFile { path: path.to_path_buf(), reason };
                let file: IdentityFile =
                    serde_json::from_slice(&bytes).map_err(|e| bad(format!("not identity JSON: {e}")))?;
                let secret = bs58::decode(&file.ed25519_secret_key)
                    .into_vec()
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| bad("ed25519_secret_key is not 32 base58btc bytes".into()))?;
                let identity = Identity::from_signing_key(SigningKey::from_bytes(&secret));
                let identity = identity
                    .with_did(&file.did)
                    .map_err(|_| bad(format!("did {} is not this key's did:key nor a did:wba", file.did)))?;
                tracing::debug!(did = %identity.did, path = %path.display(), "identity loaded");
                Ok(identity)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let identity = Identity::generate();
                identity.save_new(path).map_err(io)?;
                tracing::info!(did = %identity.did, path = %path.display(), "identity created");
                // Two processes may race to create it: the file that won is the identity.
                Self::load_or_create(path)
            }
            Err(e) => Err(io(e)),
        }
    }

    #[cfg(unix)]
    fn check_mode(path: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|source| Error::Io { path: path.to_path_buf(), source })?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(Error::IdentityFile {
                path: path.to_path_buf(),
                reason: format!("mode {:04o} lets others read the key (limit 0600: chmod 600 it)", mode & 0o7777),
            });
        }
        Ok(())
    }

    #[cfg(not(unix))]
    fn check_mode(_path: &Path) -> Result<()> {
        Ok(())
    }

    /// Writes the file under a temporary name (mode 0600) and links it into
    /// place, so a crash never leaves half a key and a racing creator never
    /// overwrites the winner's key.
    fn save_new(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file =
            IdentityFile { did: self.did.clone(), ed25519_secret_key: bs58::encode(self.key.to_bytes()).into_string() };
        let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let _ = std::fs::remove_file(&tmp);
        let mut f = options.open(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        drop(f);
        let linked = std::fs::hard_link(&tmp, path);
        std::fs::remove_file(&tmp)?;
        match linked {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// This agent's DID.
    pub fn did(&self) -> &str {
        &self.did
    }

    /// This agent on the wire (`uuid` = DID).
    pub fn agent_id(&self) -> pb::AgentId {
        pb::AgentId { uuid: self.did.clone() }
    }

    /// The public key.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// Signs raw bytes (64-byte Ed25519 signature).
    pub fn sign_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        self.key.sign(bytes).to_bytes().to_vec()
    }

    /// This agent's DID document (one Ed25519 verification method, used for
    /// authentication and assertions).
    pub fn did_document(&self) -> pb::DidDocument {
        let multibase = key_multibase(&self.verifying_key());
        let method_id = match self.did.strip_prefix("did:key:") {
            Some(mb) => format!("{}#{mb}", self.did),
            None => format!("{}#key-1", self.did),
        };
        pb::DidDocument {
            id: self.did.clone(),
            verification_method: vec![pb::VerificationMethod {
                id: method_id.clone(),
                r#type: VERIFICATION_METHOD_TYPE.into(),
                controller: self.did.clone(),
                public_key_multibase: multibase,
            }],
            authentication: vec![method_id.clone()],
            assertion_method: vec![method_id],
        }
    }

    /// The JSON form of [`Identity::did_document`], for `/.well-known/did.json`.
    pub fn did_document_json(&self) -> serde_json::Value {
        did_document_to_json(&self.did_document())
    }

    /// Writes this identity's DID document where a DID resolver with
    /// `dir` looks for it (see [`wba_document_path`]); the DID must be a did:wba.
    pub fn write_wba_document(&self, dir: &Path) -> Result<PathBuf> {
        let path = wba_document_path(dir, &self.did)?;
        let io = |source| Error::Io { path: path.clone(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let json = serde_json::to_vec_pretty(&self.did_document_json()).expect("a JSON value serializes");
        std::fs::write(&path, json).map_err(io)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn identity_file_is_created_0600_and_loads_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/identity.json");
        let first = Identity::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Identity::load_or_create(&path).unwrap();
        assert_eq!(again.did(), first.did());
        assert_eq!(again.verifying_key(), first.verifying_key());
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temp file left");

        // Debug and Display never show the key, in hex or base58.
        let secret = first.key.to_bytes();
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let b58 = bs58::encode(secret).into_string();
        for shown in [format!("{first:?}"), format!("{first}"), format!("{first:#?}")] {
            assert!(shown.contains(first.did()), "{shown}");
            assert!(!shown.to_lowercase().contains(&hex) && !shown.contains(&b58), "{shown}");
            assert!(!shown.contains(&format!("{:?}", &secret[..8])), "{shown}");
        }
        assert!(std::fs::read_to_string(&path).unwrap().contains(&b58));

        // A key file others can read is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Identity::load_or_create(&path).unwrap_err();
        assert!(err.to_string().contains("mode 0644 lets others read the key"), "{err}");
    }

    #[test]
    fn identity_file_with_a_mismatched_did_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity.json");
        let a = Identity::load_or_create(&path).unwrap();
        let b = Identity::generate();
        let text = std::fs::read_to_string(&path).unwrap().replace(a.did(), b.did());
        std::fs::write(&path, text).unwrap();
        let err = Identity::load_or_create(&path).unwrap_err();
        assert!(matches!(err, Error::IdentityFile { .. }), "{err}");
    }
}
