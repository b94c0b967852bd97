//! One module per subcommand.

pub mod bench;
pub mod demo;
pub mod embed;
pub mod models;
