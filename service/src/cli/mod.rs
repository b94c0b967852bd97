//! One module per subcommand.

pub mod demo;
pub mod embed;
pub mod models;
