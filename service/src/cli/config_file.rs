//! `scd serve --config scd.toml`: every flag of `scd serve` (its model flags
//! among them, and the global `--log-format`) settable in a TOML file, under its long name
//! (`http-addr = "127.0.0.1:9090"`; `http_addr` works too). A flag given on
//! the command line, or through its `SCD_*` environment variable, wins over
//! the file; an unknown key is an error naming it; a value is checked by the
//! flag's own parser, so its error names the flag.
//!
//! ```
//! use std::ffi::OsString;
//! use scd_service::cli::config_file::expand;
//!
//! let toml = "http-addr = \"127.0.0.1:9090\"\nmax-sessions = 100\n";
//! let cmd = clap::Command::new("scd").subcommand(
//!     clap::Command::new("serve")
//!         .arg(clap::Arg::new("http_addr").long("http-addr"))
//!         .arg(clap::Arg::new("max_sessions").long("max-sessions").env("SCD_MAX_SESSIONS")),
//! );
//! let argv: Vec<OsString> = ["scd", "serve", "--max-sessions", "7"].map(OsString::from).to_vec();
//! let out = expand(&cmd, argv, "scd.toml", toml, |_| None).unwrap();
//! assert_eq!(out, ["scd", "serve", "--http-addr", "127.0.0.1:9090", "--max-sessions", "7"].map(OsString::from));
//! ```

use std::ffi::OsString;

use anyhow::{bail, Context as _};

/// The subcommand a config file applies to.
const SUBCOMMAND: &str = "serve";

/// `argv` with the `--config FILE` (or `SCD_CONFIG`) of `scd serve`
/// applied: read, and each setting put in as its flag unless the command
/// line or the environment gives that flag. Unchanged for other commands or
/// without a config file.
pub fn apply(cmd: &clap::Command, argv: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some(serve_at) = serve_position(cmd, &argv) else { return Ok(argv) };
    // flags before the subcommand are global ones; --config is serve's
    let mut path: Option<String> = None;
    for (i, a) in argv.iter().enumerate().skip(serve_at + 1) {
        let a = a.to_string_lossy();
        if a == "--config" {
            path = Some(argv.get(i + 1).context("--config: needs a file")?.to_string_lossy().into_owned());
        } else if let Some(p) = a.strip_prefix("--config=") {
            path = Some(p.to_string());
        }
    }
    let path = match path.or_else(|| std::env::var("SCD_CONFIG").ok().filter(|p| !p.is_empty())) {
        Some(p) => p,
        None => return Ok(argv),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("--config {path}"))?;
    expand(cmd, argv, &path, &text, |name| std::env::var_os(name))
}

/// Where `scd serve`'s subcommand stands in `argv`, if `argv` runs it (a
/// `serve` that is another command's value, `scd compress --task serve`,
/// is not it).
fn serve_position(cmd: &clap::Command, argv: &[OsString]) -> Option<usize> {
    let matches = cmd.clone().ignore_errors(true).try_get_matches_from(argv).ok()?;
    (matches.subcommand_name() == Some(SUBCOMMAND)).then(|| argv.iter().position(|a| a == SUBCOMMAND))?
}

