//! Ed25519 keys as DIDs: the multibase form, `did:key`, and strict
//! signature verification.
//!
//! ```
//! use scd_did::key::{did_key, parse_did_key};
//! use scd_did::Identity;
//!
//! let id = Identity::generate();
//! let did = did_key(&id.verifying_key());
//! assert!(did.starts_with("did:key:z6Mk"));
//! assert_eq!(parse_did_key(&did).unwrap(), id.verifying_key());
//! ```

use ed25519_dalek::{Signature, VerifyingKey};

use crate::error::{Error, Result};

/// The multicodec prefix of an Ed25519 public key (0xed, varint-encoded).
pub const ED25519_MULTICODEC: [u8; 2] = [0xed, 0x01];

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

/// Strict Ed25519 verification of a 64-byte signature.
pub fn verify_bytes(key: &VerifyingKey, bytes: &[u8], signature: &[u8]) -> bool {
    Signature::from_slice(signature).is_ok_and(|sig| key.verify_strict(bytes, &sig).is_ok())
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::SigningKey;

    use super::*;
    use crate::Identity;

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
}
