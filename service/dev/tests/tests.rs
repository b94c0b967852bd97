//! End-to-end tests of the `scd-dev` binary (the developer tools), with the
//! real default model where a tool needs one. Without the models they print
//! a skip message, unless SCD_REQUIRE_MODELS=1.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

// The helpers shared with the scd tests (`service/tests`).
#[path = "../../tests/support/mod.rs"]
mod support;
pub(crate) use support::{commands, ready, root, MODEL_FLAGS};

// Feature areas in their own files (under cases/, so cargo does not build
// each as a separate test binary); they share the helpers below.
#[path = "cases/atp.rs"]
mod atp;
#[path = "cases/eval.rs"]
mod eval;
#[path = "cases/help.rs"]
mod help;

/// A fresh, empty directory for one test, removed when dropped.
pub(crate) fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("scd-dev-test-{name}-")).tempdir().unwrap()
}

/// The `scd` binary the tools start: `SCD_BIN` when set, else the one
/// beside `scd-dev` (cargo builds only this package's binaries for its
/// tests: `cargo test --workspace` and `make test` build `scd` too), built
/// here with `cargo build -p scd-service --bin scd` when it is missing.
/// After changing scd-service, `cargo test -p scd-dev` alone runs the `scd`
/// already there: build it first, or run the workspace's tests.
pub(crate) fn scd_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("SCD_BIN") {
            return PathBuf::from(bin);
        }
        let dev = Path::new(env!("CARGO_BIN_EXE_scd-dev"));
        let bin = dev.with_file_name(format!("scd{}", std::env::consts::EXE_SUFFIX));
        if !bin.is_file() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let built = Command::new(cargo)
                .current_dir(root())
                .args(["build", "-p", "scd-service", "--bin", "scd"])
                .status()
                .unwrap_or_else(|e| panic!("building scd: {e}"));
            assert!(
                built.success() && bin.is_file(),
                "cargo build -p scd-service --bin scd: {built}; no {}",
                bin.display()
            );
        }
        bin
    })
}

/// Runs `scd-dev args` with `stdin` on its standard input: (success,
/// stdout, stderr); the tools that start servers run [`scd_bin`].
pub(crate) fn scd_dev(args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut cmd = support::command(Path::new(env!("CARGO_BIN_EXE_scd-dev")));
    support::output(cmd.env("SCD_BIN", scd_bin()).args(args), stdin)
}

#[test]
fn commands_are_read_off_a_help_text() {
    let help = "About\n\nUsage: x <COMMAND>\n\nCommands:\n  eval   Evidence\n  tune   Choose\n          wrapped\n  help   Print\n\nOptions:\n  -h\n";
    assert_eq!(commands(help), ["eval", "tune", "help"]);
}
