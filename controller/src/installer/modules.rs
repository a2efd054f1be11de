//! The shared dependency trees (docs/controller.md#shared-dependency-trees): one `node_modules`
//! per (`package.json`, `.npmrc`, `--npm-allow-scripts`) in `.cache/modules/<key>/`, linked by
//! each project. Built in `.build-<key>-<nonce>`, made read-only, sealed by a manifest written
//! last, then renamed to `<key>`; checked against the manifest before each reuse (a file whose
//! inode and ctime are the recorded ones is unchanged: no user can set a ctime back; any other
//! is hashed again). One install per key at a time, under `<key>.lock` (`flock`).

use std::collections::BTreeMap;
use std::fs;
use std::future::Future;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decide::model::{Failure, TaskError};

/// The manifest's file name at the top of a tree.
pub const MANIFEST: &str = "manifest.json";
const FORMAT: u32 = 1;
/// The folder inside a tree that instances link to.
pub const MODULES: &str = "node_modules";
/// npm's lockfile, kept at the top of a tree and copied into each linked project.
pub const LOCKFILE: &str = "package-lock.json";
const LOCK_POLL: Duration = Duration::from_millis(100);

/// Errors of the state volume's files (the shared trees, the Pulumi backend, the project).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{what} {path} failed: {source}; check the state volume")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A blocking task of the store was lost (the runtime is shutting down).
    #[error("checking the dependency tree was interrupted: {0}; the install retries")]
    Interrupted(String),
}

impl From<StateError> for TaskError {
    fn from(e: StateError) -> Self {
        TaskError::new(Failure::StateUnavailable, e.to_string())
    }
}

/// Runs `f` on the blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StateError> + Send + 'static,
) -> Result<T, StateError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StateError::Interrupted(e.to_string()))?
}

/// The [`StateError::Io`] of `what` (doing) on `path`, for `map_err`.
pub fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StateError + 'a {
    move |source| StateError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What [`Trees::ensure`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A checked tree was there and is used as it is: no npm ran.
    Reused,
    Built,
    /// The tree failed its check (the reason) and was built again.
    Rebuilt(String),
}

/// One entry of a tree as the manifest records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
enum Entry {
    Dir {
        path: String,
    },
    /// A symbolic link and its target.
    Link {
        path: String,
        target: String,
    },
    File {
        path: String,
        size: u64,
        sha256: String,
        /// The inode and change time (seconds, nanoseconds) when it was hashed.
        ino: u64,
        ctime: (i64, i64),
    },
}

