//! The `snapfence` binary; everything it does lives in [`snapfence::cli`].

/// mimalloc rather than glibc's malloc: buffers allocated on one worker thread and freed on another
/// made glibc's arenas spend a third of the CPU moving chunks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    snapfence::cli::main()
}
