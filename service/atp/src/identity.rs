//! Layer 1a: who sent this, and may I believe it.
//!
//! Every agent has an Ed25519 key pair and a DID: `did:key:z…` (self-
//! certifying: `z` + base58btc(0xed 0x01 ‖ 32-byte public key), so every
//! Ed25519 did:key starts with `did:key:z6Mk`) or `did:wba:host[:path]`
//! (a DID document; here resolved from a local directory only, never over
//! the network).
//!
//! **The signing rule.** A signed message is signed with the sender's key
//! over the message's *deterministic protobuf encoding with the signature
//! field(s) cleared*. The deterministic encoding is what prost's
//! `encode_to_vec` emits: fields in field-number order, proto3 defaults
//! omitted, no unknown fields (every protobuf library's deterministic mode
//! produces the same bytes). For [`pb::InteractionProof`] both `signature`
//! (the evaluator's) and `responder_signature` (the subject's) are cleared,
//! so both parties sign the same bytes. The sender is the message's `from`
//! (`evaluator` for a proof, `agent` for a checkpoint, `sender_did` for the
//! [`pb::AtpMessage`] envelope).
//!
//! A [`Verifier`] refuses, in this order, a message that is unsigned, names
//! no sender, whose sender does not resolve to a key, whose signature does
//! not verify (altered after signing, or signed by another key), whose
//! timestamp is more than [`MAX_CLOCK_SKEW_S`] from the receiver's clock, or
//! whose (sender, nonce) it has already seen. Each refusal is an
//! [`AuthFailure`] that names which, and becomes UNAUTHENTICATED on the wire.
//!
//! ```
//! use std::sync::Arc;
//! use scd_atp::identity::{DidResolver, Identity, MemoryNonceLog, Verifier};
//! use scd_atp::pb;
//!
//! let alice = Identity::generate();
//! let mut beat = pb::Heartbeat { from: Some(alice.agent_id()), sequence: 1, ..Default::default() };
//! alice.stamp_and_sign(&mut beat);
//!
//! let verifier = Verifier::new(Arc::new(DidResolver::new()), Arc::new(MemoryNonceLog::default()));
//! assert!(verifier.verify(&beat).is_ok());
//! // The same message again is a replay.
//! assert!(verifier.verify(&beat).unwrap_err().to_string().starts_with("replayed"));
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pb;

/// How far (seconds) a signed message's timestamp may be from the
/// receiver's clock, either way.
pub const MAX_CLOCK_SKEW_S: i64 = 60;

/// The multicodec prefix of an Ed25519 public key (0xed, varint-encoded).
pub const ED25519_MULTICODEC: [u8; 2] = [0xed, 0x01];

/// The verification method type of the keys in our DID documents.
pub const VERIFICATION_METHOD_TYPE: &str = "Ed25519VerificationKey2020";

/// Unix time now, whole seconds.
pub fn now_s() -> i64 {
    timestamp_now().seconds
}

/// Unix time now as a protobuf timestamp.
pub fn timestamp_now() -> pb::Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    pb::Timestamp { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: d.subsec_nanos() as i32 }
}

// ---------------------------------------------------------------------------
// DIDs

/// The multibase form (`z` + base58btc(0xed 0x01 ‖ pk)) of an Ed25519 key,
/// as used in `did:key` and in `publicKeyMultibase`.
pub fn key_multibase(vk: &VerifyingKey) -> String {
    let mut bytes = Vec::with_capacity(34);
    bytes.extend_from_slice(&ED25519_MULTICODEC);
    bytes.extend_from_slice(vk.as_bytes());
    format!("z{}", bs58::encode(bytes).into_string())
}

/// Decodes a `z…` multibase Ed25519 key (the inverse of [`key_multibase`]).
pub fn parse_key_multibase(multibase: &str) -> std::result::Result<VerifyingKey, String> {
    let b58 = multibase.strip_prefix('z').ok_or_else(|| "multibase key must start with 'z' (base58btc)".to_string())?;
    let bytes = bs58::decode(b58).into_vec().map_err(|e| format!("not base58btc: {e}"))?;
    if bytes.len() != 34 || bytes[..2] != ED25519_MULTICODEC {
        return Err(format!(
            "not an Ed25519 key: expected 0xed 0x01 + 32 bytes, got {} bytes starting {:02x?}",
            bytes.len(),
            &bytes[..bytes.len().min(2)]
        ));
    }
    let pk: [u8; 32] = bytes[2..].try_into().expect("length checked");
    VerifyingKey::from_bytes(&pk).map_err(|_| "not a valid Ed25519 point".to_string())
}

/// The `did:key` of an Ed25519 key: `did:key:z` + base58btc(0xed 0x01 ‖ pk).
pub fn did_key(vk: &VerifyingKey) -> String {
    format!("did:key:{}", key_multibase(vk))
}

/// The key inside a `did:key:z…` DID.
pub fn parse_did_key(did: &str) -> Result<VerifyingKey> {
    let rest = did
        .strip_prefix("did:key:")
        .ok_or_else(|| Error::Did { did: did.to_string(), reason: "not a did:key".into() })?;
    parse_key_multibase(rest).map_err(|reason| Error::Did { did: did.to_string(), reason })
}

