//! `sluice-metadata`: runs the metadata service until SIGINT or SIGTERM (see
//! [`sluice_metadata::command`]).

fn main() -> anyhow::Result<()> {
    sluice_metadata::command::main(std::env::args_os())
}
