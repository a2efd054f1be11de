//! The controller's allocator settings in a process of their own (they change the whole
//! process): a large block freed does not raise the mmap threshold, and `trim` gives back the
//! free pages between kept objects that glibc keeps on its own.

use std::time::Instant;

use controller::allocator;

/// This process's anonymous resident memory, in KiB (`RssAnon` of `/proc/self/status`).
fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon")
}

/// Blocks of their own pages (`mallinfo2().hblks`).
#[allow(unsafe_code)]
fn mapped_blocks() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    unsafe { libc::mallinfo2() }.hblks
}

/// One test, so that no other test of this binary allocates while it measures.
#[test]
fn large_blocks_keep_their_own_pages_and_trim_gives_free_pages_back() {
    assert!(allocator::tune(), "glibc takes both settings");

    // A block over the threshold gets pages of its own; freeing it would make glibc raise the
    // threshold to its size, so that the next one came from the heap. Fixed, it does not.
    let blocks = mapped_blocks();
    let first = vec![1u8; 1 << 20];
    assert_eq!(mapped_blocks(), blocks + 1, "a 1 MiB block is mapped");
    drop(first);
    let second = vec![2u8; 1 << 20];
    assert_eq!(
        mapped_blocks(),
        blocks + 1,
        "the next 1 MiB block is mapped too: the free did not raise the threshold"
    );
    drop(second);

    // 32 MiB of 16 KiB blocks, each followed by a small block that is kept: freed, they are free
    // chunks between live objects, which glibc keeps resident.
    let mut kept = Vec::with_capacity(2048);
    let mut freed = Vec::with_capacity(2048);
    for i in 0..2048u32 {
        freed.push(vec![(i % 251) as u8; 16 * 1024]);
        kept.push(vec![(i % 13) as u8; 64]);
    }
    let full = rss_anon_kib();
    drop(freed);
    let after_free = rss_anon_kib();
    let start = Instant::now();
    let released = allocator::trim();
    let took = start.elapsed();
    let after_trim = rss_anon_kib();
    println!(
        "RssAnon {full} KiB with the blocks, {after_free} KiB after freeing them, {after_trim} KiB \
         after trim ({took:?})"
    );
    assert!(
        full.saturating_sub(after_free) < 8 * 1024,
        "glibc alone keeps most of the freed 32 MiB resident: {full} -> {after_free} KiB"
    );
    assert!(released, "trim gave pages back");
    assert!(
        after_free.saturating_sub(after_trim) >= 16 * 1024,
        "trim gives back at least half of the freed 32 MiB: {after_free} -> {after_trim} KiB"
    );
    assert_eq!(kept.len(), 2048, "the kept blocks are still there");
    assert!(
        kept.iter()
            .enumerate()
            .all(|(i, b)| b[63] == (i % 13) as u8)
    );
}
