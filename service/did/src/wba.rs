//! DID-authenticated callers: the ANP `DIDWba` `Authorization` header, as
//! `scd serve --auth did-wba` checks it on every gRPC call and HTTP request.
//!
//! **The header.**
//!
//! ```text
//! Authorization: DIDWba did="did:wba:example.com:user:alice", nonce="…", timestamp="2026-03-27T10:30:00Z",
//!                verification_method="key-1", signature="…"
//! ```
//!
//! Exactly those five parameters, each once, each a quoted string without
//! escapes; the scheme is case-insensitive (RFC 9110), parameter names are
//! not. `timestamp` is RFC 3339 in UTC (`Z`), as in ANP's examples;
//! `verification_method` is a fragment of the DID document (`key-1`) or the
//! full id (`did:…#key-1`); `signature` is the Ed25519 signature over
//! [`canonical_payload`], base64url without padding (86 characters).
//!
//! **What is signed.** The canonical JSON of `{aud, did, nonce, timestamp}`,
//! where `aud` is the service's own name (`--auth-aud`), so a header made
//! for one service is refused by another. See [`canonical_payload`].
//!
//! **Who is accepted (an allowlist).** Only DIDs whose document lies in the
//! server's DID directory ([`wba_document_path`]): a did:wba caller whose
//! document is not there, and any did:key caller, is an unknown DID. The
//! document is read on every check, so deleting it revokes the caller at
//! once; nothing is ever fetched over the network.
//!
//! **The checks**, in this order, each refusal a [`Reason`] whose `Display`
//! names it: the header is missing; malformed (naming the part); the
//! timestamp is more than [`MAX_CLOCK_SKEW_S`] from the server's clock; the
//! DID is unknown; the verification method is not an Ed25519 key listed
//! under `authentication` in the document; the signature does not verify;
//! the (did, nonce) pair was seen before. The nonce is recorded only after
//! the signature verified, so forged headers cannot burn honest nonces.
//!
//! ```
//! use scd_did::Identity;
//! use scd_did::wba::{sign_header, WbaAuthenticator};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let alice = Identity::generate().with_did("did:wba:example.com:user:alice").unwrap();
//! alice.write_wba_document(dir.path()).unwrap();
//! let auth = WbaAuthenticator::new(dir.path(), "scd");
//! let now = 1_800_000_000;
//! let header = sign_header(&alice, "scd", now);
//! assert_eq!(auth.check(Some(&header), now).unwrap(), alice.did());
//! // The same header again is a replay.
//! assert!(auth.check(Some(&header), now).unwrap_err().to_string().starts_with("replayed nonce"));
//! ```

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use crate::document::{did_document_from_json, wba_document_path};
use crate::error::{Error, Result};
use crate::key::{parse_key_multibase, verify_bytes};
use crate::nonce::{MemoryNonceLog, NonceLog};
use crate::time::{format_rfc3339_utc, parse_rfc3339_utc, TimeError, MAX_CLOCK_SKEW_S};
use crate::Identity;

/// The authentication scheme (compared case-insensitively).
pub const SCHEME: &str = "DIDWba";
/// The longest header value accepted, bytes.
pub const MAX_HEADER_BYTES: usize = 2048;
/// The longest `did` / `verification_method`, bytes.
pub const MAX_DID_BYTES: usize = 256;
/// Bounds of `nonce`, characters (`[A-Za-z0-9_-]`).
pub const NONCE_CHARS: std::ops::RangeInclusive<usize> = 16..=128;
/// The longest DID document read, bytes.
pub const MAX_DOCUMENT_BYTES: u64 = 64 << 10;
/// Subdirectories searched below the DID directory for documents.
const MAX_DIR_DEPTH: usize = 8;

const PARAMS: [&str; 5] = ["did", "nonce", "timestamp", "verification_method", "signature"];

