//! Container images without a registry, for the real node ([`crate::real_node`]): each is a
//! folder tree (owners and modes as they are) made into a one-layer OCI image by Debian's
//! `buildah` (in a private, throw-away storage), written as an OCI archive that
//! `ctr images import` takes, and cached by a hash of its tree and configuration.
//!
//! - [`PAUSE_IMAGE`]: the pods' sandbox, our own `e2e/images/pause.c` statically linked;
//! - [`BUSYBOX_IMAGE`]: Debian's `busybox-static` with a link for each of its applets.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HarnessError;

/// The pause image's name (containerd's `sandbox_image`).
pub const PAUSE_IMAGE: &str = "localhost/platform-operator-e2e/pause:1";
/// The busybox image's name.
pub const BUSYBOX_IMAGE: &str = "localhost/platform-operator-e2e/busybox:1.35";
/// The Debian packages the images are made with.
pub const DEBIAN_PACKAGES: &str = "buildah busybox-static";

/// What an image is made of.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// Its full name with a tag (`host/path:tag`).
    pub name: String,
    /// The folder whose tree is the image's one layer.
    pub rootfs: PathBuf,
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `CMD`.
    pub cmd: Vec<String>,
    /// `USER`, as `uid:gid`.
    pub user: Option<String>,
    /// `WORKDIR`.
    pub workdir: Option<String>,
    /// `ENV`, in order.
    pub env: Vec<(String, String)>,
    /// `LABEL`s.
    pub labels: Vec<(String, String)>,
}

/// An image written as an OCI archive.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// Its name (in the archive's index, so `ctr images import` names it so).
    pub name: String,
    /// The archive.
    pub archive: PathBuf,
    /// Its manifest's digest (`sha256:…`): `<repository>@<digest>` refers to it once imported.
    pub digest: String,
}

impl BuiltImage {
    /// The name without its tag, `@` the digest.
    pub fn by_digest(&self) -> String {
        let repository = match self.name.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => self.name.as_str(),
        };
        format!("{repository}@{}", self.digest)
    }
}

fn images_dir() -> PathBuf {
    crate::tools::cache_dir().join("images")
}

fn buildah() -> Result<PathBuf, HarnessError> {
    ["/usr/bin/buildah", "/usr/local/bin/buildah"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            HarnessError::Node(format!(
                "buildah is missing: install the Debian packages {DEBIAN_PACKAGES} \
                 (e2e/run-tests.sh installs them when missing)"
            ))
        })
}

