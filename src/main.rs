//! `livegate` binary: everything lives in the library (`livegate::cli`).

fn main() -> std::process::ExitCode {
    livegate::cli::main()
}