/// Why a request was refused. `Display` names the reason; every one is
/// UNAUTHENTICATED on gRPC and 401 over HTTP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// No `Authorization` header (or metadata) at all.
    #[error(
        "missing Authorization header: this server requires `Authorization: DIDWba did=\"…\", nonce=\"…\", \
         timestamp=\"…\", verification_method=\"…\", signature=\"…\"`"
    )]
    Missing,
    /// The header does not parse.
    #[error("malformed Authorization header: {part}: {reason}")]
    Malformed {
        /// Which part: `scheme`, `parameters`, or a parameter's name.
        part: String,
        /// What is wrong, with the limit where there is one.
        reason: String,
    },
    /// The DID is not in the allowlist (no document in the DID directory).
    #[error("unknown DID {did}: {reason}")]
    UnknownDid {
        /// The DID as sent.
        did: String,
        /// Why it is not accepted.
        reason: String,
    },
    /// The verification method is not a usable key of the DID.
    #[error("verification_method {method:?} of {did}: {reason}")]
    UnknownMethod {
        /// The DID.
        did: String,
        /// The method as sent.
        method: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The signature does not verify.
    #[error(
        "bad signature: it does not verify against {did}'s key over aud {aud:?} \
         (signed for another service, altered, or signed by another key)"
    )]
    BadSignature {
        /// The DID.
        did: String,
        /// This service's name, part of the signed payload.
        aud: String,
    },
    /// The timestamp is too far from the server's clock.
    #[error("timestamp outside ±{limit_s} s: {} the server's clock", skew_words(.skew_s))]
    Stale {
        /// Timestamp minus the server's clock, seconds (positive = future).
        skew_s: i64,
        /// The limit either way, seconds.
        limit_s: i64,
    },
    /// The (did, nonce) pair was already accepted.
    #[error("replayed nonce {nonce:?} from {did}: already used within the ±{limit_s} s window")]
    Replayed {
        /// The DID.
        did: String,
        /// The nonce.
        nonce: String,
        /// The window either way, seconds.
        limit_s: i64,
    },
}

fn skew_words(skew_s: &i64) -> String {
    let skew_s = *skew_s;
    if skew_s >= 0 {
        format!("{skew_s} s ahead of")
    } else {
        format!("{} s behind", skew_s.unsigned_abs())
    }
}

fn malformed(part: &str, reason: impl Into<String>) -> Reason {
    Reason::Malformed { part: part.to_string(), reason: reason.into() }
}

/// At most 40 characters of attacker-chosen text, escaped, for messages.
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    if cut.len() < s.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// A parsed `DIDWba` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthHeader {
    /// The caller's DID.
    pub did: String,
    /// A single-use random string, 16 to 128 of `[A-Za-z0-9_-]`.
    pub nonce: String,
    /// RFC 3339 UTC, exactly as sent (it is signed as sent).
    pub timestamp: String,
    /// `timestamp` in Unix seconds.
    pub timestamp_s: i64,
    /// The verification method, as sent.
    pub verification_method: String,
    /// The 64-byte Ed25519 signature.
    pub signature: Vec<u8>,
}