/// Where a `did:wba` DID's document lies under `dir`: `did:wba:example.com`
/// → `<dir>/example.com/did.json`, `did:wba:example.com:user:alice` →
/// `<dir>/example.com/user/alice/did.json` (the did:wba method's
/// `/.well-known/did.json` and `/path/did.json`, mapped onto a directory).
/// Percent-encoded colons in the host (`example.com%3A3000`) are decoded.
/// Segments that could leave `dir` (`..`, `.`, empty, containing `/`, `\`
/// or NUL) are refused.
pub fn wba_document_path(dir: &Path, did: &str) -> Result<PathBuf> {
    let bad = |reason: &str| Error::Did { did: did.to_string(), reason: reason.to_string() };
    let rest = did.strip_prefix("did:wba:").ok_or_else(|| bad("not a did:wba"))?;
    let mut path = dir.to_path_buf();
    for segment in rest.split(':') {
        let segment = segment.replace("%3A", ":").replace("%3a", ":");
        if segment.is_empty()
            || segment == "."
            || segment == ".."
            || segment.contains(['/', '\\', '\0'])
            || segment.contains('%')
        {
            return Err(bad("path segment is empty, '.', '..' or contains '/', '\\', '%' or NUL"));
        }
        path.push(segment);
    }
    path.push("did.json");
    Ok(path)
}

/// The JSON form (W3C DID Core) of a DID document, as served at
/// `/.well-known/did.json`.
pub fn did_document_to_json(doc: &pb::DidDocument) -> serde_json::Value {
    let methods: Vec<serde_json::Value> = doc
        .verification_method
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.id,
                "type": m.r#type,
                "controller": m.controller,
                "publicKeyMultibase": m.public_key_multibase,
            })
        })
        .collect();
    serde_json::json!({
        "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/suites/ed25519-2020/v1"],
        "id": doc.id,
        "verificationMethod": methods,
        "authentication": doc.authentication,
        "assertionMethod": doc.assertion_method,
    })
}

