//! `scd identity`: Ed25519 identities for DID-authenticated calls
//! (`scd serve --auth did-wba`, `scd client --identity`).

use std::path::PathBuf;

use anyhow::Context as _;
use scd_did::Identity;

/// Identity subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum IdentityCommand {
    /// Create (or reuse) a key file and write its did:wba document into a
    /// DID directory; prints {"did", "identity", "document"}.
    New(NewArgs),
}

/// `scd identity new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The key file (JSON, mode 0600); an existing one is reused, never overwritten.
    #[arg(long)]
    pub out: PathBuf,
    /// The did:wba to sign as, e.g. did:wba:example.com:user:alice.
    #[arg(long)]
    pub did: String,
    /// The DID directory to write the document into (a server's --did-dir).
    #[arg(long)]
    pub did_dir: PathBuf,
}

/// Runs `scd identity …`.
pub fn run(cmd: IdentityCommand) -> anyhow::Result<()> {
    match cmd {
        IdentityCommand::New(args) => {
            anyhow::ensure!(args.did.starts_with("did:wba:"), "--did {:?}: must start with did:wba:", args.did);
            let identity = Identity::load_or_create(&args.out)
                .with_context(|| format!("--out {}", args.out.display()))?
                .with_did(&args.did)
                .with_context(|| format!("--did {}", args.did))?;
            let document = identity
                .write_wba_document(&args.did_dir)
                .with_context(|| format!("--did-dir {}", args.did_dir.display()))?;
            let out = serde_json::json!({
                "did": identity.did(),
                "identity": args.out.display().to_string(),
                "document": document.display().to_string(),
            });
            println!("{out}");
            Ok(())
        }
    }
}