/// `argv` with the settings of the TOML `text` (read from `path`) put in
/// right after the subcommand, skipping any flag the command line or the
/// environment (`env`) already gives.
pub fn expand(
    cmd: &clap::Command,
    argv: Vec<OsString>,
    path: &str,
    text: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> anyhow::Result<Vec<OsString>> {
    let Some(serve_at) = serve_position(cmd, &argv) else { return Ok(argv) };
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // the parser's message names the line; it quotes no value of ours
        anyhow::anyhow!("--config {path}: not TOML: {}", e.message())
    })?;
    let serve = cmd.find_subcommand(SUBCOMMAND).context("no serve subcommand")?;
    let args: Vec<&clap::Arg> =
        serve.get_arguments().chain(cmd.get_arguments().filter(|a| a.is_global_set())).collect();
    let given: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut inserted: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let Some(arg) = args.iter().find(|a| a.get_long() == Some(long.as_str())) else {
            bail!("--config {path}: unknown key `{key}` (keys are scd serve's flags, e.g. http-addr)");
        };
        if long == "config" {
            bail!("--config {path}: `config` cannot name another file");
        }
        let flag = format!("--{long}");
        let on_command_line = given.iter().any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
        let in_env = arg.get_env().is_some_and(|name| env(&name.to_string_lossy()).is_some());
        if on_command_line || in_env {
            continue;
        }
        let takes_value = arg.get_action().takes_values();
        let values: Vec<&toml::Value> = match value {
            toml::Value::Array(items) => items.iter().collect(),
            v => vec![v],
        };
        for v in values {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(x) => x.to_string(),
                toml::Value::Boolean(b) if !takes_value => {
                    if *b {
                        inserted.push(flag.clone().into());
                    }
                    continue;
                }
                toml::Value::Boolean(b) => b.to_string(),
                _ => bail!("--config {path}: `{key}` must be a string, a number, a boolean or a list of them"),
            };
            if !takes_value {
                bail!("--config {path}: `{key}` is a switch: true or false");
            }
            inserted.push(flag.clone().into());
            inserted.push(text.into());
        }
    }
    let mut out = argv;
    out.splice(serve_at + 1..serve_at + 1, inserted);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        clap::Command::new("scd")
            .arg(clap::Arg::new("threads").long("threads").global(true).env("SCD_THREADS"))
            .subcommand(
                clap::Command::new("serve")
                    .arg(clap::Arg::new("addr").long("addr").env("SCD_ADDR"))
                    .arg(clap::Arg::new("http_addr").long("http-addr"))
                    .arg(clap::Arg::new("budget_tokenizer").long("budget-tokenizer").action(clap::ArgAction::Append))
                    .arg(clap::Arg::new("explain").long("explain").action(clap::ArgAction::SetTrue))
                    .arg(clap::Arg::new("config").long("config")),
            )
            .subcommand(clap::Command::new("embed").arg(clap::Arg::new("input")))
    }

    fn run(argv: &[&str], toml: &str, env: &[(&str, &str)]) -> anyhow::Result<Vec<String>> {
        let argv = argv.iter().map(OsString::from).collect();
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let out = expand(&cmd(), argv, "scd.toml", toml, |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| OsString::from(v))
        })?;
        Ok(out.into_iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn the_file_fills_what_the_command_line_and_environment_leave() {
        let toml = "addr = \"0.0.0.0:1\"\nhttp_addr = \"127.0.0.1:9\"\nthreads = 4\nexplain = true\n\
                    budget-tokenizer = [\"a=x.json\", \"b=y.json\"]\n";
        assert_eq!(
            run(&["scd", "serve", "--addr", "127.0.0.1:2"], toml, &[("SCD_THREADS", "2")]).unwrap(),
            [
                "scd",
                "serve",
                "--budget-tokenizer",
                "a=x.json",
                "--budget-tokenizer",
                "b=y.json",
                "--explain",
                "--http-addr",
                "127.0.0.1:9",
                "--addr",
                "127.0.0.1:2"
            ]
        );
        // `--flag=value` counts as given; a false switch adds nothing
        assert_eq!(
            run(&["scd", "serve", "--addr=1"], "addr = \"2\"\nexplain = false", &[]).unwrap(),
            ["scd", "serve", "--addr=1"]
        );
        // the environment wins too
        assert_eq!(run(&["scd", "serve"], "addr = \"2\"", &[("SCD_ADDR", "3")]).unwrap(), ["scd", "serve"]);
        // another command is left alone, even with a value that reads `serve`
        assert_eq!(run(&["scd", "embed"], "addr = \"2\"", &[]).unwrap(), ["scd", "embed"]);
        assert_eq!(run(&["scd", "embed", "serve"], "addr = \"2\"", &[]).unwrap(), ["scd", "embed", "serve"]);
        // global flags before the subcommand
        assert_eq!(
            run(&["scd", "--threads", "2", "serve"], "addr = \"2\"", &[]).unwrap(),
            ["scd", "--threads", "2", "serve", "--addr", "2"]
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors_naming_them() {
        let e = |toml: &str| run(&["scd", "serve"], toml, &[]).unwrap_err().to_string();
        assert_eq!(
            e("adrr = \"x\""),
            "--config scd.toml: unknown key `adrr` (keys are scd serve's flags, e.g. http-addr)"
        );
        assert!(
            e("addr = { a = 1 }").contains("`addr` must be a string, a number, a boolean or a list"),
            "{}",
            e("addr = { a = 1 }")
        );
        assert_eq!(e("explain = \"yes\""), "--config scd.toml: `explain` is a switch: true or false");
        assert!(e("addr = ").starts_with("--config scd.toml: not TOML"), "{}", e("addr = "));
        assert!(e("config = \"other.toml\"").contains("cannot name another file"));
    }
}
