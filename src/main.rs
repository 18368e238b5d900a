//! The `memwatch` command.

fn main() -> std::process::ExitCode {
    memwatch::cli::main()
}