/// Parses the JSON form of a DID document (the fields we use).
pub fn did_document_from_json(value: &serde_json::Value) -> std::result::Result<pb::DidDocument, String> {
    let text = |v: &serde_json::Value, key: &str| v.get(key).and_then(|s| s.as_str()).unwrap_or_default().to_string();
    let strings = |key: &str| -> Vec<String> {
        value
            .get(key)
            .and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| {
                        s.as_str()
                            .map(str::to_string)
                            .or_else(|| s.get("id").and_then(|i| i.as_str()).map(str::to_string))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let id = text(value, "id");
    if id.is_empty() {
        return Err("document has no \"id\"".into());
    }
    let verification_method = value
        .get("verificationMethod")
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .map(|m| pb::VerificationMethod {
                    id: text(m, "id"),
                    r#type: text(m, "type"),
                    controller: text(m, "controller"),
                    public_key_multibase: text(m, "publicKeyMultibase"),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(pb::DidDocument {
        id,
        verification_method,
        authentication: strings("authentication"),
        assertion_method: strings("assertionMethod"),
    })
}

/// The Ed25519 key a DID document asserts for `did`: the first verification
/// method listed in `assertionMethod` (else the first one) whose controller
/// is `did` and whose `publicKeyMultibase` is an Ed25519 key.
pub fn document_key(doc: &pb::DidDocument, did: &str) -> std::result::Result<VerifyingKey, String> {
    if doc.id != did {
        return Err(format!("document id is {:?}, not the DID", doc.id));
    }
    let usable = |m: &&pb::VerificationMethod| {
        (m.controller.is_empty() || m.controller == did) && !m.public_key_multibase.is_empty()
    };
    let asserted =
        doc.verification_method.iter().filter(usable).find(|m| doc.assertion_method.iter().any(|a| a == &m.id));
    let method = asserted
        .or_else(|| doc.verification_method.iter().find(usable))
        .ok_or_else(|| "document has no verification method with a publicKeyMultibase".to_string())?;
    parse_key_multibase(&method.public_key_multibase)
}

// ---------------------------------------------------------------------------
// Identity

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

    /// Sets `msg`'s signature over [`Signed::signing_bytes`].
    pub fn sign<M: Signed>(&self, msg: &mut M) {
        let signature = self.sign_bytes(&msg.signing_bytes());
        *msg.signature_mut() = signature;
    }

    /// A fresh random non-zero nonce and the timestamp now, then [`Identity::sign`].
    pub fn stamp_and_sign<M: Signed>(&self, msg: &mut M) {
        msg.set_nonce(fresh_nonce());
        msg.set_timestamp_now();
        self.sign(msg);
    }

    /// The subject's acknowledging signature (`responder_signature`) over the
    /// same bytes the evaluator signs.
    pub fn countersign(&self, proof: &mut pb::InteractionProof) {
        proof.responder_signature = self.sign_bytes(&proof.signing_bytes());
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

    /// Writes this identity's DID document where a [`DidResolver`] with
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

/// A random non-zero u64.
pub fn fresh_nonce() -> u64 {
    loop {
        let n: u64 = rand::random();
        if n != 0 {
            return n;
        }
    }
}

// ---------------------------------------------------------------------------
// Signed messages

/// A protobuf message signed by its sender (see the module docs for the rule).
pub trait Signed: prost::Message + Clone + Default {
    /// The sender's DID (`from.uuid`, `evaluator.uuid`, `agent.uuid` or
    /// `sender_did`); empty if unset.
    fn sender(&self) -> &str;
    /// The sender's nonce.
    fn nonce(&self) -> u64;
    /// Sets the nonce.
    fn set_nonce(&mut self, n: u64);
    /// The timestamp, Unix seconds (`None` if unset).
    fn timestamp_s(&self) -> Option<i64>;
    /// Sets the timestamp to now.
    fn set_timestamp_now(&mut self);
    /// The sender's signature (empty if unsigned).
    fn signature(&self) -> &[u8];
    /// The sender's signature, to set.
    fn signature_mut(&mut self) -> &mut Vec<u8>;
    /// Clears every signature field (for [`pb::InteractionProof`] also
    /// `responder_signature`).
    fn clear_signatures(&mut self) {
        self.signature_mut().clear();
    }
    /// The bytes signed: the deterministic encoding with the signature
    /// field(s) cleared.
    fn signing_bytes(&self) -> Vec<u8> {
        let mut copy = self.clone();
        copy.clear_signatures();
        copy.encode_to_vec()
    }
}

/// `Signed` for messages whose sender is an `AgentId` field; `+ field`
/// names a second signature cleared for signing too.
macro_rules! signed_by_agent_id {
    ($($ty:ident . $sender:ident $(+ $second:ident)?),* $(,)?) => {$(
        impl Signed for pb::$ty {
            fn sender(&self) -> &str {
                self.$sender.as_ref().map_or("", |a| a.uuid.as_str())
            }
            fn nonce(&self) -> u64 {
                self.nonce
            }
            fn set_nonce(&mut self, n: u64) {
                self.nonce = n;
            }
            fn timestamp_s(&self) -> Option<i64> {
                self.timestamp.map(|t| t.seconds)
            }
            fn set_timestamp_now(&mut self) {
                self.timestamp = Some(timestamp_now());
            }
            fn signature(&self) -> &[u8] {
                &self.signature
            }
            fn signature_mut(&mut self) -> &mut Vec<u8> {
                &mut self.signature
            }
            fn clear_signatures(&mut self) {
                self.signature.clear();
                $(self.$second.clear();)?
            }
        }
    )*};
}

signed_by_agent_id!(
    CapabilityProbe.from,
    CapabilityOffer.from,
    ContractAccept.from,
    ContractAck.from,
    TaskSubmit.from,
    TaskResult.from,
    TaskQuery.from,
    ContextRequest.from,
    ContextResponse.from,
    Heartbeat.from,
    Backpressure.from,
    CircuitBreak.from,
    TaskCheckpoint.agent,
    // the evaluator signs; the subject countersigns in responder_signature
    InteractionProof.evaluator + responder_signature,
);

impl Signed for pb::AtpMessage {
    fn sender(&self) -> &str {
        &self.sender_did
    }
    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn set_nonce(&mut self, n: u64) {
        self.nonce = n;
    }
    /// `timestamp` is int64 seconds; 0 reads as unset.
    fn timestamp_s(&self) -> Option<i64> {
        (self.timestamp != 0).then_some(self.timestamp)
    }
    fn set_timestamp_now(&mut self) {
        self.timestamp = now_s();
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
    fn signature_mut(&mut self) -> &mut Vec<u8> {
        &mut self.signature
    }
}

// ---------------------------------------------------------------------------
// Verification

/// Why a signed message was refused. `Display` names which check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    /// The message carries no signature.
    #[error("unsigned: the message carries no signature")]
    Unsigned,
    /// The message names no sender DID.
    #[error("no sender: the message names no sender DID")]
    NoSender,
    /// The sender is not a DID we can resolve to a key.
    #[error("unknown signer {did}: {reason}")]
    UnknownSigner {
        /// The sender as the message names it.
        did: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// The signature does not verify against the sender's key.
    #[error("signature does not verify against {did}'s key (altered, or signed by another key)")]
    BadSignature {
        /// The sender.
        did: String,
    },
    /// The timestamp is too far from the receiver's clock (or missing).
    #[error("stale: timestamp {} (limit ±{limit} s)", skew_words(.skew_s), limit = MAX_CLOCK_SKEW_S)]
    Stale {
        /// Timestamp minus the receiver's clock, seconds (positive = future).
        skew_s: i64,
    },
    /// The (sender, nonce) pair was already seen.
    #[error("replayed: nonce {nonce} from {did} already seen")]
    Replayed {
        /// The sender.
        did: String,
        /// The repeated nonce.
        nonce: u64,
    },
    /// The replay log could not be read or written: the message is refused
    /// (fail closed).
    #[error("replay check unavailable: {reason}")]
    ReplayCheckUnavailable {
        /// The storage error.
        reason: String,
    },
}

fn skew_words(skew_s: &i64) -> String {
    let skew_s = *skew_s;
    if skew_s >= 0 {
        format!("{skew_s} s from now")
    } else {
        format!("{} s ago", skew_s.unsigned_abs())
    }
}

impl From<AuthFailure> for tonic::Status {
    fn from(failure: AuthFailure) -> tonic::Status {
        match failure {
            AuthFailure::ReplayCheckUnavailable { .. } => tonic::Status::unavailable(failure.to_string()),
            _ => tonic::Status::unauthenticated(failure.to_string()),
        }
    }
}

/// Maps a DID to its verifying key.
pub trait Resolver: Send + Sync {
    /// The key of `did`, or why there is none.
    fn resolve(&self, did: &str) -> std::result::Result<VerifyingKey, AuthFailure>;
}

/// did:key inline; did:wba from a local directory of documents
/// ([`wba_document_path`]); never the network.
#[derive(Debug, Clone, Default)]
pub struct DidResolver {
    wba_dir: Option<PathBuf>,
}

impl DidResolver {
    /// Resolves did:key only.
    pub fn new() -> DidResolver {
        DidResolver { wba_dir: None }
    }

    /// Also resolves did:wba from the documents under `dir`.
    pub fn with_wba_dir(dir: impl Into<PathBuf>) -> DidResolver {
        DidResolver { wba_dir: Some(dir.into()) }
    }
}

impl Resolver for DidResolver {
    fn resolve(&self, did: &str) -> std::result::Result<VerifyingKey, AuthFailure> {
        let unknown = |reason: String| AuthFailure::UnknownSigner { did: did.to_string(), reason };
        if did.starts_with("did:key:") {
            return parse_did_key(did).map_err(|e| match e {
                Error::Did { reason, .. } => unknown(reason),
                other => unknown(other.to_string()),
            });
        }
        if !did.starts_with("did:wba:") {
            return Err(unknown("not a DID this agent resolves (did:key:… or did:wba:…)".into()));
        }
        let dir = self.wba_dir.as_ref().ok_or_else(|| unknown("no did:wba directory configured".into()))?;
        let path = wba_document_path(dir, did).map_err(|e| match e {
            Error::Did { reason, .. } => unknown(reason),
            other => unknown(other.to_string()),
        })?;
        let bytes = std::fs::read(&path).map_err(|e| unknown(format!("no document at {}: {e}", path.display())))?;
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| unknown(format!("{} is not JSON: {e}", path.display())))?;
        let doc = did_document_from_json(&json).map_err(unknown)?;
        document_key(&doc, did).map_err(unknown)
    }
}

/// Remembers which (sender, nonce) pairs were seen.
pub trait NonceLog: Send + Sync {
    /// Records (did, nonce) sent at `ts_s`; `true` if it was not seen before.
    /// Entries older than 2 × [`MAX_CLOCK_SKEW_S`] before a recorded
    /// timestamp may be forgotten: a replay that old is refused as stale.
    fn first_seen(&self, did: &str, nonce: u64, ts_s: i64) -> Result<bool>;
}

/// An in-memory [`NonceLog`] of bounded size.
///
/// Entries older than 2 × skew before the newest recorded timestamp are
/// pruned. If more than `capacity` entries are younger than that (a flood),
/// the oldest is evicted and everything at or before its timestamp is
/// refused from then on: the log stays bounded and never lets a replay
/// through; the price is that a flood can refuse honest messages from the
/// same second.
#[derive(Debug)]
pub struct MemoryNonceLog {
    capacity: usize,
    inner: Mutex<MemoryNonces>,
}

#[derive(Debug, Default)]
struct MemoryNonces {
    seen: HashMap<(String, u64), i64>,
    by_time: BTreeSet<(i64, String, u64)>,
    /// Messages with a timestamp below this are refused.
    floor: i64,
}

impl Default for MemoryNonceLog {
    fn default() -> MemoryNonceLog {
        MemoryNonceLog::new(MemoryNonceLog::DEFAULT_CAPACITY)
    }
}

impl MemoryNonceLog {
    /// The default bound on remembered nonces.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// A log remembering at most `capacity` (≥ 1) nonces.
    pub fn new(capacity: usize) -> MemoryNonceLog {
        MemoryNonceLog {
            capacity: capacity.max(1),
            inner: Mutex::new(MemoryNonces { floor: i64::MIN, ..Default::default() }),
        }
    }

    /// How many nonces are remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).seen.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl NonceLog for MemoryNonceLog {
    fn first_seen(&self, did: &str, nonce: u64, ts_s: i64) -> Result<bool> {
        let mut log = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = ts_s.saturating_sub(2 * MAX_CLOCK_SKEW_S);
        if cutoff > log.floor {
            log.floor = cutoff;
            while let Some(first) = log.by_time.first().cloned() {
                if first.0 >= cutoff {
                    break;
                }
                log.by_time.pop_first();
                log.seen.remove(&(first.1, first.2));
            }
        }
        if ts_s < log.floor {
            return Ok(false);
        }
        let key = (did.to_string(), nonce);
        if log.seen.contains_key(&key) {
            return Ok(false);
        }
        log.seen.insert(key, ts_s);
        log.by_time.insert((ts_s, did.to_string(), nonce));
        while log.seen.len() > self.capacity {
            let Some(oldest) = log.by_time.pop_first() else { break };
            log.seen.remove(&(oldest.1, oldest.2));
            log.floor = log.floor.max(oldest.0.saturating_add(1));
            tracing::warn!(capacity = self.capacity, floor = log.floor, "nonce log full: refusing older timestamps");
        }
        Ok(true)
    }
}

/// Checks signed messages: signature, sender, clock skew, replay.
#[derive(Clone)]
pub struct Verifier {
    resolver: Arc<dyn Resolver>,
    replay: Arc<dyn NonceLog>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier").finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier resolving senders with `resolver` and remembering nonces in `replay`.
    pub fn new(resolver: Arc<dyn Resolver>, replay: Arc<dyn NonceLog>) -> Verifier {
        Verifier { resolver, replay }
    }

    /// The resolver.
    pub fn resolver(&self) -> &Arc<dyn Resolver> {
        &self.resolver
    }

    /// [`Verifier::verify_at`] with the clock now.
    pub fn verify<M: Signed>(&self, msg: &M) -> std::result::Result<(), AuthFailure> {
        self.verify_at(msg, now_s())
    }

    /// Checks, in order: signed → has a sender → the signature verifies
    /// against the sender's key → the timestamp is within ±60 s of `now_s`
    /// → (sender, nonce) not seen before. The nonce is recorded only if all
    /// else passed, so a forged message cannot burn an honest nonce.
    pub fn verify_at<M: Signed>(&self, msg: &M, now_s: i64) -> std::result::Result<(), AuthFailure> {
        let did = self.check_signature(msg)?;
        let ts = msg.timestamp_s().unwrap_or(0);
        let skew_s = ts.saturating_sub(now_s);
        // unsigned_abs: i64::MIN has no i64 absolute value
        if skew_s.unsigned_abs() > MAX_CLOCK_SKEW_S.unsigned_abs() {
            return Err(AuthFailure::Stale { skew_s });
        }
        match self.replay.first_seen(did, msg.nonce(), ts) {
            Ok(true) => Ok(()),
            Ok(false) => Err(AuthFailure::Replayed { did: did.to_string(), nonce: msg.nonce() }),
            Err(e) => Err(AuthFailure::ReplayCheckUnavailable { reason: e.to_string() }),
        }
    }

    /// Only the signature checks (unsigned, sender, signature), no clock or
    /// replay: for records such as interaction proofs read back from a log.
    /// Returns the sender.
    pub fn check_signature<'m, M: Signed>(&self, msg: &'m M) -> std::result::Result<&'m str, AuthFailure> {
        check_signature(self.resolver.as_ref(), msg)
    }

    /// Both signatures of an interaction proof: the evaluator's `signature`
    /// and the subject's `responder_signature`.
    pub fn check_proof(&self, proof: &pb::InteractionProof) -> std::result::Result<(), AuthFailure> {
        check_proof(self.resolver.as_ref(), proof)
    }
}

/// The signature checks of [`Verifier::verify_at`] without clock or replay.
pub fn check_signature<'m, M: Signed>(
    resolver: &dyn Resolver,
    msg: &'m M,
) -> std::result::Result<&'m str, AuthFailure> {
    if msg.signature().is_empty() {
        return Err(AuthFailure::Unsigned);
    }
    let did = msg.sender();
    if did.is_empty() {
        return Err(AuthFailure::NoSender);
    }
    let key = resolver.resolve(did)?;
    verify_bytes(&key, &msg.signing_bytes(), msg.signature())
        .then_some(did)
        .ok_or_else(|| AuthFailure::BadSignature { did: did.to_string() })
}

/// Both signatures of an interaction proof (evaluator's and subject's).
pub fn check_proof(resolver: &dyn Resolver, proof: &pb::InteractionProof) -> std::result::Result<(), AuthFailure> {
    check_signature(resolver, proof)?;
    if proof.responder_signature.is_empty() {
        return Err(AuthFailure::Unsigned);
    }
    let subject = proof.subject.as_ref().map_or("", |a| a.uuid.as_str());
    if subject.is_empty() {
        return Err(AuthFailure::NoSender);
    }
    let key = resolver.resolve(subject)?;
    if verify_bytes(&key, &proof.signing_bytes(), &proof.responder_signature) {
        Ok(())
    } else {
        Err(AuthFailure::BadSignature { did: subject.to_string() })
    }
}

/// Strict Ed25519 verification of a 64-byte signature.
pub fn verify_bytes(key: &VerifyingKey, bytes: &[u8], signature: &[u8]) -> bool {
    Signature::from_slice(signature).is_ok_and(|sig| key.verify_strict(bytes, &sig).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn verifier() -> Verifier {
        Verifier::new(Arc::new(DidResolver::new()), Arc::new(MemoryNonceLog::default()))
    }

    fn probe(from: &Identity) -> pb::CapabilityProbe {
        pb::CapabilityProbe {
            from: Some(from.agent_id()),
            task_type: pb::TaskType::CodeGeneration as i32,
            task_id: "t-1".into(),
            context_tokens: 1200,
            ..Default::default()
        }
    }

    #[test]
    fn did_key_round_trips_and_starts_z6mk() {
        for seed in 0u8..32 {
            let id = Identity::from_signing_key(SigningKey::from_bytes(&[seed; 32]));
            assert!(id.did().starts_with("did:key:z6Mk"), "{}", id.did());
            assert_eq!(parse_did_key(id.did()).unwrap(), id.verifying_key());
            assert_eq!(did_key(&parse_did_key(id.did()).unwrap()), id.did());
        }
        let random = Identity::generate();
        assert!(random.did().starts_with("did:key:z6Mk"));
        assert_eq!(parse_did_key(random.did()).unwrap(), random.verifying_key());
    }

    #[test]
    fn did_key_known_vector() {
        // W3C did:key test suite (did-key-ed25519): this DID's public key.
        let did = "did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp";
        let vk = parse_did_key(did).unwrap();
        assert_eq!(did_key(&vk), did);
        // RFC 8032 §7.1 test 1: secret key 9d61b1…7f60 has public key d75a98…511a.
        let secret: [u8; 32] = hex32("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
        let public = hex32("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
        let id = Identity::from_signing_key(SigningKey::from_bytes(&secret));
        assert_eq!(id.verifying_key().to_bytes(), public);
        let mut prefixed = ED25519_MULTICODEC.to_vec();
        prefixed.extend_from_slice(&public);
        assert_eq!(id.did(), format!("did:key:z{}", bs58::encode(prefixed).into_string()));
    }

    fn hex32(s: &str) -> [u8; 32] {
        let v: Vec<u8> = (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect();
        v.try_into().unwrap()
    }

    #[test]
    fn parse_did_key_refuses_garbage() {
        for bad in ["did:web:example.com", "did:key:6Mk", "did:key:z0OIl", "did:key:z111"] {
            assert!(matches!(parse_did_key(bad), Err(Error::Did { .. })), "{bad}");
        }
        // A secp256k1 did:key (multicodec 0xe7) is not Ed25519.
        let err = parse_did_key("did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme").unwrap_err();
        assert!(err.to_string().contains("not an Ed25519 key"), "{err}");
    }

    #[test]
    fn signature_is_over_the_encoding_with_signature_cleared() {
        let alice = Identity::generate();
        let mut msg = probe(&alice);
        alice.stamp_and_sign(&mut msg);
        assert_ne!(msg.nonce, 0);
        let mut manual = msg.clone();
        manual.signature = Vec::new();
        let bytes = manual.encode_to_vec();
        assert_eq!(msg.signing_bytes(), bytes);
        assert_eq!(msg.signature, alice.sign_bytes(&bytes));
        assert!(verify_bytes(&alice.verifying_key(), &bytes, &msg.signature));
    }

    #[test]
    fn interaction_proof_signing_clears_both_signatures() {
        let (eval, subj) = (Identity::generate(), Identity::generate());
        let mut proof = pb::InteractionProof {
            evaluator: Some(eval.agent_id()),
            subject: Some(subj.agent_id()),
            task_id: "t".into(),
            quality_score: 0.9,
            ..Default::default()
        };
        eval.stamp_and_sign(&mut proof);
        subj.countersign(&mut proof);
        let mut manual = proof.clone();
        manual.signature.clear();
        manual.responder_signature.clear();
        assert_eq!(proof.signing_bytes(), manual.encode_to_vec());
        check_proof(&DidResolver::new(), &proof).unwrap();
        // Countersigned by someone other than the subject.
        let mut forged = proof.clone();
        Identity::generate().countersign(&mut forged);
        assert_eq!(
            check_proof(&DidResolver::new(), &forged),
            Err(AuthFailure::BadSignature { did: subj.did().into() })
        );
        let mut single = proof.clone();
        single.responder_signature.clear();
        assert_eq!(check_proof(&DidResolver::new(), &single), Err(AuthFailure::Unsigned));
    }

    #[test]
    fn verify_accepts_a_signed_message_of_every_kind() {
        let a = Identity::generate();
        let v = verifier();
        macro_rules! check {
            ($($ty:ident { $field:ident }),*) => {$(
                let mut m = pb::$ty { $field: Some(a.agent_id()), ..Default::default() };
                a.stamp_and_sign(&mut m);
                v.verify(&m).unwrap_or_else(|e| panic!("{}: {e}", stringify!($ty)));
                m.nonce ^= 1;
                assert!(matches!(v.verify(&m), Err(AuthFailure::BadSignature { .. })), "{}", stringify!($ty));
            )*};
        }
        check!(
            CapabilityProbe { from },
            CapabilityOffer { from },
            ContractAccept { from },
            ContractAck { from },
            TaskSubmit { from },
            TaskResult { from },
            TaskQuery { from },
            ContextRequest { from },
            ContextResponse { from },
            Heartbeat { from },
            Backpressure { from },
            CircuitBreak { from },
            TaskCheckpoint { agent },
            InteractionProof { evaluator }
        );
        let mut env = pb::AtpMessage {
            sender_did: a.did().into(),
            message_id: "m1".into(),
            payload: Some(pb::atp_message::Payload::Heartbeat(pb::Heartbeat::default())),
            ..Default::default()
        };
        a.stamp_and_sign(&mut env);
        assert!((env.timestamp - now_s()).abs() <= 1);
        v.verify(&env).unwrap();
    }

    #[test]
    fn verify_refuses_unsigned() {
        let a = Identity::generate();
        let mut m = probe(&a);
        m.set_nonce(7);
        m.set_timestamp_now();
        let err = verifier().verify(&m).unwrap_err();
        assert_eq!(err, AuthFailure::Unsigned);
        assert_eq!(err.to_string(), "unsigned: the message carries no signature");
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().starts_with("unsigned"));
    }

    #[test]
    fn verify_refuses_a_tampered_message() {
        let a = Identity::generate();
        let mut m = probe(&a);
        a.stamp_and_sign(&mut m);
        m.context_tokens += 1;
        let err = verifier().verify(&m).unwrap_err();
        assert_eq!(err, AuthFailure::BadSignature { did: a.did().into() });
        assert_eq!(
            err.to_string(),
            format!("signature does not verify against {}'s key (altered, or signed by another key)", a.did())
        );
    }

    #[test]
    fn verify_refuses_a_message_signed_by_another_key() {
        let (a, mallory) = (Identity::generate(), Identity::generate());
        let mut m = probe(&a);
        mallory.stamp_and_sign(&mut m);
        assert_eq!(verifier().verify(&m), Err(AuthFailure::BadSignature { did: a.did().into() }));
        // A truncated signature is a bad signature, not a crash.
        let mut short = probe(&a);
        a.stamp_and_sign(&mut short);
        short.signature.truncate(10);
        assert_eq!(verifier().verify(&short), Err(AuthFailure::BadSignature { did: a.did().into() }));
    }

    #[test]
    fn verify_refuses_stale_timestamps_at_61_s_and_accepts_59_s() {
        let a = Identity::generate();
        let v = verifier();
        let now = 1_700_000_000;
        let at = |offset: i64| {
            let mut m = probe(&a);
            m.nonce = fresh_nonce();
            m.timestamp = Some(pb::Timestamp { seconds: now + offset, nanos: 0 });
            a.sign(&mut m);
            m
        };
        let past = v.verify_at(&at(-61), now).unwrap_err();
        assert_eq!(past, AuthFailure::Stale { skew_s: -61 });
        assert_eq!(past.to_string(), "stale: timestamp 61 s ago (limit ±60 s)");
        let future = v.verify_at(&at(61), now).unwrap_err();
        assert_eq!(future.to_string(), "stale: timestamp 61 s from now (limit ±60 s)");
        v.verify_at(&at(-59), now).unwrap();
        v.verify_at(&at(59), now).unwrap();
        v.verify_at(&at(60), now).unwrap();
        // Extreme timestamps neither overflow nor pass.
        for seconds in [i64::MIN, i64::MIN + 1, i64::MAX] {
            let mut m = probe(&a);
            m.nonce = fresh_nonce();
            m.timestamp = Some(pb::Timestamp { seconds, nanos: 0 });
            a.sign(&mut m);
            assert!(matches!(v.verify_at(&m, now), Err(AuthFailure::Stale { .. })), "{seconds}");
        }
        // No timestamp at all is stale too.
        let mut none = probe(&a);
        none.nonce = 1;
        a.sign(&mut none);
        assert!(matches!(v.verify_at(&none, now), Err(AuthFailure::Stale { .. })));
    }

    #[test]
    fn verify_refuses_a_replayed_nonce() {
        let a = Identity::generate();
        let v = verifier();
        let mut m = probe(&a);
        a.stamp_and_sign(&mut m);
        v.verify(&m).unwrap();
        let err = v.verify(&m).unwrap_err();
        assert_eq!(err, AuthFailure::Replayed { did: a.did().into(), nonce: m.nonce });
        assert_eq!(err.to_string(), format!("replayed: nonce {} from {} already seen", m.nonce, a.did()));
        // The same nonce from another sender is fine.
        let b = Identity::generate();
        let mut other = probe(&b);
        other.nonce = m.nonce;
        other.set_timestamp_now();
        b.sign(&mut other);
        v.verify(&other).unwrap();
    }

    #[test]
    fn a_forged_message_does_not_burn_the_nonce() {
        let (a, mallory) = (Identity::generate(), Identity::generate());
        let v = verifier();
        let mut honest = probe(&a);
        a.stamp_and_sign(&mut honest);
        let mut forged = honest.clone();
        mallory.sign(&mut forged);
        assert!(matches!(v.verify(&forged), Err(AuthFailure::BadSignature { .. })));
        v.verify(&honest).unwrap();
    }

    #[test]
    fn verify_refuses_senders_that_are_not_dids_or_unknown() {
        let a = Identity::generate();
        let v = verifier();
        let mut no_sender = probe(&a);
        no_sender.from = None;
        a.stamp_and_sign(&mut no_sender);
        assert_eq!(v.verify(&no_sender), Err(AuthFailure::NoSender));
        for sender in ["alice", "did:web:example.com", "did:key:zNotAKey", "did:wba:example.com"] {
            let mut m = probe(&a);
            m.from = Some(pb::AgentId { uuid: sender.into() });
            a.stamp_and_sign(&mut m);
            let err = v.verify(&m).unwrap_err();
            assert!(matches!(&err, AuthFailure::UnknownSigner { did, .. } if did == sender), "{sender}: {err}");
            assert!(err.to_string().starts_with(&format!("unknown signer {sender}: ")), "{err}");
        }
    }

    #[test]
    fn did_wba_resolves_from_a_local_directory() {
        let dir = tempfile::tempdir().unwrap();
        let host = Identity::generate().with_did("did:wba:example.com").unwrap();
        let alice = Identity::generate().with_did("did:wba:example.com:user:alice").unwrap();
        let host_path = host.write_wba_document(dir.path()).unwrap();
        assert_eq!(host_path, dir.path().join("example.com/did.json"));
        assert_eq!(alice.write_wba_document(dir.path()).unwrap(), dir.path().join("example.com/user/alice/did.json"));
        let resolver = DidResolver::with_wba_dir(dir.path());
        assert_eq!(resolver.resolve(host.did()).unwrap(), host.verifying_key());
        assert_eq!(resolver.resolve(alice.did()).unwrap(), alice.verifying_key());

        let v = Verifier::new(Arc::new(resolver.clone()), Arc::new(MemoryNonceLog::default()));
        let mut m = probe(&alice);
        alice.stamp_and_sign(&mut m);
        v.verify(&m).unwrap();

        // Unknown did:wba, a traversal attempt, and a document for another DID.
        for did in ["did:wba:example.com:user:bob", "did:wba:..:etc", "did:wba:example.com:a/b", "did:wba:other.org"] {
            assert!(matches!(resolver.resolve(did), Err(AuthFailure::UnknownSigner { .. })), "{did}");
        }
        std::fs::create_dir_all(dir.path().join("other.org")).unwrap();
        std::fs::copy(&host_path, dir.path().join("other.org/did.json")).unwrap();
        let err = resolver.resolve("did:wba:other.org").unwrap_err();
        assert!(err.to_string().contains("not the DID"), "{err}");
        // A hand-written document with a foreign key type.
        std::fs::create_dir_all(dir.path().join("k1.org")).unwrap();
        let doc = serde_json::json!({"id": "did:wba:k1.org", "verificationMethod": [{
            "id": "did:wba:k1.org#k", "type": "EcdsaSecp256k1VerificationKey2019", "controller": "did:wba:k1.org",
            "publicKeyMultibase": "zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"}]});
        std::fs::write(dir.path().join("k1.org/did.json"), doc.to_string()).unwrap();
        let err = resolver.resolve("did:wba:k1.org").unwrap_err();
        assert!(err.to_string().contains("not an Ed25519 key"), "{err}");
        // did:key needs no directory, did:wba needs one.
        assert!(matches!(DidResolver::new().resolve(alice.did()), Err(AuthFailure::UnknownSigner { .. })));
    }

    #[test]
    fn did_document_json_round_trips() {
        let a = Identity::generate();
        let doc = a.did_document();
        assert_eq!(doc.verification_method[0].public_key_multibase, a.did().strip_prefix("did:key:").unwrap());
        let json = a.did_document_json();
        assert_eq!(json["verificationMethod"][0]["type"], VERIFICATION_METHOD_TYPE);
        let back = did_document_from_json(&json).unwrap();
        assert_eq!(back, doc);
        assert_eq!(document_key(&back, a.did()).unwrap(), a.verifying_key());
    }

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

    #[test]
    fn memory_nonce_log_prunes_and_stays_bounded() {
        let log = MemoryNonceLog::new(3);
        assert!(log.first_seen("a", 1, 1000).unwrap());
        assert!(!log.first_seen("a", 1, 1000).unwrap());
        assert!(log.first_seen("a", 2, 1001).unwrap());
        // 121 s later the first two are pruned (a replay that old is stale anyway)...
        assert!(log.first_seen("a", 3, 1122).unwrap());
        assert_eq!(log.len(), 1);
        // ...and anything older than 2×skew is refused outright.
        assert!(!log.first_seen("a", 1, 1000).unwrap());
        // A flood past capacity evicts the oldest and refuses its timestamp.
        assert!(log.first_seen("b", 1, 1123).unwrap());
        assert!(log.first_seen("b", 2, 1124).unwrap());
        assert!(log.first_seen("b", 3, 1125).unwrap());
        assert_eq!(log.len(), 3);
        assert!(!log.first_seen("a", 3, 1122).unwrap(), "evicted nonce must not be accepted again");
        assert!(!log.first_seen("c", 9, 1122).unwrap());
        assert!(log.first_seen("c", 9, 1126).unwrap());
    }
}
