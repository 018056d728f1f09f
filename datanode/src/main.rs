//! `sluice-datanode`: runs one DataNode until SIGINT/SIGTERM (see
//! [`sluice_datanode::command`]).

fn main() -> anyhow::Result<()> {
    sluice_datanode::command::main(std::env::args_os())
}
