//! Helpers both end-to-end test binaries share, included by path in each
//! (`service/tests/tests.rs` for `scd`, `service/dev/tests/tests.rs` for
//! `scd-dev`): the workspace root, the rule for a missing model, a
//! workspace binary run in the root with the test environment, and what a
//! `--help` lists (its subcommands, the model flags).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workspace root: the nearest folder above the including crate that
/// holds `Cargo.lock`.
pub(crate) fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().find(|d| d.join("Cargo.lock").is_file()).unwrap_or(manifest).to_path_buf()
}

/// A test's input is missing: under CI (`CI=true`) or `SCD_REQUIRE_MODELS=1`
/// that fails the test; elsewhere it prints why it skips.
pub(crate) fn skip(msg: &str) {
    let required = |var: &str, on: &str| std::env::var(var).is_ok_and(|v| v == on);
    if required("CI", "true") || required("SCD_REQUIRE_MODELS", "1") {
        panic!("{msg} (required: CI=true or SCD_REQUIRE_MODELS=1)");
    }
    eprintln!("SKIP: {msg}");
}

/// Whether the default model and ONNX Runtime are there; if not, [`skip`].
pub(crate) fn ready() -> bool {
    let ok = root().join("models/out/e5-small/reference.json").is_file()
        && root().join(".tools/ort/libonnxruntime.so").is_file();
    if !ok {
        skip("models or ONNX Runtime missing; run models/setup.sh");
    }
    ok
}

/// `exe` in the workspace root with the test environment: the tree's
/// models and ONNX Runtime, two threads, and no persistent embedding
/// cache (it is tested on its own).
pub(crate) fn command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.current_dir(root())
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", root().join("models/out"))
        .env("SCD_EMBEDDING_CACHE", "off")
        .env("SCD_THREADS", "2");
    cmd
}

/// Runs `cmd` with `stdin` on its standard input: (success, stdout, stderr).
pub(crate) fn output(cmd: &mut Command, stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The model flags, as `--help` lists them.
pub(crate) const MODEL_FLAGS: [&str; 12] = [
    "--model <",
    "--models-dir <",
    "--ort-lib <",
    "--threads <",
    "--ort-spinning <",
    "--device <",
    "--batch-tokens <",
    "--max-batch-rows <",
    "--io-binding <",
    "--split-copies",
    "--embedding-cache <",
    "--embedding-cache-bytes <",
];

/// The subcommands a `--help` lists under `Commands:`, in order (a wrapped
/// description's further lines, indented deeper, name none).
pub(crate) fn commands(help: &str) -> Vec<String> {
    let listed = help.split_once("Commands:\n").map_or("", |(_, rest)| rest);
    let lines = listed.lines().take_while(|l| l.starts_with("  "));
    let named = lines.filter(|l| !l[2..].starts_with(' '));
    named.filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}
