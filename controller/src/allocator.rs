//! The process's memory allocator: jemalloc, tuned for a long-running controller with few cores
//! whose memory is mostly long-lived cache entries with short bursts of work between them.
//!
//! Provisioning a thousand instances allocates and frees far more than the caches finally keep.
//! glibc's malloc kept what it freed between the kept objects resident (it gives memory back on
//! its own only from the top of its heap): at 1,000 instances 27 MiB of anonymous memory for
//! about 13.6 MB of live objects, even with its arenas capped, its mmap threshold fixed and a
//! `malloc_trim` every 30 s. jemalloc keeps small objects of one size class together in slabs
//! and returns the pages of emptied slabs and freed large blocks to the system after
//! [`OPTIONS`]'s `dirty_decay_ms`, from background threads of its own: 18 MiB at 1,000 in the
//! same benchmarks beside it, with no more CPU (docs/benchmarks.md, "Issue 13, jemalloc and the
//! dist builds measured at 1,000").
//!
//! Each binary that takes it says so with [`crate::use_jemalloc!`] (the controller's `main.rs`, and
//! the test that checks it in a process of its own). jemalloc reads [`OPTIONS`] at its first
//! allocation; an operator may add or override options with the environment variable
//! `_RJEM_MALLOC_CONF` (the name of `MALLOC_CONF` in this build of jemalloc, whose symbols are
//! prefixed), e.g. `_RJEM_MALLOC_CONF=dirty_decay_ms:5000`.

pub use tikv_jemallocator::Jemalloc;

/// jemalloc's options: two arenas (jemalloc would take four per core; the controller's work is
/// light, and more arenas scatter the caches' objects over more partly used slabs; one arena
/// measured 0.5 MiB less at 1,000 instances in one run, within what runs differ by), background
/// threads that return free pages (no allocation waits for the purge), freed pages returned
/// after one second without reuse, and returned at once with `MADV_DONTNEED` (not first lazily
/// with `MADV_FREE`, whose pages still count as resident until the kernel needs them).
pub const OPTIONS: &std::ffi::CStr =
    c"narenas:2,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";

/// A C string as jemalloc reads its options (`const char *malloc_conf`).
#[repr(transparent)]
pub struct Conf(*const std::ffi::c_char);

// SAFETY: the pointer is to a `'static` C string that nothing writes.
#[allow(unsafe_code)]
unsafe impl Sync for Conf {}

impl Conf {
    /// `options` as jemalloc reads them.
    pub const fn new(options: &'static std::ffi::CStr) -> Self {
        Self(options.as_ptr())
    }
}

/// Makes jemalloc, with [`OPTIONS`], the allocator of the binary that calls it (once, at the
/// top level of the binary's crate root: the options' symbol must be in the binary itself, where
/// jemalloc's own default would otherwise win).
#[macro_export]
macro_rules! use_jemalloc {
    () => {
        /// The process's allocator ([`controller::allocator`]).
        #[global_allocator]
        static GLOBAL: $crate::allocator::Jemalloc = $crate::allocator::Jemalloc;

        /// jemalloc's options ([`controller::allocator::OPTIONS`]), read at its first
        /// allocation.
        #[allow(unsafe_code, non_upper_case_globals)]
        // SAFETY: the one definition of this symbol in the binary, a pointer to a `'static` C
        // string, as jemalloc declares it.
        #[unsafe(export_name = "_rjem_malloc_conf")]
        static malloc_conf: $crate::allocator::Conf =
            $crate::allocator::Conf::new($crate::allocator::OPTIONS);
    };
}
