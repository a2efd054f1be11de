//! The storage cleanup that a `deletionPolicy: Delete` Job runs from the operator's own image:
//! `controller cleanup --root <storage root> --dir <host namespace>` removes exactly one
//! instance's directory under the root. It walks the tree through directory descriptors
//! (`openat` with `O_NOFOLLOW`, `unlinkat`), so a symbolic link is removed as a link and never
//! followed, a path outside the root cannot be named, and a directory on another filesystem (a
//! mount inside the instance's directory) is left alone and reported.

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, fstat, openat, statat, unlinkat};
use rustix::io::Errno;

/// How deep the walk descends; instance data (vCluster's database, logs) is far shallower.
pub const MAX_DEPTH: usize = 256;

/// What can go wrong while removing an instance's directory.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// `--dir` (`.0`) is not one directory name (a DNS label, as host namespaces are).
    #[error(
        "refusing to remove {0:?}: --dir must be one storage directory name (lowercase letters, digits and '-', at most 127), not a path"
    )]
    InvalidName(String),
    /// `--root` (`.0`) is not an absolute path.
    #[error("refusing --root {0}: it must be an absolute path (the mounted storage root)")]
    RelativeRoot(PathBuf),
    /// The storage root (`.0`) could not be opened.
    #[error("opening the storage root {0} failed: {1}; check the Job's hostPath volume and mount")]
    OpenRoot(PathBuf, #[source] std::io::Error),
    /// The instance's directory (`.0`) is on another filesystem than the storage root (`.1`).
    #[error(
        "{0} is on another filesystem than {1} (a mount point); nothing was removed: unmount it and delete the Job to retry"
    )]
    MountPoint(PathBuf, PathBuf),
    /// A file or directory inside (`.0`) could not be read or removed.
    #[error(
        "removing {0} failed: {1}; fix its permissions or attributes and delete the Job to retry"
    )]
    Remove(PathBuf, #[source] std::io::Error),
    /// Directories on other filesystems inside the instance's directory were left alone.
    #[error(
        "left {} mount point(s) of other filesystems inside the instance's directory, the first {}; unmount them and delete the Job to retry",
        .0.len(),
        .0.first().map(|p| p.display().to_string()).unwrap_or_default()
    )]
    CrossesFilesystem(Vec<PathBuf>),
    /// The tree is deeper than [`MAX_DEPTH`] at `.0`, where the walk stopped.
    #[error("{0} is nested deeper than {MAX_DEPTH} directories; remove it by hand")]
    TooDeep(PathBuf),
}

/// What a cleanup did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Files, symbolic links and other non-directories unlinked (links themselves, never their
    /// targets).
    pub entries: u64,
    /// Directories removed, the instance's own included.
    pub directories: u64,
    /// The instance's directory did not exist (nothing to do).
    pub absent: bool,
}

fn io(path: &Path) -> impl Fn(Errno) -> CleanupError + '_ {
    move |e| CleanupError::Remove(path.to_path_buf(), e.into())
}