impl Entry {
    fn path(&self) -> &str {
        match self {
            Entry::Dir { path } | Entry::Link { path, .. } | Entry::File { path, .. } => path,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    format: u32,
    key: String,
    entries: Vec<Entry>,
}

/// The hex SHA-256 of `parts`, each prefixed by its length.
pub fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    crate::chart::hex(ctx.finish().as_ref())
}

/// The key of a tree: a digest of the inputs that decide what npm installs.
pub fn key(package_json: &str, npmrc: &str, allow_scripts: bool) -> String {
    let scripts = if allow_scripts {
        "scripts"
    } else {
        "noscripts"
    };
    let parts = [package_json, npmrc, scripts].map(str::as_bytes);
    sha256_hex(&parts)[..32].to_string()
}

/// The entries of folder `dir` that can be read (none if it cannot be listed).
pub fn entries(dir: &Path) -> impl Iterator<Item = fs::DirEntry> + use<> {
    fs::read_dir(dir).into_iter().flatten().flatten()
}

fn is_key(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

fn sha256_file(path: &Path) -> Result<String, StateError> {
    crate::chart::sha256_file(path).map_err(io("reading", path))
}

/// Every entry under `top` but the manifest, by relative `/`-separated path, with its metadata.
fn walk(top: &Path) -> Result<Vec<(String, PathBuf, fs::Metadata)>, StateError> {
    let mut out = Vec::new();
    // (the relative path of a folder with its trailing `/`, the folder)
    let mut dirs = vec![(String::new(), top.to_path_buf())];
    while let Some((prefix, dir)) = dirs.pop() {
        for entry in fs::read_dir(&dir).map_err(io("listing", &dir))? {
            let entry = entry.map_err(io("listing", &dir))?;
            let child = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if child == MANIFEST {
                continue;
            }
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).map_err(io("reading", &path))?;
            if meta.is_dir() {
                dirs.push((format!("{child}/"), path.clone()));
            }
            out.push((child, path, meta));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn entry_of(rel: String, path: &Path, meta: &fs::Metadata) -> Result<Option<Entry>, StateError> {
    let kind = meta.file_type();
    Ok(Some(if kind.is_dir() {
        Entry::Dir { path: rel }
    } else if kind.is_symlink() {
        let target = fs::read_link(path).map_err(io("reading the link", path))?;
        Entry::Link {
            path: rel,
            target: target.to_string_lossy().into_owned(),
        }
    } else if kind.is_file() {
        Entry::File {
            path: rel,
            size: meta.len(),
            sha256: sha256_file(path)?,
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    } else {
        // Sockets, fifos, devices: npm makes none; left out, so the tree fails its check.
        return Ok(None);
    }))
}

/// Makes everything under `top` read-only: the tree is shared, no instance may change it.
fn make_read_only(top: &Path) -> Result<(), StateError> {
    // Deepest first, so a folder is still writable while its entries are changed.
    for (_, path, meta) in walk(top)?.into_iter().rev().filter(|e| !e.2.is_symlink()) {
        let mode = meta.permissions().mode();
        let ro = mode & !0o222;
        if ro != mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(ro))
                .map_err(io("making read-only", &path))?;
        }
    }
    Ok(())
}

/// Removes the folder `top`, first making every folder under it writable by its owner again.
fn remove_tree(top: &Path) -> std::io::Result<()> {
    let mut dirs = vec![top.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        if let Ok(meta) = fs::symlink_metadata(&dir)
            && meta.is_dir()
        {
            let mode = meta.permissions().mode();
            if mode & 0o700 != 0o700 {
                let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(mode | 0o700));
            }
            dirs.extend(entries(&dir).map(|e| e.path()));
        }
    }
    fs::remove_dir_all(top)
}

/// Checks the tree at `top` against its manifest; the reason it fails otherwise.
fn verify(top: &Path, key: &str) -> Result<(), String> {
    let path = top.join(MANIFEST);
    let text = fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "it has no manifest (its install never finished)".into(),
        _ => format!("its manifest cannot be read: {e}"),
    })?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| format!("its manifest cannot be parsed ({e}): it was cut short or changed"))?;
    if manifest.format != FORMAT || manifest.key != key {
        return Err(format!(
            "its manifest is of format {} for key {}, not format {FORMAT} for {key}",
            manifest.format, manifest.key
        ));
    }
    let found = walk(top).map_err(|e| e.to_string())?;
    let mut expected: BTreeMap<_, _> = manifest.entries.iter().map(|e| (e.path(), e)).collect();
    for (rel, path, meta) in &found {
        let Some(want) = expected.remove(rel.as_str()) else {
            return Err(format!("{rel} is not in its manifest"));
        };
        let kind = meta.file_type();
        match want {
            Entry::Dir { .. } if kind.is_dir() => {}
            Entry::Link { target, .. } if kind.is_symlink() => {
                let now = fs::read_link(path).map_err(|e| format!("{rel}: {e}"))?;
                if now.to_string_lossy() != target.as_str() {
                    return Err(format!("the link {rel} points elsewhere"));
                }
            }
            Entry::File {
                size,
                sha256,
                ino,
                ctime,
                ..
            } if kind.is_file() => {
                if meta.len() != *size {
                    return Err(format!("{rel} changed size"));
                }
                let same_inode = meta.ino() == *ino && (meta.ctime(), meta.ctime_nsec()) == *ctime;
                if !same_inode && sha256_file(path).map_err(|e| e.to_string())? != *sha256 {
                    return Err(format!("{rel} changed after the tree was written"));
                }
            }
            _ => return Err(format!("{rel} changed kind")),
        }
    }
    if let Some(missing) = expected.keys().next() {
        return Err(format!("{missing} is missing"));
    }
    Ok(())
}

