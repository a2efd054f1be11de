//! The controller's reaper in a process of its own (a child subreaper changes the whole process):
//! an orphan re-parented to it is reaped, while a child it started and waits for itself keeps
//! its exit status (a reaper that reaped every zombie would make that wait fail with ECHILD).

use std::time::Duration;

use controller::reaper;

fn zombie(pid: i32) -> bool {
    reaper::processes()
        .iter()
        .any(|p| p.pid == pid && p.state == 'Z')
}

#[tokio::test]
async fn orphans_are_reaped_and_our_own_children_keep_their_exit_status() {
    reaper::become_subreaper().expect("subreaper");
    let me = std::process::id() as i32;
    let marker = std::env::temp_dir().join(format!("reaper-orphan-{me}"));
    let _ = std::fs::remove_file(&marker);

    // Our child exits 7 at once, leaving a grandchild that outlives it briefly: an orphan.
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c").arg(format!(
        "sleep 0.3 & echo $! > {}; exit 7",
        marker.display()
    ));
    let (mut child, registered) = reaper::spawn(&mut cmd).expect("spawn");
    let own = child.id().expect("pid") as i32;

    let mut orphan = None;
    for _ in 0..100 {
        orphan = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|pid| zombie(*pid));
        if orphan.is_some() && zombie(own) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let orphan = orphan.expect("the orphan died and waits to be reaped");
    assert!(zombie(own), "our own child has exited, not yet waited for");
    let parent = reaper::processes()
        .into_iter()
        .find(|p| p.pid == orphan)
        .map(|p| p.ppid);
    assert_eq!(parent, Some(me), "the orphan was re-parented to us");
    // What the sweep reads: this process's own children, the orphan and our child among them,
    // both as zombies, and nothing of the rest of the machine.
    let children = reaper::children().expect("this kernel lists a task's children");
    assert!(children.iter().all(|p| p.ppid == me), "{children:?}");
    for pid in [orphan, own] {
        assert!(
            children.iter().any(|p| p.pid == pid && p.state == 'Z'),
            "{pid} is listed as our zombie child: {children:?}"
        );
    }

    assert_eq!(reaper::sweep(), vec![orphan], "only the orphan is reaped");
    assert!(!zombie(orphan));
    let status = child.wait().await.expect("our wait still has its child");
    assert_eq!(status.code(), Some(7));
    drop(registered);
    let left: Vec<_> = reaper::processes()
        .into_iter()
        .filter(|p| p.ppid == me && p.state == 'Z')
        .collect();
    assert!(left.is_empty(), "no zombie is left: {left:?}");
    let _ = std::fs::remove_file(&marker);
}
