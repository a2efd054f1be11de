//! The controller's allocator in a process of its own, as its `main.rs` takes it
//! (`controller::use_jemalloc!`): jemalloc reads the controller's options (its background
//! threads run), and memory freed between kept objects goes back to the system by itself,
//! without any call to give it back (what glibc's malloc kept resident).

use std::time::{Duration, Instant};

controller::use_jemalloc!();

/// This process's anonymous resident memory, in KiB (`RssAnon` of `/proc/self/status`).
fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon")
}

/// The names of this process's threads (`/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim_end().to_string())
        .collect()
}

/// One test, so that no other test of this binary allocates while it measures.
#[test]
fn freed_memory_between_kept_objects_goes_back_to_the_system_by_itself() {
    // 32 MiB of 16 KiB blocks, each followed by a small block that is kept: freed, they are free
    // memory between live objects, which glibc's malloc kept resident until a `malloc_trim`.
    let mut kept = Vec::with_capacity(2048);
    let mut freed = Vec::with_capacity(2048);
    for i in 0..2048u32 {
        freed.push(vec![(i % 251) as u8; 16 * 1024]);
        kept.push(vec![(i % 13) as u8; 64]);
    }

    // `background_thread:true` among the options read: jemalloc runs its purging threads.
    let names = thread_names();
    assert!(
        names.iter().any(|n| n.starts_with("jemalloc_bg_thd")),
        "no jemalloc background thread, so the options were not read: {names:?}"
    );

    let full = rss_anon_kib();
    drop(freed);
    // `dirty_decay_ms:1000`: the pages go back within about a second of the free; the bound is
    // only there so that a broken allocator fails the test instead of hanging it.
    let started = Instant::now();
    let mut after = rss_anon_kib();
    while full.saturating_sub(after) < 24 * 1024 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
        after = rss_anon_kib();
    }
    println!(
        "RssAnon {full} KiB with the blocks, {after} KiB {:?} after freeing them",
        started.elapsed()
    );
    assert!(
        full.saturating_sub(after) >= 24 * 1024,
        "at least 24 of the 32 MiB freed go back to the system: {full} -> {after} KiB"
    );
    assert_eq!(kept.len(), 2048, "the kept blocks are still there");
    assert!(
        kept.iter()
            .enumerate()
            .all(|(i, b)| b[63] == (i % 13) as u8)
    );
}
