//! Layer 1a: who sent this, and may I believe it.
//!
//! The keys, DIDs, documents, key file and replay log come from
//! [`scd_did`] and are re-exported here; this module adds what is ATP's own:
//! signed `atp.v1` messages and their verification.
//!
//! Every agent has an Ed25519 key pair and a DID: `did:key:z…` (self-
//! certifying: `z` + base58btc(0xed 0x01 ‖ 32-byte public key), so every
//! Ed25519 did:key starts with `did:key:z6Mk`) or `did:wba:host[:path]`
//! (a DID document; here resolved from a local directory only, never over
//! the network).
//!
//! **The signing rule.** A signed message is signed with the sender's key
//! over its *type tag*, the message's full protobuf name and a zero byte
//! (`atp.v1.Heartbeat\0`), followed by its *deterministic protobuf
//! encoding with the signature field(s) cleared*. The tag keeps a signature
//! on one message type from verifying as another whose fields happen to
//! encode alike (a heartbeat's bytes replayed as a back-pressure signal).
//! The deterministic encoding is what prost's
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
//! use scd_atp::identity::{DidResolver, Identity, MemoryNonceLog, SignMessages, Verifier};
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

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ed25519_dalek::VerifyingKey;
use scd_did::Error as DidError;

pub use scd_did::document::{
    did_document_from_json, did_document_to_json, document_key, wba_document_path, VERIFICATION_METHOD_TYPE,
};
pub use scd_did::key::{did_key, key_multibase, parse_did_key, parse_key_multibase, verify_bytes, ED25519_MULTICODEC};
pub use scd_did::nonce::{fresh_nonce, MemoryNonceLog, NonceLog};
pub use scd_did::time::{now_s, MAX_CLOCK_SKEW_S};
pub use scd_did::Identity;

pub use crate::error::AuthFailure;
use crate::pb;

/// Unix time now as a protobuf timestamp.
pub fn timestamp_now() -> pb::Timestamp {
    let now = scd_did::time::now();
    pb::Timestamp { seconds: now.as_second(), nanos: now.subsec_nanosecond() }
}

/// Signing protobuf messages with an [`Identity`] (see the module docs for
/// the rule).
pub trait SignMessages {
    /// Sets `msg`'s signature over [`Signed::signing_bytes`].
    fn sign<M: Signed>(&self, msg: &mut M);
    /// A fresh random non-zero nonce and the timestamp now, then [`SignMessages::sign`].
    fn stamp_and_sign<M: Signed>(&self, msg: &mut M);
    /// The subject's acknowledging signature (`responder_signature`) over
    /// the same bytes the evaluator signs.
    fn countersign(&self, proof: &mut pb::InteractionProof);
}

impl SignMessages for Identity {
    fn sign<M: Signed>(&self, msg: &mut M) {
        let signature = self.sign_bytes(&msg.signing_bytes());
        *msg.signature_mut() = signature;
    }

    fn stamp_and_sign<M: Signed>(&self, msg: &mut M) {
        msg.set_nonce(fresh_nonce());
        msg.set_timestamp_now();
        self.sign(msg);
    }

    fn countersign(&self, proof: &mut pb::InteractionProof) {
        proof.responder_signature = self.sign_bytes(&proof.signing_bytes());
    }
}

// ---------------------------------------------------------------------------
// Signed messages

/// A protobuf message signed by its sender (see the module docs for the rule).
pub trait Signed: prost::Message + Clone + Default {
    /// The full protobuf name (`atp.v1.Heartbeat`): the type tag signed first.
    const TYPE_NAME: &'static str;
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
    /// The bytes signed: the type tag ([`Signed::TYPE_NAME`] and a zero
    /// byte), then the deterministic encoding with the signature field(s)
    /// cleared.
    fn signing_bytes(&self) -> Vec<u8> {
        let mut copy = self.clone();
        copy.clear_signatures();
        let mut bytes = Vec::with_capacity(Self::TYPE_NAME.len() + 1 + copy.encoded_len());
        bytes.extend_from_slice(Self::TYPE_NAME.as_bytes());
        bytes.push(0);
        copy.encode(&mut bytes).expect("a Vec grows to fit");
        bytes
    }
}

/// `Signed` for messages whose sender is an `AgentId` field; `+ field`
/// names a second signature cleared for signing too.
macro_rules! signed_by_agent_id {
    ($($ty:ident . $sender:ident $(+ $second:ident)?),* $(,)?) => {$(
        impl Signed for pb::$ty {
            const TYPE_NAME: &'static str = concat!("atp.v1.", stringify!($ty));
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
    RouteQuery.from,
    ProofAck.from,
    TaskCheckpoint.agent,
    // the evaluator signs; the subject countersigns in responder_signature
    InteractionProof.evaluator + responder_signature,
);

impl Signed for pb::AtpMessage {
    const TYPE_NAME: &'static str = "atp.v1.AtpMessage";
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

// ---------------------------------------------------------------------------
// Verification

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
                DidError::Did { reason, .. } => unknown(reason),
                other => unknown(other.to_string()),
            });
        }
        if !did.starts_with("did:wba:") {
            return Err(unknown("not a DID this agent resolves (did:key:… or did:wba:…)".into()));
        }
        let dir = self.wba_dir.as_ref().ok_or_else(|| unknown("no did:wba directory configured".into()))?;
        let path = wba_document_path(dir, did).map_err(|e| match e {
            DidError::Did { reason, .. } => unknown(reason),
            other => unknown(other.to_string()),
        })?;
        let bytes = std::fs::read(&path).map_err(|e| unknown(format!("no document at {}: {e}", path.display())))?;
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| unknown(format!("{} is not JSON: {e}", path.display())))?;
        let doc = did_document_from_json(&json).map_err(unknown)?;
        document_key(&doc, did).map_err(unknown)
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
    fn signature_is_over_the_encoding_with_signature_cleared() {
        let alice = Identity::generate();
        let mut msg = probe(&alice);
        alice.stamp_and_sign(&mut msg);
        assert_ne!(msg.nonce, 0);
        let mut manual = msg.clone();
        manual.signature = Vec::new();
        let bytes = [b"atp.v1.CapabilityProbe\0".as_slice(), &manual.encode_to_vec()].concat();
        assert_eq!(msg.signing_bytes(), bytes);
        assert_eq!(msg.signature, alice.sign_bytes(&bytes));
        assert!(verify_bytes(&alice.verifying_key(), &bytes, &msg.signature));
    }

    #[test]
    fn a_signature_on_one_message_type_does_not_verify_as_another() {
        // the same field bytes under two types: the type tag tells them apart
        let alice = Identity::generate();
        let (beat, pressure) = (pb::Heartbeat::default(), pb::Backpressure::default());
        assert_eq!(beat.encode_to_vec(), pressure.encode_to_vec());
        assert_ne!(beat.signing_bytes(), pressure.signing_bytes());
        let signature = alice.sign_bytes(&beat.signing_bytes());
        assert!(verify_bytes(&alice.verifying_key(), &beat.signing_bytes(), &signature));
        assert!(!verify_bytes(&alice.verifying_key(), &pressure.signing_bytes(), &signature));
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
        assert_eq!(proof.signing_bytes(), [b"atp.v1.InteractionProof\0".as_slice(), &manual.encode_to_vec()].concat());
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
}
