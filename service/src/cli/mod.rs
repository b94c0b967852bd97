//! One module per subcommand.

pub mod bench;
pub mod client;
pub mod compress;
pub mod demo;
pub mod embed;
pub mod eval;
pub mod load;
pub mod models;
pub mod serve;
