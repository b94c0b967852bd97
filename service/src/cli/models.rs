//! `scd models list`.

use std::path::PathBuf;

use scd_engine::encoder::list_models;

/// `scd models`: where the models are (it loads none, so this is the one
/// model flag it takes) and what to do.
#[derive(Debug, clap::Args)]
pub struct ModelsArgs {
    /// Folder holding one sub-folder per model (made by models/setup.sh).
    #[arg(long, env = "SCD_MODELS_DIR", default_value = "models/out", global = true)]
    pub models_dir: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: ModelsCommand,
}

/// Model subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// List the models in --models-dir.
    List,
}

/// Runs `scd models ...`.
pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let ModelsArgs { models_dir, command } = args;
    match command {
        ModelsCommand::List => {
            let models = list_models(&models_dir)?;
            if models.is_empty() {
                eprintln!("no models in {} (run models/setup.sh)", models_dir.display());
            }
            println!("{:<20} {:>5} {:>10} {:>5}  {:<28} purpose", "name", "dim", "max_tokens", "prec", "source");
            for m in models {
                let src = &m.manifest.source;
                let source = format!(
                    "{}=={}",
                    src.get("package").and_then(|v| v.as_str()).unwrap_or("?"),
                    src.get("version").and_then(|v| v.as_str()).unwrap_or("?")
                );
                println!(
                    "{:<20} {:>5} {:>10} {:>5}  {:<28} {}",
                    m.manifest.name,
                    m.manifest.dim,
                    m.manifest.max_tokens,
                    m.manifest.precision,
                    source,
                    m.manifest.purpose
                );
            }
            Ok(())
        }
    }
}