impl AuthHeader {
    /// Parses a header value strictly (see the module docs); the error names
    /// the part that is wrong. Never panics, whatever the input.
    pub fn parse(value: &str) -> std::result::Result<AuthHeader, Reason> {
        if value.len() > MAX_HEADER_BYTES {
            return Err(malformed("header", format!("{} bytes, over the limit {MAX_HEADER_BYTES}", value.len())));
        }
        let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case(SCHEME) {
            return Err(malformed("scheme", format!("expected {SCHEME}, got {}", shown(scheme))));
        }
        let mut found: [Option<&str>; 5] = [None; 5];
        let bytes = rest.as_bytes();
        let mut i = 0;
        let skip_ows = |i: &mut usize| {
            while *i < bytes.len() && (bytes[*i] == b' ' || bytes[*i] == b'\t') {
                *i += 1;
            }
        };
        loop {
            skip_ows(&mut i);
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let name = &rest[start..i];
            if name.is_empty() {
                return Err(malformed("parameters", format!("expected name=\"value\" at byte {start}")));
            }
            if bytes.get(i) != Some(&b'=') || bytes.get(i + 1) != Some(&b'"') {
                return Err(malformed(name, "expected =\"value\" (a quoted string)"));
            }
            i += 2;
            let vstart = i;
            while i < bytes.len() && bytes[i] != b'"' {
                i += 1;
            }
            if i == bytes.len() {
                return Err(malformed(name, "unterminated quoted value"));
            }
            let v = &rest[vstart..i];
            i += 1;
            let Some(slot) = PARAMS.iter().position(|p| *p == name) else {
                return Err(malformed(
                    &shown(name),
                    "unknown parameter (expected did, nonce, timestamp, verification_method, signature)",
                ));
            };
            if found[slot].is_some() {
                return Err(malformed(name, "given twice"));
            }
            if v.bytes().any(|b| b == b'\\' || !(b' '..=b'~').contains(&b)) {
                return Err(malformed(name, "only printable ASCII without backslashes is allowed"));
            }
            found[slot] = Some(v);
            skip_ows(&mut i);
            if i == bytes.len() {
                break;
            }
            if bytes[i] != b',' {
                return Err(malformed("parameters", format!("expected ',' after {name} at byte {i}")));
            }
            i += 1;
        }
        let take = |k: usize| found[k].ok_or_else(|| malformed(PARAMS[k], "missing"));
        let (did, nonce, timestamp, method, signature) = (take(0)?, take(1)?, take(2)?, take(3)?, take(4)?);
        if !did.starts_with("did:") || did.len() > MAX_DID_BYTES || did.contains([' ', '#']) {
            return Err(malformed("did", format!("expected a DID (did:…) of at most {MAX_DID_BYTES} bytes")));
        }
        if !NONCE_CHARS.contains(&nonce.len())
            || !nonce.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(malformed(
                "nonce",
                format!("expected {} to {} characters of [A-Za-z0-9_-]", NONCE_CHARS.start(), NONCE_CHARS.end()),
            ));
        }
        let timestamp_s = parse_rfc3339_utc(timestamp).map_err(|e| {
            let expected = format!("expected RFC 3339 UTC like 2026-03-27T10:30:00Z, got {}", shown(timestamp));
            match e {
                TimeError::Range => malformed("timestamp", format!("{expected}: a field is out of range")),
                TimeError::Shape | TimeError::NotUtc => malformed("timestamp", expected),
            }
        })?;
        if method.is_empty() || method.len() > MAX_DID_BYTES || method.contains(' ') {
            return Err(malformed(
                "verification_method",
                format!("expected a method id (key-1 or did…#key-1) of 1 to {MAX_DID_BYTES} bytes"),
            ));
        }
        let signature =
            URL_SAFE_NO_PAD.decode(signature).ok().filter(|s| s.len() == 64).ok_or_else(|| {
                malformed("signature", "expected 64 bytes in base64url without padding (86 characters)")
            })?;
        Ok(AuthHeader {
            did: did.to_string(),
            nonce: nonce.to_string(),
            timestamp: timestamp.to_string(),
            timestamp_s,
            verification_method: method.to_string(),
            signature,
        })
    }
}

/// The bytes a `DIDWba` header signs: the canonical JSON of the object
/// `{"aud", "did", "nonce", "timestamp"}` with string values.
///
/// Canonical means: keys in sorted (byte) order, no whitespace at all, `:`
/// and `,` as the only separators, values as JSON strings, UTF-8. For the
/// values a valid header can carry (printable ASCII without `"` or `\`)
/// nothing is escaped, so this is also RFC 8785 (JCS) and what Python's
/// `json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()` emits,
/// e.g. `{"aud":"scd","did":"did:wba:example.com","nonce":"…","timestamp":"2026-03-27T10:30:00Z"}`.
pub fn canonical_payload(nonce: &str, timestamp: &str, aud: &str, did: &str) -> Vec<u8> {
    let map: std::collections::BTreeMap<&str, &str> =
        [("aud", aud), ("did", did), ("nonce", nonce), ("timestamp", timestamp)].into_iter().collect();
    serde_json::to_vec(&map).expect("a map of strings serializes")
}

/// A fresh header for `identity` calling the service named `aud` at Unix
/// time `now_s`: a random 128-bit hex nonce, the first verification method
/// of its document.
pub fn sign_header(identity: &Identity, aud: &str, now_s: i64) -> String {
    let nonce: String = rand::random::<[u8; 16]>().iter().map(|b| format!("{b:02x}")).collect();
    sign_header_with(identity, aud, &nonce, &format_rfc3339_utc(now_s))
}

