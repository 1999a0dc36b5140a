//! The `snapfence` binary; everything it does lives in [`snapfence::cli`].

/// mimalloc rather than glibc's malloc: buffers allocated on one worker thread and freed on another
/// made glibc's arenas spend a third of the CPU moving chunks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // mimalloc asks for transparent huge pages, so each first touch of its memory zeroed 2 MiB: half
    // the instance's CPU while 5,000 connections arrived at once, and 150 MB resident against 86.
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("snapfence: could not turn transparent huge pages off ({e}); running with them");
    }
    snapfence::cli::main()
}
