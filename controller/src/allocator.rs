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
//!
//! What provisioning leaves behind is free memory **inside** the arena, between the objects the
//! caches keep: at 1,000 instances the main arena held 29.5 MB from the system of which 17.0 MB
//! were free chunks (2,927 of them, `malloc_info` in the window of the resync benchmark), all of
//! it resident, because glibc gives memory back on its own only from the top of the heap. Two
//! settings keep that down (docs/benchmarks.md, "Issue 13, the controller's free memory given
//! back"):
//!
//! - the mmap threshold is fixed at [`MMAP_THRESHOLD`] (`mallopt(M_MMAP_THRESHOLD)`): glibc
//!   otherwise raises it to the size of every large block freed (up to 32 MiB), after which the
//!   list pages and response bodies of that size come from the heap and leave holes of their
//!   size there when freed; with the threshold fixed they get pages of their own, returned when
//!   freed;
//! - [`trim`] (`malloc_trim(0)`) returns the whole pages inside free chunks, in every arena,
//!   every [`TRIM_EVERY`] ([`trim_periodically`]): one such call in the benchmark's window took
//!   `RssAnon` from 35.9 to 27.4 MiB.

use std::time::Duration;

/// The most malloc arenas the process uses.
pub const ARENAS: i32 = 2;

/// Allocations of this many bytes or more get pages of their own, given back when freed
/// (glibc's own starting value, kept instead of raised).
pub const MMAP_THRESHOLD: i32 = 128 * 1024;

/// How often free memory inside the arenas is given back to the system.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Caps glibc's malloc arenas at [`ARENAS`] and fixes the mmap threshold at [`MMAP_THRESHOLD`];
/// call it first in `main`, before any thread starts. Returns whether the allocator took both
/// settings (it does on glibc). A `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` in the
/// environment, set by an operator, is kept.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() -> bool {
    let set = |variable: &str, parameter: i32, value: i32| {
        std::env::var_os(variable).is_some()
            // SAFETY: mallopt only sets a parameter of glibc's allocator; it is called before
            // any other thread exists, with a positive value each parameter takes.
            || unsafe { libc::mallopt(parameter, value) == 1 }
    };
    let arenas = set("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, ARENAS);
    let mmap = set(
        "MALLOC_MMAP_THRESHOLD_",
        libc::M_MMAP_THRESHOLD,
        MMAP_THRESHOLD,
    );
    arenas && mmap
}

/// Other C libraries keep their own defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}

/// Gives the whole free pages inside every arena back to the system (`malloc_trim(0)`; the
/// memory stays the arena's, the next allocation there faults a fresh page in). Returns whether
/// any page was given back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() -> bool {
    // SAFETY: malloc_trim takes the arenas' locks itself; any thread may call it at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other C libraries give memory back their own way.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

/// [`trim`] every [`TRIM_EVERY`], for ever. A call walks the free chunks and asks the kernel to
/// drop their whole pages, one `madvise` per chunk: 24 ms for 2,048 free chunks of 16 KiB (32 MiB)
/// in `controller/tests/allocator.rs`, about 0.1 % of one core at this cadence. It runs on a
/// blocking thread, so that no reconcile waits behind it on a runtime thread (an allocation
/// that meets the arena it trims still waits for that arena's lock, or takes the other arena).
pub async fn trim_periodically() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let _ = tokio::task::spawn_blocking(trim).await;
    }
}
