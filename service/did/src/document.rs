//! DID documents: where a `did:wba` document lies in a local directory,
//! its W3C JSON form, and the key it asserts. Nothing is ever fetched over
//! the network.
//!
//! ```
//! use std::path::Path;
//! use scd_did::document::wba_document_path;
//!
//! let path = wba_document_path(Path::new("/dids"), "did:wba:example.com:user:alice").unwrap();
//! assert_eq!(path, Path::new("/dids/example.com/user/alice/did.json"));
//! assert!(wba_document_path(Path::new("/dids"), "did:wba:..").is_err());
//! ```

use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;

use crate::error::{Error, Result};
use crate::key::parse_key_multibase;
use crate::pb;

/// The verification method type of the keys in our DID documents.
pub const VERIFICATION_METHOD_TYPE: &str = "Ed25519VerificationKey2020";

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Identity;

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
}
