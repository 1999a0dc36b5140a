//! The `snapfence` binary; everything it does lives in [`snapfence::cli`].

fn main() -> std::process::ExitCode {
    snapfence::cli::main()
}
