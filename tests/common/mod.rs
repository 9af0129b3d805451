pub mod fixtures;
pub mod server;
