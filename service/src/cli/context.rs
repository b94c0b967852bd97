//! `scd context FILE...`: a context built from files, the JSON `scd
//! compress --context` reads (and what `scd compress --files` builds in
//! place). Each file is a field named by its path, its kind from the
//! extension. A folder brings its files as ripgrep walks one (the `ignore`
//! crate): `.gitignore`, `.ignore` and `.git/info/exclude` are obeyed, hidden
//! files and `target/` and `node_modules/` are left out (`--hidden`,
//! `--no-ignore` to keep them), and `--exclude GLOB` leaves out more. A
//! quoted pattern (`'src/**/*.rs'`) is expanded here; `-` is standard input
//! (the field `stdin`). A file that is not UTF-8 text, or over the per-field
//! limit, is skipped with one line on stderr; a log over the limit keeps
//! its last `--log-tail` bytes instead, from a line start, and its field
//! name says from which line.

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
    /// How folders are walked.
    #[command(flatten)]
    pub walk: WalkArgs,
}

impl ContextArgs {
    /// `scd compress --files`' context: prose where the extension says nothing.
    pub fn files(paths: Vec<String>, confidential: Vec<String>, walk: WalkArgs) -> Self {
        Self { paths, confidential, kind: FieldKind::Prose, output: None, walk }
    }
}

/// How `scd context` and `scd compress --files` walk folders.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WalkArgs {
    /// Leave out paths matching this glob, as a `.gitignore` line would
    /// (repeatable: `--exclude '*.lock' --exclude 'docs/**'`).
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Walk hidden files and folders too.
    #[arg(long)]
    pub hidden: bool,
    /// Do not obey `.gitignore`, `.ignore` and `.git/info/exclude`, and walk
    /// `target/` and `node_modules/` too.
    #[arg(long)]
    pub no_ignore: bool,
    /// A log over the per-field limit keeps its last this many bytes (at
    /// most the limit; default: the limit), from a line start.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub log_tail: Option<u64>,
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

/// Folders left out unless `--no-ignore` (build output and installed
/// packages, which a repository's `.gitignore` usually names anyway).
const SKIPPED_DIRS: [&str; 2] = ["target", "node_modules"];

/// Every file under `dir` as ripgrep would walk it, sorted by path.
fn walk(dir: &Path, opts: &WalkArgs, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut overrides = ignore::overrides::OverrideBuilder::new(dir);
    for glob in &opts.exclude {
        overrides.add(&format!("!{glob}")).with_context(|| format!("--exclude {glob}: not a valid glob"))?;
    }
    if !opts.no_ignore {
        for d in SKIPPED_DIRS {
            overrides.add(&format!("!{d}/")).expect("a valid glob");
        }
    }
    // git's own files (remote URLs may carry tokens) are never context, even with --hidden
    overrides.add("!.git/").expect("a valid glob");
    let mut walker = ignore::WalkBuilder::new(dir);
    walker
        .hidden(!opts.hidden)
        .ignore(!opts.no_ignore)
        .git_ignore(!opts.no_ignore)
        .git_exclude(!opts.no_ignore)
        .git_global(false)
        .parents(!opts.no_ignore)
        .require_git(false)
        .overrides(overrides.build().context("--exclude")?)
        .sort_by_file_path(|a, b| a.cmp(b));
    for entry in walker.build() {
        let entry = entry.with_context(|| dir.display().to_string())?;
        if entry.file_type().is_some_and(|t| t.is_file()) {
            out.push(entry.into_path());
        }
    }
    Ok(())
}

