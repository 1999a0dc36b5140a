//! The `snapfence` binary; everything it does lives in [`snapfence::cli`].

/// mimalloc rather than glibc's malloc: under load a request's buffers (headers, bodies, rows)
/// are allocated on one worker thread and freed on another, and glibc's arenas then spent a
/// third of the service's CPU merging and moving chunks (bench/README.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    snapfence::cli::main()
}
