//! `strom sink ...`: commands that move a topic's events into another
//! system. Each sink keeps its position in the target system, in the same
//! transaction as the data, so a restart after any crash resumes exactly
//! where the last commit left off. Only PostgreSQL for now.

mod mapping;
mod postgres;
mod source;
mod store;
mod writer;

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum SinkCmd {
    /// Write a topic's JSON metadata into a PostgreSQL table, exactly once.
    Postgres(postgres::PostgresArgs),
}

pub fn run(cmd: SinkCmd, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    match cmd {
        SinkCmd::Postgres(a) => postgres::run(a, group_file),
    }
}
