//! `scd context FILE...`: a context built from files, the JSON `scd
//! compress --context` reads (and what `scd compress --files` builds in
//! place). Each file is a field named by its path, its kind from the
//! extension; a folder brings its files (hidden ones, `target/` and
//! `node_modules/` left out); a quoted pattern (`'src/**/*.rs'`) is
//! expanded here; `-` is standard input (the field `stdin`). Files that are
//! not UTF-8 text are skipped with a note on stderr.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use scd_engine::context::{Context, ContextLimits, Field, FieldKind};

/// Arguments of `scd context`.
#[derive(Debug, Clone, clap::Args)]
pub struct ContextArgs {
    /// Files, folders, quoted patterns (`'src/**/*.rs'`), or `-` for stdin.
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// Fields whose path matches this pattern are confidential: used for
    /// nothing and never sent (repeat for several; `'*.env'`, `secrets/*`).
    #[arg(long)]
    pub confidential: Vec<String>,
    /// The kind of stdin's field (`-`), and of files whose extension says nothing.
    #[arg(long, value_parser = kind_arg, default_value = "prose")]
    pub kind: FieldKind,
    /// Write the context here instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

fn kind_arg(s: &str) -> Result<FieldKind, String> {
    FieldKind::ALL
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("expected one of {}", FieldKind::ALL.map(FieldKind::as_str).join(", ")))
}

/// The kind a file's extension names, if it names one.
pub fn kind_of(path: &Path) -> Option<FieldKind> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "rs" | "py" | "js" | "mjs" | "ts" | "tsx" | "jsx" | "go" | "java" | "c" | "h" | "cc" | "cpp" | "hpp" | "cs"
        | "rb" | "kt" | "swift" | "scala" | "sh" | "bash" | "lua" | "php" | "toml" | "yaml" | "yml" => FieldKind::Code,
        "log" => FieldKind::Log,
        "json" | "jsonl" | "ndjson" => FieldKind::Json,
        "csv" | "tsv" | "sql" => FieldKind::Table,
        "md" | "markdown" => FieldKind::Markdown,
        "txt" | "rst" | "adoc" => FieldKind::Prose,
        _ => return None,
    })
}

fn skipped_dir(name: &str) -> bool {
    name.starts_with('.') || name == "target" || name == "node_modules"
}

/// Every file under `dir`, sorted, folders skipped as the module says.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !skipped_dir(name) {
                walk(&p, out)?;
            }
        } else if p.is_file() && !name.starts_with('.') {
            out.push(p);
        }
    }
    Ok(())
}

/// The files `paths` name, in order, each once.
fn expand(paths: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        let path = Path::new(p);
        if path.is_dir() {
            walk(path, &mut files)?;
        } else if path.is_file() {
            files.push(path.to_path_buf());
        } else if p.contains(['*', '?', '[']) {
            // as for folders: hidden files, target/ and node_modules/ only when the pattern names them
            let opts = glob::MatchOptions { require_literal_leading_dot: true, ..Default::default() };
            let named = |c: &str| p.split('/').any(|part| part == c);
            let matched: Vec<PathBuf> = glob::glob_with(p, opts)
                .with_context(|| format!("{p}: not a valid pattern"))?
                .filter_map(Result::ok)
                .filter(|m| m.is_file())
                .filter(|m| {
                    m.components().all(|c| {
                        let c = c.as_os_str().to_str().unwrap_or("");
                        !(c == "target" || c == "node_modules") || named(c)
                    })
                })
                .collect();
            anyhow::ensure!(!matched.is_empty(), "{p}: the pattern matches no file");
            files.extend(matched);
        } else {
            anyhow::bail!("{p}: no such file or folder");
        }
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.clone()));
    Ok(files)
}

/// The context of `args.paths`, within `limits` (errors name the limit).
pub fn build(args: &ContextArgs, limits: &ContextLimits) -> anyhow::Result<Context> {
    let secret: Vec<glob::Pattern> = args
        .confidential
        .iter()
        .map(|p| glob::Pattern::new(p).with_context(|| format!("--confidential {p}: not a valid pattern")))
        .collect::<anyhow::Result<_>>()?;
    let mut fields = Vec::new();
    let mut bytes = 0usize;
    let stdin = args.paths.iter().any(|p| p == "-");
    let rest: Vec<String> = args.paths.iter().filter(|p| *p != "-").cloned().collect();
    if stdin {
        let mut content = String::new();
        std::io::stdin().read_to_string(&mut content).context("-: standard input is not UTF-8 text")?;
        fields.push(Field { name: "stdin".into(), kind: args.kind, content, confidential: false });
    }
    for path in expand(&rest)? {
        let name = path.to_string_lossy().trim_start_matches("./").to_string();
        let raw = std::fs::read(&path).with_context(|| name.clone())?;
        let Ok(content) = String::from_utf8(raw) else {
            eprintln!("-- {name}: not UTF-8 text, skipped");
            continue;
        };
        if content.contains('\0') {
            eprintln!("-- {name}: binary (a NUL byte), skipped");
            continue;
        }
        let kind = kind_of(&path).unwrap_or(args.kind);
        let confidential = secret.iter().any(|p| p.matches(&name));
        bytes += content.len();
        anyhow::ensure!(
            content.len() <= limits.max_field_bytes,
            "{name}: {} bytes, over the limit of {} per field",
            content.len(),
            limits.max_field_bytes
        );
        anyhow::ensure!(
            bytes <= limits.max_context_bytes,
            "the files hold over {} bytes, the limit of one context (stopped at {name})",
            limits.max_context_bytes
        );
        fields.push(Field { name, kind, content, confidential });
        anyhow::ensure!(
            fields.len() <= limits.max_fields,
            "over {} files, the limit of one context",
            limits.max_fields
        );
    }
    anyhow::ensure!(!fields.is_empty(), "no text file among {:?}", args.paths);
    Ok(Context { fields })
}

/// Runs `scd context`.
pub fn run(args: ContextArgs) -> anyhow::Result<()> {
    let ctx = build(&args, &ContextLimits::default())?;
    let json = serde_json::to_string_pretty(&ctx)?;
    let n = ctx.fields.len();
    let secret = ctx.fields.iter().filter(|f| f.confidential).count();
    match &args.output {
        Some(p) => std::fs::write(p, json + "\n").with_context(|| format!("--output {}", p.display()))?,
        None => println!("{json}"),
    }
    eprintln!("-- {n} fields ({secret} confidential)");
    Ok(())
}
