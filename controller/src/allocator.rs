//! The process's memory allocator, tuned for a long-running controller with few cores.
//!
//! glibc's malloc gives each thread that allocates while another holds an arena's lock an arena
//! of its own, up to eight per core, and memory freed in one arena is reused only by allocations
//! that land in that arena again. The controller's tokio workers and blocking threads (Helm,
//! file reads) allocate the watch caches' objects and every reconcile's transient data in
//! whichever arena they hold, so with many arenas the freed space stays scattered over all of
//! them and the resident memory grows well past what is in use. [`tune`] caps the arenas at
//! [`ARENAS`] (`mallopt(M_ARENA_MAX)`, as `MALLOC_ARENA_MAX` does) before the runtime starts
//! its threads. docs/benchmarks.md (issue 13, the controller measured at 1,000) has an A/B of
//! the cap at 200 instances (no measurable difference there; not A/B'd at 1,000).

/// The most malloc arenas the process uses.
pub const ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`ARENAS`]; call it first in `main`, before any thread starts.
/// Returns whether the allocator took the setting (it does on glibc; a `MALLOC_ARENA_MAX` in the
/// environment set by an operator is kept).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return true;
    }
    // SAFETY: mallopt only sets a parameter of glibc's allocator; it is called before any other
    // thread exists, and M_ARENA_MAX takes any positive count.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) == 1 }
}

/// Other C libraries keep their own defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}