/// A header with a given nonce and timestamp (tests, other clocks).
pub fn sign_header_with(identity: &Identity, aud: &str, nonce: &str, timestamp: &str) -> String {
    let doc = identity.did_document();
    let method = &doc.verification_method[0].id;
    let fragment = method.rsplit_once('#').map_or(method.as_str(), |(_, f)| f);
    let signature = identity.sign_bytes(&canonical_payload(nonce, timestamp, aud, identity.did()));
    format!(
        "{SCHEME} did=\"{}\", nonce=\"{nonce}\", timestamp=\"{timestamp}\", verification_method=\"{fragment}\", signature=\"{}\"",
        identity.did(),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// Checks `DIDWba` headers against an allowlist directory of DID documents
/// (see the module docs). One per server: it remembers nonces.
#[derive(Debug)]
pub struct WbaAuthenticator {
    dir: PathBuf,
    aud: String,
    nonces: MemoryNonceLog,
}

impl WbaAuthenticator {
    /// Accepts the DIDs whose documents lie under `dir`, for a service named
    /// `aud`; remembers up to [`MemoryNonceLog::DEFAULT_CAPACITY`] nonces.
    pub fn new(dir: impl Into<PathBuf>, aud: &str) -> WbaAuthenticator {
        WbaAuthenticator { dir: dir.into(), aud: aud.to_string(), nonces: MemoryNonceLog::default() }
    }

    /// The service's own name, signed into every header.
    pub fn aud(&self) -> &str {
        &self.aud
    }

    /// The directory of accepted DID documents.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The caller's DID if `header` (the `Authorization` value) passes every
    /// check at Unix time `now_s`; else the first reason it does not.
    pub fn check(&self, header: Option<&str>, now_s: i64) -> std::result::Result<String, Reason> {
        let header = AuthHeader::parse(header.ok_or(Reason::Missing)?)?;
        let skew_s = header.timestamp_s.saturating_sub(now_s);
        if skew_s.abs() > MAX_CLOCK_SKEW_S {
            return Err(Reason::Stale { skew_s, limit_s: MAX_CLOCK_SKEW_S });
        }
        let did = header.did.as_str();
        let key = self.key(did, &header.verification_method)?;
        let payload = canonical_payload(&header.nonce, &header.timestamp, &self.aud, did);
        if !verify_bytes(&key, &payload, &header.signature) {
            return Err(Reason::BadSignature { did: did.to_string(), aud: self.aud.clone() });
        }
        let digest = Sha256::digest(header.nonce.as_bytes());
        let nonce_id = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
        // the memory log cannot fail; were it to, refuse (fail closed)
        if !self.nonces.first_seen(did, nonce_id, header.timestamp_s).unwrap_or(false) {
            return Err(Reason::Replayed { did: did.to_string(), nonce: header.nonce, limit_s: MAX_CLOCK_SKEW_S });
        }
        Ok(header.did)
    }

    /// The Ed25519 key of `did`'s verification method `method`, from its
    /// document in the directory.
    fn key(&self, did: &str, method: &str) -> std::result::Result<VerifyingKey, Reason> {
        let unknown = |reason: &str| Reason::UnknownDid { did: did.to_string(), reason: reason.to_string() };
        if !did.starts_with("did:wba:") {
            return Err(unknown("only did:wba DIDs with a document in the server's DID directory are accepted"));
        }
        let path = wba_document_path(&self.dir, did)
            .map_err(|_| unknown("not a did:wba this server can look up (bad path segment)"))?;
        let not_listed = "no DID document for it in the server's DID directory (the allowlist)";
        let size = std::fs::metadata(&path).map_err(|_| unknown(not_listed))?.len();
        if size > MAX_DOCUMENT_BYTES {
            return Err(unknown("its DID document is over 64 KiB"));
        }
        let bytes = std::fs::read(&path).map_err(|_| unknown(not_listed))?;
        let doc = serde_json::from_slice(&bytes)
            .ok()
            .and_then(|json| did_document_from_json(&json).ok())
            .ok_or_else(|| unknown("its DID document is not valid JSON with an \"id\""))?;
        if doc.id != did {
            return Err(unknown("its DID document names another id"));
        }
        let bad = |reason: &str| Reason::UnknownMethod {
            did: did.to_string(),
            method: method.to_string(),
            reason: reason.to_string(),
        };
        let id = if method.contains('#') { method.to_string() } else { format!("{did}#{method}") };
        let vm = doc
            .verification_method
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| bad("not in the DID document's verificationMethod"))?;
        if !doc.authentication.contains(&id) {
            return Err(bad("not listed under the DID document's authentication"));
        }
        if !(vm.controller.is_empty() || vm.controller == did) {
            return Err(bad("controlled by another DID"));
        }
        parse_key_multibase(&vm.public_key_multibase)
            .map_err(|e| bad(&format!("publicKeyMultibase is not an Ed25519 key ({e})")))
    }
}

/// Every `did.json` under `dir` (at most 8 levels deep), sorted: the DID
/// documents a [`WbaAuthenticator`] over `dir` may accept.
pub fn list_documents(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
        let io = |source| Error::Io { path: dir.to_path_buf(), source };
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.is_dir() && depth < MAX_DIR_DEPTH {
                walk(&path, depth + 1, out)?;
            } else if path.file_name().is_some_and(|n| n == "did.json") && path.is_file() {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, 0, &mut out)?;
    out.sort();
    Ok(out)
}

/// The did:wba DID whose document `GET path` on `host` serves, per the
/// did:wba method: `/.well-known/did.json` → `did:wba:host`,
/// `/user/alice/did.json` → `did:wba:host:user:alice`; a port in `host`
/// becomes `%3A`. `None` for any other path.
pub fn did_for_served_path(host: &str, path: &str) -> Option<String> {
    let host = host.replace(':', "%3A");
    if host.is_empty() || host.contains(['/', '\\']) {
        return None;
    }
    if path == "/.well-known/did.json" {
        return Some(format!("did:wba:{host}"));
    }
    let inner = path.strip_prefix('/')?.strip_suffix("/did.json")?;
    if inner.is_empty() || inner.split('/').any(|s| s.is_empty() || s == "." || s == ".." || s.contains(':')) {
        return None;
    }
    Some(format!("did:wba:{host}:{}", inner.replace('/', ":")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn setup() -> (tempfile::TempDir, Identity, WbaAuthenticator) {
        let dir = tempfile::tempdir().unwrap();
        let alice = Identity::generate().with_did("did:wba:example.com:user:alice").unwrap();
        alice.write_wba_document(dir.path()).unwrap();
        let auth = WbaAuthenticator::new(dir.path(), "scd");
        (dir, alice, auth)
    }

    #[test]
    fn canonical_payload_is_sorted_compact_json() {
        let p = canonical_payload("n0nce", "2026-03-27T10:30:00Z", "scd", "did:wba:example.com");
        assert_eq!(
            String::from_utf8(p).unwrap(),
            r#"{"aud":"scd","did":"did:wba:example.com","nonce":"n0nce","timestamp":"2026-03-27T10:30:00Z"}"#
        );
    }

    #[test]
    fn a_signed_header_is_accepted_once() {
        let (_dir, alice, auth) = setup();
        let header = sign_header(&alice, "scd", NOW);
        assert!(header.starts_with("DIDWba did=\"did:wba:example.com:user:alice\", nonce=\""), "{header}");
        assert!(header.contains("verification_method=\"key-1\""), "{header}");
        assert_eq!(auth.check(Some(&header), NOW + 59).unwrap(), alice.did());
        let err = auth.check(Some(&header), NOW).unwrap_err();
        assert!(matches!(&err, Reason::Replayed { did, .. } if did == alice.did()), "{err}");
        assert!(err.to_string().starts_with("replayed nonce \""), "{err}");
        // the full method id works too, and the scheme is case-insensitive
        let nonce = "0123456789abcdef0123";
        let full = sign_header_with(&alice, "scd", nonce, &format_rfc3339_utc(NOW))
            .replace("verification_method=\"key-1\"", &format!("verification_method=\"{}#key-1\"", alice.did()))
            .replacen("DIDWba", "didwba", 1);
        assert_eq!(auth.check(Some(&full), NOW).unwrap(), alice.did());
    }

    #[test]
    fn every_rejection_names_its_reason() {
        let (dir, alice, auth) = setup();
        let ts = format_rfc3339_utc(NOW);
        let sign = |who: &Identity, aud: &str, nonce: &str, ts: &str| sign_header_with(who, aud, nonce, ts);
        assert_eq!(auth.check(None, NOW), Err(Reason::Missing));
        assert!(Reason::Missing.to_string().starts_with("missing Authorization header"));

        let bob = Identity::generate().with_did("did:wba:example.com:user:bob").unwrap();
        let err = auth.check(Some(&sign(&bob, "scd", "bob-nonce-000000001", &ts)), NOW).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("unknown DID {}: no DID document for it in the server's DID directory (the allowlist)", bob.did())
        );
        let key_caller = Identity::generate();
        let err = auth.check(Some(&sign(&key_caller, "scd", "key-nonce-00000001", &ts)), NOW).unwrap_err();
        assert!(err.to_string().contains("only did:wba DIDs"), "{err}");

        // signed by another key under alice's DID
        let mallory = Identity::generate().with_did(alice.did()).unwrap();
        let err = auth.check(Some(&sign(&mallory, "scd", "mallory-nonce-0001", &ts)), NOW).unwrap_err();
        assert_eq!(err, Reason::BadSignature { did: alice.did().into(), aud: "scd".into() });
        assert!(err.to_string().starts_with(
            "bad signature: it does not verify against did:wba:example.com:user:alice's key over aud \"scd\""
        ));
        // signed for another service
        let err = auth.check(Some(&sign(&alice, "other", "aud-nonce-00000001", &ts)), NOW).unwrap_err();
        assert!(matches!(err, Reason::BadSignature { .. }), "{err}");
        // ... which did not burn the nonce
        assert!(auth.check(Some(&sign(&alice, "scd", "aud-nonce-00000001", &ts)), NOW).is_ok());

        for (offset, words) in [(61i64, "61 s ahead of"), (-61, "61 s behind")] {
            let h = sign(
                &alice,
                "scd",
                &format!("stale-nonce-{}-{}", if offset > 0 { "p" } else { "m" }, offset.abs()),
                &format_rfc3339_utc(NOW + offset),
            );
            let err = auth.check(Some(&h), NOW).unwrap_err();
            assert_eq!(err, Reason::Stale { skew_s: offset, limit_s: 60 });
            assert_eq!(err.to_string(), format!("timestamp outside ±60 s: {words} the server's clock"));
        }
        for offset in [60i64, -60] {
            let h = sign(
                &alice,
                "scd",
                &format!("edge-nonce-{}-{}-00", if offset > 0 { "p" } else { "m" }, offset.abs()),
                &format_rfc3339_utc(NOW + offset),
            );
            assert!(auth.check(Some(&h), NOW).is_ok(), "{offset}");
        }

        let h = sign(&alice, "scd", "method-nonce-00001", &ts).replace("\"key-1\"", "\"key-2\"");
        let err = auth.check(Some(&h), NOW).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("verification_method \"key-2\" of {}: not in the DID document's verificationMethod", alice.did())
        );

        // a document that lists the key but not under authentication
        let path = wba_document_path(dir.path(), alice.did()).unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        doc["authentication"] = serde_json::json!([]);
        std::fs::write(&path, doc.to_string()).unwrap();
        let err = auth.check(Some(&sign(&alice, "scd", "authn-nonce-000001", &ts)), NOW).unwrap_err();
        assert!(err.to_string().ends_with("not listed under the DID document's authentication"), "{err}");
        // deleting the document revokes the DID
        std::fs::remove_file(&path).unwrap();
        let err = auth.check(Some(&sign(&alice, "scd", "revoked-nonce-0001", &ts)), NOW).unwrap_err();
        assert!(matches!(err, Reason::UnknownDid { .. }), "{err}");
    }

    #[test]
    fn the_parser_is_strict_and_names_the_part() {
        let (_dir, alice, _) = setup();
        let good = sign_header_with(&alice, "scd", "0123456789abcdef", "2026-03-27T10:30:00Z");
        assert!(AuthHeader::parse(&good).is_ok());
        let part = |h: &str| match AuthHeader::parse(h) {
            Err(Reason::Malformed { part, reason }) => format!("{part}: {reason}"),
            other => panic!("{h:?} gave {other:?}"),
        };
        assert!(part("Bearer abc").starts_with("scheme: expected DIDWba, got \"Bearer\""));
        assert!(part("DIDWba").starts_with("parameters: expected name=\"value\""));
        assert_eq!(
            part(&good.replace("nonce=", "nonse=")),
            "\"nonse\": unknown parameter (expected did, nonce, timestamp, verification_method, signature)"
        );
        assert_eq!(part(&format!("{good}, nonce=\"0123456789abcdef\"")), "nonce: given twice");
        let without = good.split(", ").filter(|p| !p.starts_with("timestamp")).collect::<Vec<_>>().join(", ");
        assert_eq!(part(&without), "timestamp: missing");
        assert_eq!(part(&good.replace("nonce=\"", "nonce=")), "nonce: expected =\"value\" (a quoted string)");
        assert_eq!(
            part(&good.replacen("\"0123456789abcdef\"", "\"short\"", 1)),
            "nonce: expected 16 to 128 characters of [A-Za-z0-9_-]"
        );
        assert!(part(&good.replace("2026-03-27T10:30:00Z", "1774607400"))
            .starts_with("timestamp: expected RFC 3339 UTC like 2026-03-27T10:30:00Z, got \"1774607400\""));
        assert_eq!(
            part(&(good.clone() + "\"")),
            format!("parameters: expected ',' after signature at byte {}", good.len() - SCHEME.len() - 1)
        );
        assert!(part(&good.replace("signature=\"", "signature=\"A")).starts_with("signature: expected 64 bytes"));
        assert!(part(&good.replace(", nonce", " nonce")).starts_with("parameters: expected ','"));
        assert!(part(&format!("DIDWba did=\"{}\"", "a".repeat(MAX_HEADER_BYTES))).starts_with("header: "));
        assert!(part("DIDWba did=\"did:x\\\"y\"").starts_with("did: only printable ASCII"));
        assert_eq!(part("DIDWba did=\"did:x"), "did: unterminated quoted value");
    }

    #[test]
    fn seeded_adversarial_headers_never_panic() {
        use rand::{Rng, SeedableRng};
        let (_dir, alice, auth) = setup();
        let good = sign_header_with(&alice, "scd", "0123456789abcdef", "2026-03-27T10:30:00Z");
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let alphabet: Vec<char> = "DIDWba =\",\\#:.-_aZ09\t\u{e9}\u{1F600}\0did".chars().collect();
        let mut accepted = 0;
        for _ in 0..20_000 {
            let mut h: Vec<char> = good.chars().collect();
            for _ in 0..rng.random_range(1..6) {
                let i = rng.random_range(0..=h.len());
                match rng.random_range(0..3) {
                    0 if i < h.len() => {
                        h.remove(i);
                    }
                    1 => h.insert(i, alphabet[rng.random_range(0..alphabet.len())]),
                    _ => h.truncate(i),
                }
            }
            let h: String = h.into_iter().collect();
            if auth.check(Some(&h), parse_rfc3339_utc("2026-03-27T10:30:00Z").unwrap()).is_ok() {
                accepted += 1;
            }
        }
        // a mutation may leave the header intact once (e.g. removing and re-adding
        // the same space); it is a replay after that
        assert!(accepted <= 1, "{accepted} mutated headers accepted");
    }

    #[test]
    fn served_paths_map_to_did_wba() {
        assert_eq!(did_for_served_path("example.com", "/.well-known/did.json").as_deref(), Some("did:wba:example.com"));
        assert_eq!(
            did_for_served_path("127.0.0.1:8080", "/user/alice/did.json").as_deref(),
            Some("did:wba:127.0.0.1%3A8080:user:alice")
        );
        for bad in ["/did.json", "/../did.json", "/a//did.json", "/a/did.jsonx", "/metrics", "/a:b/did.json"] {
            assert_eq!(did_for_served_path("example.com", bad), None, "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(list_documents(dir.path()).unwrap().is_empty());
        let alice = Identity::generate().with_did("did:wba:example.com:user:alice").unwrap();
        let path = alice.write_wba_document(dir.path()).unwrap();
        assert_eq!(list_documents(dir.path()).unwrap(), vec![path]);
    }
}
