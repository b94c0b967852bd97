//! `scd models list`.

use scd_engine::encoder::list_models;

use crate::config::ModelArgs;

/// Model subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// List the models in --models-dir.
    List,
}

/// Runs `scd models ...`.
pub fn run(model: &ModelArgs, cmd: ModelsCommand) -> anyhow::Result<()> {
    match cmd {
        ModelsCommand::List => {
            let models = list_models(&model.models_dir)?;
            if models.is_empty() {
                eprintln!("no models in {} (run models/setup.sh)", model.models_dir.display());
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