/// Describes the complete tree at `top` in its manifest, written last and durably.
fn seal(top: &Path, key: &str) -> Result<(), StateError> {
    make_read_only(&top.join(MODULES))?;
    let entries = walk(top)?
        .into_iter()
        .filter_map(|(rel, path, meta)| entry_of(rel, &path, &meta).transpose())
        .collect::<Result<_, _>>()?;
    let manifest = Manifest {
        format: FORMAT,
        key: key.to_string(),
        entries,
    };
    let text = serde_json::to_vec(&manifest)
        .map_err(|e| io("writing the manifest of", top)(std::io::Error::other(e)))?;
    super::record::write_durably(top, MANIFEST, &text).map_err(io("writing", &top.join(MANIFEST)))
}

static NONCE: AtomicU64 = AtomicU64::new(0);

fn nonce() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        NONCE.fetch_add(1, Ordering::Relaxed)
    )
}

/// The held lock of one key; released when dropped.
#[derive(Debug)]
pub struct KeyLock {
    _file: fs::File,
}

/// Where the trees live (`<--state-dir>/.cache/modules`).
#[derive(Clone, Debug)]
pub struct Trees {
    pub root: PathBuf,
}

impl Trees {
    /// The tree of `key`.
    pub fn tree(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn lock_path(&self, key: &str) -> PathBuf {
        self.root.join(format!("{key}.lock"))
    }

    /// Takes the lock of `key` if it is free.
    pub fn try_lock(&self, key: &str) -> Result<Option<KeyLock>, StateError> {
        let path = self.lock_path(key);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("opening the lock", &path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Ok(None),
            Err(fs::TryLockError::Error(e)) => return Err(io("locking", &path)(e)),
        }
        // A lock file [`Trees::collect`] removed meanwhile locks nothing: only the path counts.
        let held = file.metadata().map_err(io("locking", &path))?;
        match fs::metadata(&path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                Ok(Some(KeyLock { _file: file }))
            }
            _ => Ok(None),
        }
    }

    /// Waits for the lock of `key`; dropping the future leaves the lock to the others.
    pub async fn lock(&self, key: &str) -> Result<KeyLock, StateError> {
        fs::create_dir_all(&self.root).map_err(io("creating", &self.root))?;
        loop {
            if let Some(lock) = self.try_lock(key)? {
                return Ok(lock);
            }
            tokio::time::sleep(LOCK_POLL).await;
        }
    }

    /// Moves `path` out of the way at once and removes it.
    fn discard(&self, path: &Path) -> Result<(), StateError> {
        let trash = self.root.join(format!(".trash-{}", nonce()));
        match fs::rename(path, &trash) {
            Ok(()) => remove_tree(&trash).map_err(io("removing", &trash)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("moving aside", path)(e)),
        }
    }

