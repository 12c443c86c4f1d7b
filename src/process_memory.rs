//! The daemon's own memory (not the GPUs'): two standard glibc settings, nothing that must be
//! regenerated or re-measured after a code change.
//!
//! - One malloc arena: the daemon's threads allocate little and rarely at once, and an arena per
//!   thread would keep pages of its own.
//! - Once the daemon is ready, and again when the pollers' first rounds are done, [`trim`]
//!   gives the heap that startup freed back to the kernel (`malloc_trim`).
//!
//! The rest is the shape of the program: the config is parsed and the daemon built on a startup
//! thread that ends (`cmd::run`), so the stack that deep work touched goes with it; one async
//! worker; cloud clients built on first use; large futures that run once boxed; debug and trace
//! events compiled out of release builds.
//!
//! Both calls are thin and their effect is on resident memory, which a unit test cannot tell
//! from noise: `benches/exporter.rs` measures it (anonymous and file-backed memory, in one
//! run beside other exporters).

/// Limits malloc to one arena. Call first thing in `main`, before any thread starts.
pub fn at_start() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; before any thread starts, nothing
    // allocates concurrently. (No safe API sets glibc's arena count.)
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Gives free heap memory back to the kernel. Blocks for as long as the allocator walks its
/// free lists: call it off the async worker.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel. (No safe API does.)
    unsafe {
        libc::malloc_trim(0);
    }
}