/// Removes `<root>/<name>` and everything in it. An absent directory is success (`absent`); a
/// name that is a symbolic link or a file is removed itself.
pub fn remove_instance_dir(root: &Path, name: &str) -> Result<Removed, CleanupError> {
    if !root.is_absolute() {
        return Err(CleanupError::RelativeRoot(root.to_path_buf()));
    }
    if !common::names::is_storage_dir(name) {
        return Err(CleanupError::InvalidName(name.to_string()));
    }
    let path = root.join(name);
    let c_name = CString::new(name).map_err(|_| CleanupError::InvalidName(name.to_string()))?;
    let (root_stat, root_fd) = openat(
        CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .and_then(|fd| Ok((fstat(&fd)?, fd)))
    .map_err(|e| CleanupError::OpenRoot(root.to_path_buf(), e.into()))?;
    let (mut removed, mut crossed) = (Removed::default(), Vec::new());
    let found = remove(
        &root_fd,
        &c_name,
        root_stat.st_dev,
        &path,
        0,
        &mut removed,
        &mut crossed,
    )?;
    removed.absent = !found;
    match crossed.as_slice() {
        [] => Ok(removed),
        [only] if *only == path => Err(CleanupError::MountPoint(path, root.to_path_buf())),
        _ => Err(CleanupError::CrossesFilesystem(crossed)),
    }
}

/// Removes the entry `name` of `parent` (at `path`): unlinks a non-directory, empties and removes
/// a directory on device `dev`, and records a directory on another device in `crossed` (it and
/// the directories holding it stay). False when there was no such entry.
fn remove(
    parent: &OwnedFd,
    name: &CStr,
    dev: u64,
    path: &Path,
    depth: usize,
    removed: &mut Removed,
    crossed: &mut Vec<PathBuf>,
) -> Result<bool, CleanupError> {
    let stat = match statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(io(path)(e)),
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        unlinkat(parent, name, AtFlags::empty()).map_err(io(path))?;
        removed.entries += 1;
        return Ok(true);
    }
    if stat.st_dev != dev {
        crossed.push(path.to_path_buf());
        return Ok(true);
    }
    if depth >= MAX_DEPTH {
        return Err(CleanupError::TooDeep(path.to_path_buf()));
    }
    // Never following a symbolic link swapped in since the look.
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = openat(parent, name, flags, Mode::empty()).map_err(io(path))?;
    // Nothing was swapped in between the look and the open.
    let opened = fstat(&dir).map_err(io(path))?;
    if (opened.st_dev, opened.st_ino) != (stat.st_dev, stat.st_ino) {
        let replaced = std::io::Error::other("it was replaced while being removed");
        return Err(CleanupError::Remove(path.to_path_buf(), replaced));
    }
    // The names first, then the removals: the listing is not changed while it is read.
    let mut names = Vec::new();
    for entry in Dir::read_from(&dir).map_err(io(path))? {
        let entry = entry.map_err(io(path))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    let before = crossed.len();
    for child in names {
        let at = path.join(child.to_string_lossy().as_ref());
        remove(&dir, &child, dev, &at, depth + 1, removed, crossed)?;
    }
    drop(dir);
    if crossed.len() == before {
        unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(io(path))?;
        removed.directories += 1;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cleanup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        dir
    }

    #[test]
    fn removes_the_directory_and_nothing_its_links_point_to() {
        let base = scratch("links");
        let root = base.join("storage");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("pi-a-one-1/data/deep/er")).expect("tree");
        std::fs::create_dir_all(root.join("pi-a-two-2")).expect("neighbour");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(root.join("pi-a-one-1/data/deep/er/db"), "x").expect("file");
        std::fs::write(root.join("pi-a-two-2/db"), "neighbour").expect("file");
        std::fs::write(outside.join("precious"), "keep").expect("file");
        symlink(&outside, root.join("pi-a-one-1/data/to-outside")).expect("link");
        symlink(
            root.join("pi-a-two-2"),
            root.join("pi-a-one-1/to-neighbour"),
        )
        .expect("link");
        symlink(outside.join("precious"), root.join("pi-a-one-1/file-link")).expect("link");

        let removed = remove_instance_dir(&root, "pi-a-one-1").expect("removed");
        assert_eq!(
            removed,
            Removed {
                entries: 4,
                directories: 4,
                absent: false
            }
        );
        assert!(!root.join("pi-a-one-1").exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("precious")).expect("kept"),
            "keep"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("pi-a-two-2/db")).expect("kept"),
            "neighbour"
        );
        // Again: nothing left to do.
        assert!(
            remove_instance_dir(&root, "pi-a-one-1")
                .expect("absent")
                .absent
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn an_instance_directory_that_is_a_link_is_removed_as_a_link() {
        let base = scratch("dirlink");
        let root = base.join("storage");
        std::fs::create_dir_all(base.join("elsewhere")).expect("dir");
        std::fs::write(base.join("elsewhere/data"), "keep").expect("file");
        std::fs::create_dir_all(&root).expect("root");
        symlink(base.join("elsewhere"), root.join("pi-x-1")).expect("link");
        let removed = remove_instance_dir(&root, "pi-x-1").expect("removed");
        assert_eq!(removed.entries, 1);
        assert!(std::fs::symlink_metadata(root.join("pi-x-1")).is_err());
        assert!(base.join("elsewhere/data").exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn names_that_are_paths_are_refused() {
        let base = scratch("names");
        std::fs::create_dir_all(base.join("victim")).expect("dir");
        for name in [
            "",
            ".",
            "..",
            "../victim",
            "a/b",
            "/etc",
            "UPPER",
            "-x",
            "x-",
            &"a".repeat(128),
        ] {
            assert!(
                matches!(
                    remove_instance_dir(&base.join("root"), name),
                    Err(CleanupError::InvalidName { .. })
                ),
                "{name:?} is refused"
            );
        }
        assert!(matches!(
            remove_instance_dir(Path::new("relative"), "pi-x"),
            Err(CleanupError::RelativeRoot { .. })
        ));
        assert!(base.join("victim").exists());
        let error = remove_instance_dir(&base.join("missing-root"), "pi-x")
            .expect_err("no root")
            .to_string();
        assert!(error.contains("hostPath"), "{error}");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn another_filesystem_inside_is_left_and_reported() {
        // /proc and /dev are other filesystems than the temporary folder on any Linux host; a
        // root that holds them stands for a storage root with a mount inside an instance.
        let root = Path::new("/");
        let dev =
            |p: &str| std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(p).expect("stat"));
        assert_ne!(
            dev("/"),
            dev("/proc"),
            "this host mounts /proc as its own filesystem"
        );
        let error = remove_instance_dir(root, "proc").expect_err("a mount point");
        assert!(matches!(error, CleanupError::MountPoint { .. }), "{error}");
        assert!(Path::new("/proc/self").exists());
    }
}