/// Builds the image `spec` describes, or takes it from the cache.
pub fn build(spec: &ImageSpec) -> Result<BuiltImage, HarnessError> {
    let key = spec_key(spec)?;
    let slug: String = spec
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let dir = images_dir();
    std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
    let archive = dir.join(format!("{slug}-{key}.tar"));
    let digest_file = dir.join(format!("{slug}-{key}.digest"));
    if let (true, Ok(digest)) = (archive.exists(), std::fs::read_to_string(&digest_file)) {
        return Ok(BuiltImage {
            name: spec.name.clone(),
            archive,
            digest: digest.trim().to_string(),
        });
    }
    let work = dir.join(format!(
        "work-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&work).map_err(|e| HarnessError::io(&work, e))?;
    let result = build_in(spec, &work, &archive, &digest_file);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn build_in(
    spec: &ImageSpec,
    work: &Path,
    archive: &Path,
    digest_file: &Path,
) -> Result<BuiltImage, HarnessError> {
    let buildah = buildah()?;
    let run = |args: &[String]| -> Result<String, HarnessError> {
        let mut cmd = Command::new(&buildah);
        cmd.arg("--root")
            .arg(work.join("storage"))
            .arg("--runroot")
            .arg(work.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("PATH", crate::real_node::SYSTEM_PATH);
        crate::cmd::run(cmd, None)?.ok(&format!("buildah {}", args.join(" ")))
    };
    let layer = work.join("layer.tar");
    let mut tar = Command::new("tar");
    tar.args(["--numeric-owner", "--sort=name", "--mtime=@0", "-C"])
        .arg(&spec.rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg(".");
    crate::cmd::run(tar, None)?.ok("tar of the image's tree")?;
    let container = run(&["from".into(), "scratch".into()])?.trim().to_string();
    run(&[
        "add".into(),
        container.clone(),
        layer.display().to_string(),
        "/".into(),
    ])?;
    let json = |v: &[String]| serde_json::to_string(v).unwrap_or_else(|_| "[]".into());
    let mut config = vec![
        "config".to_string(),
        "--os".into(),
        "linux".into(),
        "--arch".into(),
        "amd64".into(),
        "--entrypoint".into(),
        json(&spec.entrypoint),
    ];
    if !spec.cmd.is_empty() {
        config.extend(["--cmd".into(), json(&spec.cmd)]);
    }
    if let Some(user) = &spec.user {
        config.extend(["--user".into(), user.clone()]);
    }
    if let Some(dir) = &spec.workdir {
        config.extend(["--workingdir".into(), dir.clone()]);
    }
    for (k, v) in &spec.env {
        config.extend(["--env".into(), format!("{k}={v}")]);
    }
    for (k, v) in &spec.labels {
        config.extend(["--label".into(), format!("{k}={v}")]);
    }
    config.push(container.clone());
    run(&config)?;
    run(&[
        "commit".into(),
        "--format".into(),
        "oci".into(),
        "--timestamp".into(),
        "0".into(),
        container,
        spec.name.clone(),
    ])?;
    let out = work.join("image.tar");
    let digest = work.join("digest");
    run(&[
        "push".into(),
        "--digestfile".into(),
        digest.display().to_string(),
        spec.name.clone(),
        format!("oci-archive:{}:{}", out.display(), spec.name),
    ])?;
    let digest_text = std::fs::read_to_string(&digest).map_err(|e| HarnessError::io(&digest, e))?;
    std::fs::rename(&out, archive).map_err(|e| HarnessError::io(archive, e))?;
    std::fs::write(digest_file, digest_text.trim())
        .map_err(|e| HarnessError::io(digest_file, e))?;
    Ok(BuiltImage {
        name: spec.name.clone(),
        archive: archive.to_path_buf(),
        digest: digest_text.trim().to_string(),
    })
}

/// A hash over the image's configuration and its tree: each entry's path, type, mode, owner
/// and content (or link target).
fn spec_key(spec: &ImageSpec) -> Result<String, HarnessError> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let config = format!(
        "{}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n",
        spec.name, spec.entrypoint, spec.cmd, spec.user, spec.workdir, spec.env, spec.labels
    );
    ctx.update(config.as_bytes());
    hash_tree(&spec.rootfs, &spec.rootfs, &mut ctx)?;
    let digest = ctx.finish();
    Ok(digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn hash_tree(root: &Path, dir: &Path, ctx: &mut ring::digest::Context) -> Result<(), HarnessError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| HarnessError::io(dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let meta = std::fs::symlink_metadata(&path).map_err(|e| HarnessError::io(&path, e))?;
        let relative = path.strip_prefix(root).unwrap_or(&path);
        ctx.update(
            format!(
                "{}\0{:o}\0{}\0{}\0",
                relative.display(),
                meta.mode(),
                meta.uid(),
                meta.gid()
            )
            .as_bytes(),
        );
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| HarnessError::io(&path, e))?;
            ctx.update(target.as_os_str().as_encoded_bytes());
        } else if meta.is_dir() {
            hash_tree(root, &path, ctx)?;
        } else {
            let bytes = std::fs::read(&path).map_err(|e| HarnessError::io(&path, e))?;
            ctx.update(&bytes);
        }
    }
    Ok(())
}

/// A fresh folder under the images cache for assembling a tree (removed by the caller).
fn scratch(name: &str) -> Result<PathBuf, HarnessError> {
    let dir = images_dir().join(format!(
        "tree-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
    Ok(dir)
}

fn mkdir(path: &Path, mode: u32) -> Result<(), HarnessError> {
    std::fs::create_dir_all(path).map_err(|e| HarnessError::io(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| HarnessError::io(path, e))
}

fn write(path: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text).map_err(|e| HarnessError::io(path, e))
}

/// The pause image: our own `e2e/images/pause.c`, compiled statically with the machine's C
/// compiler.
pub fn pause() -> Result<BuiltImage, HarnessError> {
    let tree = scratch("pause")?;
    let result = (|| {
        let source = crate::repo_root().join("e2e/images/pause.c");
        let binary = tree.join("pause");
        let mut cc = Command::new("cc");
        cc.args(["-static", "-Os", "-s", "-o"])
            .arg(&binary)
            .arg(&source);
        crate::cmd::run(cc, None)?.ok("cc -static e2e/images/pause.c")?;
        build(&ImageSpec {
            name: PAUSE_IMAGE.into(),
            rootfs: tree.clone(),
            entrypoint: vec!["/pause".into()],
            user: Some("65535:65535".into()),
            ..ImageSpec::default()
        })
    })();
    let _ = std::fs::remove_dir_all(&tree);
    result
}

/// The busybox image: Debian's statically linked busybox, a link for each applet in `/bin`, a
/// root and a nobody user, and `/tmp`.
pub fn busybox() -> Result<BuiltImage, HarnessError> {
    let source = Path::new("/bin/busybox");
    if !source.is_file() {
        return Err(HarnessError::Node(format!(
            "/bin/busybox is missing: install the Debian packages {DEBIAN_PACKAGES}"
        )));
    }
    let tree = scratch("busybox")?;
    let result = (|| {
        for (dir, mode) in [
            ("bin", 0o755),
            ("etc", 0o755),
            ("tmp", 0o1777),
            ("root", 0o700),
        ] {
            mkdir(&tree.join(dir), mode)?;
        }
        std::fs::copy(source, tree.join("bin/busybox")).map_err(|e| HarnessError::io(source, e))?;
        let mut list = Command::new(source);
        list.arg("--list");
        let applets = crate::cmd::run(list, None)?.ok("busybox --list")?;
        for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
            if applet == "busybox" {
                continue;
            }
            let link = tree.join("bin").join(applet);
            std::os::unix::fs::symlink("busybox", &link).map_err(|e| HarnessError::io(&link, e))?;
        }
        write(
            &tree.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        )?;
        write(&tree.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
        build(&ImageSpec {
            name: BUSYBOX_IMAGE.into(),
            rootfs: tree.clone(),
            cmd: vec!["sh".into()],
            env: vec![("PATH".into(), "/bin".into())],
            ..ImageSpec::default()
        })
    })();
    let _ = std::fs::remove_dir_all(&tree);
    result
}

/// The images every real node imports: pause and busybox.
pub fn test_images() -> Result<Vec<BuiltImage>, HarnessError> {
    Ok(vec![pause()?, busybox()?])
}
