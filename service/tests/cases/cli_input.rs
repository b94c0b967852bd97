//! What `scd compress` says about input it cannot use as given.

use crate::{ready, scd, scratch};

/// A JSON document handed to `--context` (not a context) is refused with a
/// hint to pass it with `--files`, which selects from it; a context that is
/// merely wrong gets no such hint.
#[test]
fn a_json_document_given_as_context_is_pointed_to_files() {
    if !ready() {
        return;
    }
    let dir = scratch("raw-json");
    let path = dir.join("pods.json");
    std::fs::write(&path, r#"{"items": [{"name": "web-1", "status": "CrashLoopBackOff"}]}"#).unwrap();
    let p = path.to_str().unwrap();
    let hint = "to select from this JSON document itself, pass it with --files";
    let (ok, stdout, stderr) = scd(&["compress", "--task", "which pod crashes", "--context", p, "--budget", "99"], "");
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(stderr.contains(&format!("--context {p}: context.items: unknown field `items`")), "{stderr}");
    assert!(stderr.contains(hint) && !stderr.contains("CrashLoopBackOff"), "{stderr}");
    let args = ["compress", "--task", "which pod crashes", "--files", p, "--budget", "99", "--format", "text"];
    let (ok, stdout, stderr) = scd(&args, "");
    assert!(ok && stdout.contains("CrashLoopBackOff"), "{stdout}{stderr}");
    // a context with a typo is not a document: no hint
    std::fs::write(&path, r#"{"fields": [], "feilds": []}"#).unwrap();
    let (ok, _, stderr) = scd(&["compress", "--task", "t", "--context", p, "--budget", "99"], "");
    assert!(!ok && stderr.contains("unknown field `feilds`") && !stderr.contains(hint), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