    /// Makes sure a checked tree of `key` exists, else builds it with `build` (which fills the
    /// folder it is given). The caller holds `_lock`, the lock of `key`.
    pub async fn ensure<E, F, Fut>(
        &self,
        key: &str,
        _lock: &KeyLock,
        build: F,
    ) -> Result<Outcome, E>
    where
        E: From<StateError>,
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let top = self.tree(key);
        let (t, k) = (top.clone(), key.to_string());
        let checked = blocking(move || Ok(t.symlink_metadata().is_ok().then(|| verify(&t, &k))));
        let checked = checked.await?;
        let outcome = match checked {
            Some(Ok(())) => return Ok(Outcome::Reused),
            Some(Err(reason)) => {
                tracing::warn!(tree = %top.display(), %reason, "the shared dependency tree failed its check; it is rebuilt");
                Outcome::Rebuilt(reason)
            }
            None => Outcome::Built,
        };
        let dir = self.root.join(format!(".build-{key}-{}", nonce()));
        // On the blocking pool: removing a tree can take seconds on a slow volume.
        let discard = matches!(outcome, Outcome::Rebuilt(_)).then(|| top.clone());
        let (trees, build_dir, leftovers) = (self.clone(), dir.clone(), format!(".build-{key}-"));
        blocking(move || {
            if let Some(top) = discard {
                trees.discard(&top)?;
            }
            // Leftovers of stopped builds of this key (no one else builds it: the lock).
            trees.remove_matching(&leftovers);
            fs::create_dir_all(&build_dir).map_err(io("creating", &build_dir))
        })
        .await?;
        // A build stopped here (a timeout) leaves `dir`, never used and removed later.
        build(dir.clone()).await?;
        let (sealed, key) = (dir.clone(), key.to_string());
        blocking(move || seal(&sealed, &key)).await?;
        fs::rename(&dir, &top).map_err(io("moving the built tree to", &top))?;
        Ok(outcome)
    }

    fn remove_matching(&self, prefix: &str) {
        for entry in entries(&self.root) {
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                let path = entry.path();
                if let Err(e) = remove_tree(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "removing a leftover of the dependency trees failed");
                }
            }
        }
    }

    /// Links `project`'s `node_modules` to the tree of `key` (relative within `state_dir`) and
    /// copies the tree's lockfile into the project.
    pub fn link(&self, project: &Path, key: &str, state_dir: &Path) -> Result<(), StateError> {
        let top = self.tree(key);
        let target = match (project.strip_prefix(state_dir), top.strip_prefix(state_dir)) {
            (Ok(from), Ok(to)) => from
                .components()
                .map(|_| "..")
                .collect::<PathBuf>()
                .join(to),
            _ => top.clone(),
        }
        .join(MODULES);
        let link = project.join(MODULES);
        if !fs::read_link(&link).is_ok_and(|now| now == target) {
            // A project of an earlier layout has its own node_modules.
            if fs::symlink_metadata(&link).is_ok_and(|meta| meta.is_dir()) {
                remove_tree(&link).map_err(io("removing", &link))?;
            }
            let part = project.join(format!("{MODULES}.link-{}", nonce()));
            std::os::unix::fs::symlink(&target, &part).map_err(io("linking", &part))?;
            fs::rename(&part, &link).map_err(io("linking", &link))?;
        }
        self.copy_lockfile(&top, project)
    }

    fn copy_lockfile(&self, top: &Path, project: &Path) -> Result<(), StateError> {
        let from = top.join(LOCKFILE);
        let to = project.join(LOCKFILE);
        let text = fs::read(&from).map_err(io("reading", &from))?;
        if fs::read(&to).ok().as_deref() == Some(text.as_slice()) {
            return Ok(());
        }
        // Replaced, not written through: an earlier copy may be read-only.
        let _ = fs::remove_file(&to);
        fs::write(&to, text).map_err(io("writing", &to))
    }

    /// The keys instances under `state_dir` link to: their installed project's and the upgrade
    /// being previewed (`<namespace>/<name>/{platform,upgrade-preview}/node_modules`).
    pub fn linked_keys(&self, state_dir: &Path) -> std::collections::BTreeSet<String> {
        entries(state_dir)
            .filter(|ns| !ns.file_name().to_string_lossy().starts_with('.'))
            .flat_map(|ns| entries(&ns.path()))
            .flat_map(|instance| {
                let projects = ["platform", super::UPGRADE_PREVIEW];
                projects.map(|p| fs::read_link(instance.path().join(p).join(MODULES)).ok())
            })
            .flatten()
            .filter_map(|target| Some(target.parent()?.file_name()?.to_string_lossy().into_owned()))
            .filter(|key| is_key(key))
            .collect()
    }

    /// Removes the trees no instance under `state_dir` links to and no install holds the lock
    /// of, and the leftovers of stopped builds and removals; returns the keys removed.
    pub fn collect(&self, state_dir: &Path) -> Vec<String> {
        let names: Vec<String> = entries(&self.root)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        self.remove_matching(".trash-");
        let linked = self.linked_keys(state_dir);
        let mut removed = Vec::new();
        for key in names.iter().filter(|n| is_key(n) && !linked.contains(*n)) {
            let Ok(Some(_lock)) = self.try_lock(key) else {
                continue;
            };
            // Linked while this looked? Look again under the lock: a link is made under it.
            if self.linked_keys(state_dir).contains(key) {
                continue;
            }
            match self.discard(&self.tree(key)) {
                Ok(()) => {
                    self.remove_matching(&format!(".build-{key}-"));
                    let _ = fs::remove_file(self.lock_path(key));
                    removed.push(key.clone());
                }
                Err(e) => tracing::warn!(error = %e, "removing an unused dependency tree failed"),
            }
        }
        // Builds stopped half-way whose key has no tree and no install building it.
        let building = names
            .iter()
            .filter_map(|n| n.strip_prefix(".build-")?.split_once('-'));
        for (key, _) in building {
            if is_key(key)
                && !removed.iter().any(|k| k == key)
                && let Ok(Some(_lock)) = self.try_lock(key)
            {
                self.remove_matching(&format!(".build-{key}-"));
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("modules-{name}-{}", std::process::id()));
        if dir.exists() {
            let _ = remove_tree(&dir);
        }
        fs::create_dir_all(&dir).expect("dir");
        dir
    }

    /// A scratch folder and a tree store in it.
    fn store(name: &str) -> (PathBuf, Trees) {
        let root = scratch(name);
        let trees = Trees {
            root: root.join("modules"),
        };
        (root, trees)
    }

    fn cleanup(dir: &Path) {
        let _ = remove_tree(dir);
    }

    /// Fills `dir` the way an npm install does (a package, a `.bin` link, the lockfile),
    /// counting the builds.
    async fn fill(dir: PathBuf, builds: Arc<AtomicUsize>) -> Result<(), String> {
        builds.fetch_add(1, Ordering::SeqCst);
        let package = dir.join("node_modules/@scope/pkg");
        fs::create_dir_all(&package).map_err(|e| e.to_string())?;
        fs::create_dir_all(dir.join("node_modules/.bin")).map_err(|e| e.to_string())?;
        fs::write(package.join("package.json"), r#"{"name":"@scope/pkg"}"#)
            .map_err(|e| e.to_string())?;
        // Yield between files, as a real install does: a concurrent check would see half.
        tokio::time::sleep(Duration::from_millis(50)).await;
        fs::write(package.join("index.js"), "module.exports = 42;\n").map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink("../@scope/pkg/index.js", dir.join("node_modules/.bin/pkg"))
            .map_err(|e| e.to_string())?;
        fs::write(dir.join(LOCKFILE), r#"{"lockfileVersion":3}"#).map_err(|e| e.to_string())
    }

    async fn ensure(trees: &Trees, builds: &Arc<AtomicUsize>) -> Outcome {
        let lock = trees.lock(KEY).await.expect("lock");
        let builds = builds.clone();
        trees
            .ensure(KEY, &lock, |dir| async {
                fill(dir, builds).await.map_err(TaskError::from)
            })
            .await
            .expect("ensure")
    }

    fn writable(path: &Path) {
        let mode = fs::metadata(path).expect("meta").permissions().mode();
        fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o200)).expect("chmod");
    }

    #[test]
    fn the_key_follows_every_input() {
        let a = key("{\"x\":1}", "fund=false\n", false);
        assert!(is_key(&a), "{a}");
        assert_eq!(a, key("{\"x\":1}", "fund=false\n", false));
        assert_ne!(a, key("{\"x\":2}", "fund=false\n", false));
        assert_ne!(a, key("{\"x\":1}", "fund=true\n", false));
        assert_ne!(a, key("{\"x\":1}", "fund=false\n", true));
    }

    #[tokio::test]
    async fn a_tree_is_built_once_and_then_reused_read_only() {
        let (root, trees) = store("reuse");
        let builds = Arc::new(AtomicUsize::new(0));
        assert_eq!(ensure(&trees, &builds).await, Outcome::Built);
        assert_eq!(ensure(&trees, &builds).await, Outcome::Reused);
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        let top = trees.tree(KEY);
        verify(&top, KEY).expect("a sealed tree passes its check");
        let file = top.join("node_modules/@scope/pkg/index.js");
        assert_eq!(
            fs::metadata(&file).expect("meta").permissions().mode() & 0o222,
            0,
            "files are read-only"
        );
        let folder = top.join("node_modules/@scope/pkg");
        assert_eq!(
            fs::metadata(&folder).expect("meta").permissions().mode() & 0o222,
            0,
            "folders are read-only"
        );
        let left: Vec<_> = fs::read_dir(&trees.root)
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "no build folder is left: {left:?}");
        cleanup(&root);
    }

    #[tokio::test]
    async fn a_file_changed_after_the_tree_was_written_gets_it_rebuilt() {
        let (root, trees) = store("changed");
        let builds = Arc::new(AtomicUsize::new(0));
        ensure(&trees, &builds).await;
        let file = trees.tree(KEY).join("node_modules/@scope/pkg/index.js");
        writable(&file);
        // Same size, different content: only the hash tells.
        fs::write(&file, "module.exports = 43;\n").expect("write");
        let outcome = ensure(&trees, &builds).await;
        let Outcome::Rebuilt(reason) = outcome else {
            panic!("not rebuilt: {outcome:?}");
        };
        assert!(
            reason.contains("node_modules/@scope/pkg/index.js changed"),
            "{reason}"
        );
        assert_eq!(builds.load(Ordering::SeqCst), 2);
        assert_eq!(
            fs::read_to_string(&file).expect("read"),
            "module.exports = 42;\n"
        );
        verify(&trees.tree(KEY), KEY).expect("the rebuilt tree passes");
        cleanup(&root);
    }

    #[tokio::test]
    async fn a_missing_an_extra_or_a_relinked_entry_fails_the_check() {
        let (root, trees) = store("entries");
        let builds = Arc::new(AtomicUsize::new(0));
        ensure(&trees, &builds).await;
        let top = trees.tree(KEY);
        let folder = top.join("node_modules/@scope/pkg");
        writable(&folder);
        fs::write(folder.join("extra.js"), "").expect("write");
        let e = verify(&top, KEY).expect_err("an extra file");
        assert!(e.contains("extra.js is not in its manifest"), "{e}");
        fs::remove_file(folder.join("extra.js")).expect("remove");
        verify(&top, KEY).expect("back as it was");
        fs::remove_file(folder.join("package.json")).expect("remove");
        let e = verify(&top, KEY).expect_err("a missing file");
        assert!(e.contains("package.json is missing"), "{e}");
        assert!(matches!(ensure(&trees, &builds).await, Outcome::Rebuilt(_)));
        let bin = top.join("node_modules/.bin");
        writable(&bin);
        fs::remove_file(bin.join("pkg")).expect("remove");
        std::os::unix::fs::symlink("/etc/passwd", bin.join("pkg")).expect("link");
        let e = verify(&top, KEY).expect_err("a relinked entry");
        assert!(e.contains("points elsewhere"), "{e}");
        let e = verify(&top, "ffffffffffffffffffffffffffffffff").expect_err("another key");
        assert!(e.contains("not format"), "{e}");
        cleanup(&root);
    }

    #[tokio::test]
    async fn a_copied_file_with_the_same_content_passes() {
        let (root, trees) = store("copied");
        ensure(&trees, &Arc::new(AtomicUsize::new(0))).await;
        let top = trees.tree(KEY);
        let file = top.join("node_modules/@scope/pkg/index.js");
        let folder = top.join("node_modules/@scope/pkg");
        writable(&folder);
        // A new inode with the recorded content (a restored backup): hashed again, accepted.
        let content = fs::read(&file).expect("read");
        fs::remove_file(&file).expect("remove");
        fs::write(&file, content).expect("write");
        verify(&top, KEY).expect("same content");
        cleanup(&root);
    }

    #[tokio::test]
    async fn a_half_written_tree_is_rebuilt_never_used() {
        let (root, trees) = store("half");
        let builds = Arc::new(AtomicUsize::new(0));
        // 1. An install killed half-way (the task's timeout drops it mid-build, with npm's
        // process group): nothing is at the key's path; the next install builds a complete
        // tree.
        {
            let lock = trees.lock(KEY).await.expect("lock");
            let half = Arc::new(tokio::sync::Notify::new());
            let signal = half.clone();
            let build = trees.ensure(KEY, &lock, |dir| async move {
                let package = dir.join("node_modules/@scope/pkg");
                fs::create_dir_all(&package).map_err(|e| e.to_string())?;
                fs::write(package.join("package.json"), "{").map_err(|e| e.to_string())?;
                signal.notify_one();
                std::future::pending::<Result<(), TaskError>>().await
            });
            tokio::select! {
                _ = build => panic!("the build never ends"),
                () = half.notified() => {}
            }
        }
        assert!(
            !trees.tree(KEY).exists(),
            "a half build is never at the key"
        );
        let leftovers = |trees: &Trees| {
            fs::read_dir(&trees.root)
                .expect("list")
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(".build-"))
                .count()
        };
        assert_eq!(leftovers(&trees), 1, "the stopped build left its folder");
        assert_eq!(ensure(&trees, &builds).await, Outcome::Built);
        assert_eq!(leftovers(&trees), 0, "the leftover was removed");
        verify(&trees.tree(KEY), KEY).expect("complete");

        // 2. A tree at the key without its manifest (copied in, or cut short): rebuilt.
        let top = trees.tree(KEY);
        writable(&top);
        fs::remove_file(top.join(MANIFEST)).expect("remove");
        let outcome = ensure(&trees, &builds).await;
        assert!(
            matches!(&outcome, Outcome::Rebuilt(r) if r.contains("no manifest")),
            "{outcome:?}"
        );
        // 3. A manifest cut short: rebuilt.
        let text = fs::read(top.join(MANIFEST)).expect("manifest");
        fs::write(top.join(MANIFEST), &text[..text.len() / 2]).expect("cut");
        let outcome = ensure(&trees, &builds).await;
        assert!(
            matches!(&outcome, Outcome::Rebuilt(r) if r.contains("cannot be parsed")),
            "{outcome:?}"
        );
        assert_eq!(
            builds.load(Ordering::SeqCst),
            3,
            "the stopped build is not counted"
        );
        verify(&trees.tree(KEY), KEY).expect("complete");
        cleanup(&root);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_installs_at_one_version_at_once_build_the_tree_once() {
        let (root, trees) = store("concurrent");
        let builds = Arc::new(AtomicUsize::new(0));
        let (a, b) = tokio::join!(
            {
                let (trees, builds) = (trees.clone(), builds.clone());
                tokio::spawn(async move { ensure(&trees, &builds).await })
            },
            {
                let (trees, builds) = (trees.clone(), builds.clone());
                tokio::spawn(async move { ensure(&trees, &builds).await })
            }
        );
        let mut outcomes = [a.expect("task"), b.expect("task")];
        outcomes.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(outcomes, [Outcome::Built, Outcome::Reused]);
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        verify(&trees.tree(KEY), KEY).expect("one complete tree");
        cleanup(&root);
    }

    #[tokio::test]
    async fn projects_link_to_the_tree_and_unlinked_trees_are_collected() {
        let state = scratch("link");
        let trees = Trees {
            root: state.join(".cache/modules"),
        };
        ensure(&trees, &Arc::new(AtomicUsize::new(0))).await;
        let project = state.join("team/one/platform");
        // A project of the earlier layout, with its own node_modules.
        fs::create_dir_all(project.join("node_modules/old")).expect("dir");
        trees.link(&project, KEY, &state).expect("link");
        let link = project.join(MODULES);
        assert_eq!(
            fs::read_link(&link).expect("a link"),
            PathBuf::from(format!("../../../.cache/modules/{KEY}/node_modules")),
            "relative: the state volume may be mounted elsewhere"
        );
        assert_eq!(
            fs::read_to_string(link.join("@scope/pkg/index.js")).expect("through the link"),
            "module.exports = 42;\n"
        );
        assert_eq!(
            fs::read_to_string(project.join(LOCKFILE)).expect("lockfile"),
            r#"{"lockfileVersion":3}"#
        );
        trees
            .link(&project, KEY, &state)
            .expect("linking again changes nothing");
        assert_eq!(
            trees.linked_keys(&state).into_iter().collect::<Vec<_>>(),
            [KEY]
        );

        // Another tree no one links to is removed; a locked one waits; the linked one stays, and
        // so does one an upgrade preview runs on (its lock released before its Pulumi runs).
        let other = "ffffffffffffffffffffffffffffffff";
        fs::create_dir_all(trees.tree(other).join("node_modules")).expect("dir");
        let held = trees.lock(other).await.expect("lock");
        assert!(trees.collect(&state).is_empty(), "a tree in use is kept");
        drop(held);
        let preview = state.join("team/two").join(super::super::UPGRADE_PREVIEW);
        fs::create_dir_all(&preview).expect("dir");
        let target = format!("../../../.cache/modules/{other}/node_modules");
        std::os::unix::fs::symlink(target, preview.join(MODULES)).expect("link");
        assert!(trees.collect(&state).is_empty(), "a previewed tree is kept");
        fs::remove_dir_all(state.join("team/two")).expect("remove");
        assert_eq!(trees.collect(&state), [other]);
        assert!(!trees.tree(other).exists());
        assert!(trees.tree(KEY).exists(), "a linked tree is kept");
        // Deleting the instance (its folder, the link with it) frees its tree.
        fs::remove_dir_all(state.join("team/one")).expect("remove");
        assert!(trees.tree(KEY).exists(), "the link's removal left the tree");
        assert_eq!(trees.collect(&state), [KEY]);
        cleanup(&state);
    }
}
