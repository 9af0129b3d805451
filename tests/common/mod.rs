pub mod fixtures;
pub mod process;
pub mod server;