/// The files `paths` name, in order, each once.
fn expand(paths: &[String], opts: &WalkArgs) -> anyhow::Result<Vec<PathBuf>> {
    let mut excluded = globset::GlobSetBuilder::new();
    for glob in &opts.exclude {
        excluded.add(globset::Glob::new(glob).with_context(|| format!("--exclude {glob}: not a valid glob"))?);
    }
    let excluded = excluded.build().context("--exclude")?;
    let mut files = Vec::new();
    for p in paths {
        let path = Path::new(p);
        if path.is_dir() {
            walk(path, opts, &mut files)?;
        } else if path.is_file() {
            files.push(path.to_path_buf());
        } else if p.contains(['*', '?', '[']) {
            // as for folders: hidden files, target/ and node_modules/ only when the pattern names them
            let glob_opts = glob::MatchOptions { require_literal_leading_dot: !opts.hidden, ..Default::default() };
            let named = |c: &str| p.split('/').any(|part| part == c);
            let matched: Vec<PathBuf> = glob::glob_with(p, glob_opts)
                .with_context(|| format!("{p}: not a valid pattern"))?
                .filter_map(Result::ok)
                .filter(|m| m.is_file())
                .filter(|m| {
                    m.components().all(|c| {
                        let c = c.as_os_str().to_str().unwrap_or("");
                        opts.no_ignore || !SKIPPED_DIRS.contains(&c) || named(c)
                    })
                })
                .filter(|m| !excluded.is_match(m) && !m.file_name().is_some_and(|n| excluded.is_match(n)))
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

/// `n` bytes for a person: `9.0 MiB`, `512 KiB`, `300 bytes`.
fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// A file's field, or `None` with a line on stderr saying why it is
/// skipped. A file over the per-field limit is not read (a log: only its
/// tail).
fn file_field(
    path: &Path,
    args: &ContextArgs,
    limits: &ContextLimits,
) -> anyhow::Result<Option<(String, FieldKind, String)>> {
    let name = path.to_string_lossy().trim_start_matches("./").to_string();
    let kind = kind_of(path).unwrap_or(args.kind);
    let (max, len) = (limits.max_field_bytes, std::fs::metadata(path).with_context(|| name.clone())?.len());
    if len > max as u64 && kind != FieldKind::Log {
        eprintln!("-- {name}: {}, over the limit of {} per field; skipped", size(len), size(max as u64));
        return Ok(None);
    }
    let keep = args.walk.log_tail.map_or(max as u64, |t| t.min(max as u64));
    let (raw, first_line) = if len > max as u64 { tail(path, len, keep)? } else { (std::fs::read(path)?, 1) };
    let Ok(content) = String::from_utf8(raw) else {
        eprintln!("-- {name}: not UTF-8 text, skipped");
        return Ok(None);
    };
    if content.contains('\0') {
        eprintln!("-- {name}: binary (a NUL byte), skipped");
        return Ok(None);
    }
    if first_line == 1 {
        return Ok(Some((name, kind, content)));
    }
    if content.is_empty() {
        eprintln!("-- {name}: {}, and no whole line in its last {}; skipped", size(len), size(keep));
        return Ok(None);
    }
    eprintln!(
        "-- {name}: {}, over the limit of {} per field; kept its last {} (from line {first_line}; --log-tail)",
        size(len),
        size(max as u64),
        size(content.len() as u64)
    );
    Ok(Some((format!("{name} (from line {first_line})"), kind, content)))
}

/// The last `keep` bytes of the `len`-byte file at `path`, from the first
/// line that starts inside them, and that line's number; nothing before
/// the tail is held in memory.
fn tail(path: &Path, len: u64, keep: u64) -> anyhow::Result<(Vec<u8>, usize)> {
    use std::io::{BufRead as _, Seek as _};
    let mut file = std::io::BufReader::new(std::fs::File::open(path)?);
    // lines that end before the tail starts (the byte before it included)
    let cut = len - keep;
    let mut newlines = 0usize;
    let mut seen = 0u64;
    while seen < cut {
        let buf = file.fill_buf()?;
        let take = buf.len().min(usize::try_from(cut - seen).unwrap_or(usize::MAX));
        anyhow::ensure!(take > 0, "{}: shorter than its size", path.display());
        newlines += buf[..take].iter().filter(|&&b| b == b'\n').count();
        file.consume(take);
        seen += take as u64;
    }
    let at_line_start = cut == 0 || {
        file.seek(std::io::SeekFrom::Start(cut - 1))?;
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut file, &mut one)?;
        one[0] == b'\n'
    };
    let mut rest = Vec::with_capacity(usize::try_from(keep).unwrap_or(0));
    std::io::Read::read_to_end(&mut file, &mut rest)?;
    if !at_line_start {
        // from the first whole line (a line longer than the tail: none)
        let skip = rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |i| i + 1);
        newlines += 1;
        rest.drain(..skip);
    }
    Ok((rest, newlines + 1))
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
    for path in expand(&rest, &args.walk)? {
        let Some((name, kind, content)) = file_field(&path, args, limits)? else { continue };
        let confidential = secret.iter().any(|p| p.matches(path.to_string_lossy().trim_start_matches("./")));
        bytes += content.len();
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

/// `--context`'s file parsed as a context (`{"fields": [...]}`), the error
/// naming the flag and the path; a JSON document that is not a context (a
/// pod list, an API payload) gets a hint to pass it with `--files`.
pub fn parse_context(path: &Path, raw: &str) -> anyhow::Result<Context> {
    Context::from_json(raw).map_err(|e| {
        let document = serde_json::from_str::<serde_json::Value>(raw).is_ok_and(|v| v.get("fields").is_none());
        let hint = if document {
            " (--context takes {\"fields\": [...]}, see docs/compress.md; to select from this JSON document \
             itself, pass it with --files)"
        } else {
            ""
        };
        anyhow::anyhow!("--context {}: {e}{hint}", path.display())
    })
}
