//! What `scd-dev --help` lists, and the model flags of its commands.

use crate::{commands, scd_dev, MODEL_FLAGS};

/// The developer tools, as `scd-dev --help` lists them (`scd --help` lists
/// none of them: scd-service's `cli` tests check that side).
const DEV_COMMANDS: [&str; 7] = ["eval", "tune", "bench-load", "bench-conns", "bench-encode", "bench-replicas", "atp"];

fn help(args: &[&str]) -> String {
    let (ok, stdout, stderr) = scd_dev(args, "");
    assert!(ok, "{args:?}: {stderr}");
    stdout
}

/// Issue 41: the developer tools left the product binary for `scd-dev`.
#[test]
fn scd_dev_help_lists_the_developer_tools() {
    let out = help(&["--help"]);
    assert!(out.contains("Usage: scd-dev"), "{out}");
    let want: Vec<&str> = DEV_COMMANDS.into_iter().chain(["help"]).collect();
    assert_eq!(commands(&out), want, "{out}");
    // `atp agent` is what users run: it stays in `scd`
    let out = help(&["atp", "--help"]);
    assert_eq!(commands(&out), ["demo", "bench", "flood", "help"], "{out}");
    let (ok, _, stderr) = scd_dev(&["atp", "agent", "--help"], "");
    assert!(!ok && stderr.contains("unrecognized subcommand 'agent'"), "{stderr}");
}

/// Issue 42, for the tools that moved here: the commands that load a model
/// list the model flags; the others (and `scd-dev --help`) list none.
#[test]
fn model_flags_belong_to_the_commands_that_load_a_model() {
    for args in
        [&["--help"][..], &["bench-replicas", "--help"], &["atp", "bench", "--help"], &["atp", "flood", "--help"]]
    {
        let out = help(args);
        assert!(out.contains("Usage: scd-dev"), "{args:?}: {out}");
        for flag in MODEL_FLAGS {
            assert!(!out.contains(flag), "{args:?} lists {flag}: {out}");
        }
    }
    for cmd in ["eval", "tune", "bench-load", "bench-conns", "bench-encode"] {
        let out = help(&[cmd, "--help"]);
        assert!(out.contains("Usage: scd-dev"), "{cmd}: {out}");
        for flag in MODEL_FLAGS {
            assert!(out.contains(flag), "{cmd} lacks {flag}: {out}");
        }
    }
}
