//! Container images without a registry, for the real node ([`crate::real_node`]): each is a
//! folder tree (owners and modes as they are) made into a one-layer OCI image by Debian's
//! `buildah` (in a private, throw-away storage), written as an OCI archive that
//! `ctr images import` takes, and cached by a hash of its tree and configuration.
//!
//! - [`PAUSE_IMAGE`]: the pods' sandbox, our own `e2e/images/pause.c` statically linked;
//! - [`BUSYBOX_IMAGE`]: Debian's `busybox-static` with a link for each of its applets;
//! - the operator image ([`operator`]): the project's `Dockerfile` followed instruction by
//!   instruction on a tree assembled from Debian packages and the test build's binaries, nothing
//!   pulled and nothing run inside it (docs/development.md lists how it differs from the
//!   published image);
//! - [`JobImages`]: what the controller's Jobs and its stand-in vCluster's pods run on a real
//!   node, the operator image and the pause program under the stand-in chart's image names.

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
    let cached = || -> Option<BuiltImage> {
        let digest = std::fs::read_to_string(&digest_file).ok()?;
        archive.exists().then(|| BuiltImage {
            name: spec.name.clone(),
            archive: archive.clone(),
            digest: digest.trim().to_string(),
        })
    };
    if let Some(image) = cached() {
        return Ok(image);
    }
    // Test processes running side by side may need the same image: one builds it, the others
    // wait for its lock and take it from the cache.
    let lock_path = dir.join(format!("{slug}-{key}.lock"));
    let lock = std::fs::File::create(&lock_path).map_err(|e| HarnessError::io(&lock_path, e))?;
    lock.lock().map_err(|e| HarnessError::io(&lock_path, e))?;
    if let Some(image) = cached() {
        return Ok(image);
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
    if result.is_ok() {
        prune(&dir, &slug, &key);
    }
    result
}

/// Removes the cached builds of the image `slug` other than `key` that are more than an hour old
/// (a newer one may be in use by another test run), so that the cache does not grow with every
/// change of the image's inputs.
fn prune(dir: &Path, slug: &str, key: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let hour = std::time::Duration::from_secs(3600);
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&format!("{slug}-")) else {
            continue;
        };
        let Some((other, _)) = rest.split_once('.') else {
            continue;
        };
        // Another key of this image (hex), not a longer name that shares the prefix.
        if other == key || other.len() != key.len() || !other.bytes().all(|b| b.is_ascii_hexdigit())
        {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > hour);
        if old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
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
pub(crate) fn scratch(name: &str) -> Result<PathBuf, HarnessError> {
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

pub(crate) fn mkdir(path: &Path, mode: u32) -> Result<(), HarnessError> {
    std::fs::create_dir_all(path).map_err(|e| HarnessError::io(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| HarnessError::io(path, e))
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text).map_err(|e| HarnessError::io(path, e))
}

/// The pause image: our own `e2e/images/pause.c`, compiled statically with the machine's C
/// compiler.
pub fn pause() -> Result<BuiltImage, HarnessError> {
    pause_named(PAUSE_IMAGE)
}

/// The pause program ([`pause`]) as the image `name`: a process that does nothing until it is
/// stopped, and exits at once on SIGTERM.
pub fn pause_named(name: &str) -> Result<BuiltImage, HarnessError> {
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
            name: name.into(),
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
    let tree = scratch("busybox")?;
    let result = busybox_tree(&tree).and_then(|()| {
        build(&ImageSpec {
            name: BUSYBOX_IMAGE.into(),
            rootfs: tree.clone(),
            cmd: vec!["sh".into()],
            env: vec![("PATH".into(), "/bin".into())],
            ..ImageSpec::default()
        })
    });
    let _ = std::fs::remove_dir_all(&tree);
    result
}

/// The busybox image's tree in `tree`: Debian's statically linked busybox with a link for each
/// applet in `/bin`, `/etc/passwd` and `/etc/group` with root and nobody, `/tmp` and `/root`.
pub(crate) fn busybox_tree(tree: &Path) -> Result<(), HarnessError> {
    let source = Path::new("/bin/busybox");
    if !source.is_file() {
        return Err(HarnessError::Node(format!(
            "/bin/busybox is missing: install the Debian packages {DEBIAN_PACKAGES}"
        )));
    }
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
    write(&tree.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")
}

/// The images every real node imports: pause and busybox.
pub fn test_images() -> Result<Vec<BuiltImage>, HarnessError> {
    Ok(vec![pause()?, busybox()?])
}

/// What the controller's Jobs and its stand-in vCluster's pods run on a real node.
#[derive(Debug, Clone)]
pub struct JobImages {
    /// The operator image built from the `Dockerfile` ([`operator`] of
    /// [`OperatorInputs::for_tests`]): the storage cleanup Jobs and each vCluster control plane's
    /// `storage-owner` init container run it, referred to by digest.
    pub operator: BuiltImage,
    /// The stand-in vCluster chart's control plane images
    /// ([`crate::standin_vcluster::control_plane_images`]), referred to by name.
    pub standin_vcluster: Vec<BuiltImage>,
}

/// Builds the [`JobImages`] (or takes them from the cache), once per test process.
pub fn job_images() -> Result<JobImages, HarnessError> {
    static BUILT: std::sync::OnceLock<Result<JobImages, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let inputs = OperatorInputs::for_tests().map_err(|e| e.to_string())?;
            Ok(JobImages {
                operator: operator(&inputs).map_err(|e| format!("the operator image: {e}"))?,
                standin_vcluster: crate::standin_vcluster::control_plane_images()
                    .map_err(|e| format!("the stand-in vCluster's images: {e}"))?,
            })
        })
        .clone()
        .map_err(HarnessError::Node)
}

/// The tag the operator image carries beside its digest (the chart pins it by digest only).
pub const OPERATOR_TAG: &str = "e2e";

/// The Debian packages (as installed on this machine) whose files stand in for the runtime
/// stage's base image `node:<version>-bookworm-slim`: the C and C++ runtime libraries, a
/// `/bin/sh` (npm runs package scripts with it) and Node.js with npm.
pub const OPERATOR_BASE_PACKAGES: [&str; 5] =
    ["libc6", "libgcc-s1", "libstdc++6", "dash", "nodejs"];

/// Folders of those packages that an image has no use for (headers, manuals, documentation).
const SKIPPED_PREFIXES: [&str; 5] = [
    "/usr/include",
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/lintian",
    "/usr/share/info",
];

/// What the operator image is made of: the files the Dockerfile's build and tools stages would
/// produce, from this machine.
#[derive(Debug, Clone)]
pub struct OperatorInputs {
    /// The release build of the controller (the build stage's `/out/controller`).
    pub controller: PathBuf,
    /// The release build of the webhook (`/out/webhook`).
    pub webhook: PathBuf,
    /// The tools stage's `/out/bin/`: helm, the Pulumi CLI, its Node.js language host and its
    /// dynamic-provider plugin, from the harness's tool cache.
    pub tools: Vec<PathBuf>,
    /// The vCluster chart archive (the tools stage's `/out/vcluster.tgz`).
    pub vcluster_chart: PathBuf,
}

impl OperatorInputs {
    /// The inputs the tests use: the release binaries of this workspace (built with `cargo build
    /// --release` when stale; cargo decides), helm and the Pulumi CLI from the tool cache, and
    /// the **stand-in** vCluster chart the controller is tested with (packaged once per content
    /// of `e2e/standin-vcluster`).
    pub fn for_tests() -> Result<Self, HarnessError> {
        let (controller, webhook) = release_binaries()?;
        let tools = crate::tools::Tools::locate()?;
        let mut bins = Vec::new();
        for name in [
            "helm",
            "pulumi",
            "pulumi-language-nodejs",
            "pulumi-resource-pulumi-nodejs",
        ] {
            let link = tools.bin(name);
            let bin = std::fs::canonicalize(&link).map_err(|e| HarnessError::io(&link, e))?;
            bins.push(bin);
        }
        let vcluster_chart = standin_chart(&tools.bin("helm"))?;
        Ok(OperatorInputs {
            controller,
            webhook,
            tools: bins,
            vcluster_chart,
        })
    }
}

/// `cargo build --release --locked -p controller -p webhook` (a no-op when fresh) in this
/// workspace's target folder; the two binaries.
pub fn release_binaries() -> Result<(PathBuf, PathBuf), HarnessError> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| {
                exe.ancestors()
                    .find(|a| {
                        a.file_name()
                            .is_some_and(|n| n == "debug" || n == "release")
                    })
                    .and_then(Path::parent)
                    .map(Path::to_path_buf)
            })
            .unwrap_or_else(|| crate::repo_root().join("target")),
    };
    let mut cmd = crate::cmd::cargo();
    cmd.env("CARGO_TARGET_DIR", &target).args([
        "build",
        "--release",
        "--locked",
        "--quiet",
        "-p",
        "controller",
        "-p",
        "webhook",
    ]);
    crate::cmd::run(cmd, None)?.ok("cargo build --release -p controller -p webhook")?;
    let release = target.join("release");
    Ok((release.join("controller"), release.join("webhook")))
}

/// The stand-in vCluster chart archive, packaged into the images cache once per content of
/// `e2e/standin-vcluster` (helm's archives carry the time they were made, so packaging again
/// would change the image).
pub fn standin_chart(helm: &Path) -> Result<PathBuf, HarnessError> {
    let source = crate::repo_root().join("e2e/standin-vcluster");
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(crate::standin_vcluster::CHART_VERSION.as_bytes());
    hash_tree(&source, &source, &mut ctx)?;
    let key = hex(&ctx.finish().as_ref()[..6]);
    let dir = images_dir().join(format!("vcluster-chart-{key}"));
    let archive = dir.join(format!(
        "vcluster-{}.tgz",
        crate::standin_vcluster::CHART_VERSION
    ));
    if !archive.is_file() {
        let work = scratch("vcluster-chart")?;
        let packaged = crate::standin_vcluster::package_chart(
            helm,
            &work,
            crate::standin_vcluster::CHART_VERSION,
        );
        let result = packaged.and_then(|p| {
            std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
            std::fs::rename(&p, &archive).map_err(|e| HarnessError::io(&archive, e))
        });
        let _ = std::fs::remove_dir_all(&work);
        result?;
    }
    Ok(archive)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of a file, as `hex`.
pub fn sha256_file(path: &Path) -> Result<String, HarnessError> {
    let bytes = std::fs::read(path).map_err(|e| HarnessError::io(path, e))?;
    Ok(hex(
        ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref()
    ))
}

/// The chart's `image.repository` (`charts/platform-operator/values.yaml`).
pub fn chart_repository() -> Result<String, HarnessError> {
    let path = crate::chart::chart_dir().join("values.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
    let values: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| HarnessError::Node(format!("{}: {e}", path.display())))?;
    values["image"]["repository"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| HarnessError::Node(format!("{} has no image.repository", path.display())))
}

/// The operator image, built by following the `Dockerfile`'s final stage on a tree assembled
/// here: its base (`node:…-bookworm-slim`) from [`OPERATOR_BASE_PACKAGES`], each `COPY` from
/// `inputs`, each `RUN` done by the builder itself (it knows the two the stage has: installing
/// `ca-certificates`, and making and handing over the mount points; any other fails the build,
/// naming it), then its `ENV`, `LABEL`, `USER`, `WORKDIR` and `ENTRYPOINT` as written. Named
/// `<chart repository>:`[`OPERATOR_TAG`]; cached by a hash of the tree and configuration.
pub fn operator(inputs: &OperatorInputs) -> Result<BuiltImage, HarnessError> {
    let text = crate::dockerfile::read()
        .map_err(|e| HarnessError::io(&crate::repo_root().join("Dockerfile"), e))?;
    let stages = crate::dockerfile::stages(&text);
    let runtime = stages
        .last()
        .ok_or_else(|| HarnessError::Node("the Dockerfile has no stage".into()))?;
    let name = format!("{}:{OPERATOR_TAG}", chart_repository()?);
    let tree = scratch("operator")?;
    let result = (|| {
        let spec = operator_tree(runtime, inputs, &tree, &name)?;
        build(&spec)
    })();
    let _ = std::fs::remove_dir_all(&tree);
    result
}

/// Assembles the operator image's tree in `tree` and says how to configure it.
fn operator_tree(
    runtime: &[crate::dockerfile::Instruction],
    inputs: &OperatorInputs,
    tree: &Path,
    name: &str,
) -> Result<ImageSpec, HarnessError> {
    use crate::dockerfile::exec_form;
    let from = runtime.first().map(|i| i.rest.as_str()).unwrap_or_default();
    if !from.starts_with("node:") || !from.contains("bookworm-slim") {
        return Err(HarnessError::Node(format!(
            "the Dockerfile's final stage is FROM {from}; the image builder assembles only \
             node:…-bookworm-slim (e2e/src/images.rs)"
        )));
    }
    base_tree(tree)?;
    let chart_sha = sha256_file(&inputs.vcluster_chart)?;
    let mut user = None;
    let mut workdir = None;
    let mut entrypoint = Vec::new();
    for instruction in runtime.iter().skip(1) {
        let rest = instruction.rest.as_str();
        match instruction.keyword.as_str() {
            "ARG" | "ENV" | "LABEL" => {}
            "COPY" => copy_into(tree, rest, inputs)?,
            "RUN" => run_into(tree, rest)?,
            "USER" => user = Some(rest.to_string()),
            "WORKDIR" => workdir = Some(rest.to_string()),
            "ENTRYPOINT" => {
                entrypoint = exec_form(rest).ok_or_else(|| {
                    HarnessError::Node(format!("ENTRYPOINT {rest} is not in exec form"))
                })?;
            }
            other => {
                return Err(HarnessError::Node(format!(
                    "the image builder does not know the Dockerfile instruction {other} {rest}"
                )));
            }
        }
    }
    if let Some(dir) = &workdir {
        let path = tree.join(dir.trim_start_matches('/'));
        std::fs::create_dir_all(&path).map_err(|e| HarnessError::io(&path, e))?;
    }
    let env = crate::dockerfile::env_in_order(runtime)
        .into_iter()
        .map(|(k, v)| (k, v.replace("${VCLUSTER_CHART_SHA256}", &chart_sha)))
        .collect();
    Ok(ImageSpec {
        name: name.to_string(),
        rootfs: tree.to_path_buf(),
        entrypoint,
        cmd: Vec::new(),
        user,
        workdir,
        env,
        labels: crate::dockerfile::labels(runtime),
    })
}

/// The base: Debian's merged-`/usr` links, [`OPERATOR_BASE_PACKAGES`]' files, coreutils' `env`,
/// `/tmp`, and the
/// users the Node.js image has (root, and `node` with uid and gid 1000).
fn base_tree(tree: &Path) -> Result<(), HarnessError> {
    merged_usr_tree(tree)?;
    mkdir(&tree.join("tmp"), 0o1777)?;
    mkdir(&tree.join("root"), 0o700)?;
    for package in OPERATOR_BASE_PACKAGES {
        copy_package(tree, package)?;
    }
    let sh = tree.join("usr/bin/sh");
    if std::fs::symlink_metadata(&sh).is_err() {
        std::os::unix::fs::symlink("dash", &sh).map_err(|e| HarnessError::io(&sh, e))?;
    }
    // npm is a script starting `#!/usr/bin/env node`: without coreutils' `env` (which the base
    // image has) running it fails with "No such file or directory".
    let env = Path::new("/usr/bin/env");
    std::fs::copy(env, tree.join("usr/bin/env")).map_err(|e| HarnessError::io(env, e))?;
    // npm as it is on disk: an npm upgraded in place (`npm install -g npm`) has files the
    // package's list (`dpkg -L nodejs`) does not name, and misses them otherwise.
    let npm = Path::new("/usr/lib/node_modules/npm");
    if npm.is_dir() {
        let into = tree.join("usr/lib/node_modules/npm");
        let _ = std::fs::remove_dir_all(&into);
        copy_dir(npm, &into)?;
    }
    write(
        &tree.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    write(
        &tree.join("etc/group"),
        "root:x:0:\nnode:x:1000:\nnogroup:x:65534:\n",
    )?;
    Ok(())
}

/// Debian's merged-`/usr` layout in `tree`: the `usr` folders, `etc`, and the links `bin`,
/// `sbin`, `lib` and `lib64` into `usr` (what [`copy_package`] needs before it copies a
/// package's files, whose paths go through those links on this machine).
pub(crate) fn merged_usr_tree(tree: &Path) -> Result<(), HarnessError> {
    for dir in [
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "usr/local/bin",
        "etc",
    ] {
        mkdir(&tree.join(dir), 0o755)?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        let path = tree.join(link);
        std::os::unix::fs::symlink(target, &path).map_err(|e| HarnessError::io(&path, e))?;
    }
    Ok(())
}

/// Copies the files Debian's package `package` installed on this machine (`dpkg -L`) into
/// `tree`, links as links, leaving out [`SKIPPED_PREFIXES`].
pub(crate) fn copy_package(tree: &Path, package: &str) -> Result<(), HarnessError> {
    let mut dpkg = Command::new("dpkg");
    dpkg.args(["-L", package]);
    let list = crate::cmd::run(dpkg, None)?
        .ok(&format!("dpkg -L {package}"))
        .map_err(|e| {
            HarnessError::Node(format!(
                "{e}: the operator image's base needs the Debian package {package} installed"
            ))
        })?;
    for line in list.lines().map(str::trim) {
        if !line.starts_with('/') || SKIPPED_PREFIXES.iter().any(|p| line.starts_with(p)) {
            continue;
        }
        let source = Path::new(line);
        let Ok(meta) = std::fs::symlink_metadata(source) else {
            continue;
        };
        let dest = tree.join(line.trim_start_matches('/'));
        if meta.is_dir() {
            if std::fs::symlink_metadata(&dest).is_err() {
                mkdir(&dest, meta.mode() & 0o7777)?;
            }
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HarnessError::io(parent, e))?;
        }
        let _ = std::fs::remove_file(&dest);
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(source).map_err(|e| HarnessError::io(source, e))?;
            std::os::unix::fs::symlink(&target, &dest).map_err(|e| HarnessError::io(&dest, e))?;
        } else {
            std::fs::copy(source, &dest).map_err(|e| HarnessError::io(source, e))?;
        }
    }
    Ok(())
}

/// One `COPY --from=<stage> <source> <destination>` of the final stage, from `inputs`.
fn copy_into(tree: &Path, rest: &str, inputs: &OperatorInputs) -> Result<(), HarnessError> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    let from = words
        .iter()
        .find_map(|w| w.strip_prefix("--from="))
        .unwrap_or_default();
    let plain: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| !w.starts_with("--"))
        .collect();
    let (source, dest) = match plain.as_slice() {
        [source, dest] => (*source, *dest),
        _ => {
            return Err(HarnessError::Node(format!(
                "COPY {rest}: the image builder takes one source and one destination"
            )));
        }
    };
    let into = tree.join(dest.trim_start_matches('/'));
    let files: Vec<(&Path, u32)> = match (from, source) {
        ("build", "/out/controller") => vec![(&inputs.controller, 0o755)],
        ("build", "/out/webhook") => vec![(&inputs.webhook, 0o755)],
        ("tools", "/out/bin/") => inputs.tools.iter().map(|t| (t.as_path(), 0o755)).collect(),
        ("tools", "/out/vcluster.tgz") => vec![(&inputs.vcluster_chart, 0o444)],
        _ => {
            return Err(HarnessError::Node(format!(
                "COPY {rest}: the image builder does not know where {from}:{source} comes from \
                 (e2e/src/images.rs)"
            )));
        }
    };
    for (file, mode) in files {
        let target = if dest.ends_with('/') {
            let name = file
                .file_name()
                .ok_or_else(|| HarnessError::Node(format!("{} has no name", file.display())))?;
            into.join(name)
        } else {
            into.clone()
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HarnessError::io(parent, e))?;
        }
        std::fs::copy(file, &target).map_err(|e| HarnessError::io(file, e))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(|e| HarnessError::io(&target, e))?;
    }
    Ok(())
}

/// One `RUN` of the final stage, done without running anything in the image: `apt-get install`
/// of packages copies them from this machine (for `ca-certificates`, with the certificate store
/// this machine generated from it); `mkdir -p` and `chown <uid>:<gid>` make and hand over
/// folders. Anything else fails, naming the command.
fn run_into(tree: &Path, rest: &str) -> Result<(), HarnessError> {
    for command in rest.split("&&").map(str::trim) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["apt-get", "update"] => {}
            ["rm", "-rf", "/var/lib/apt/lists/*"] => {}
            ["apt-get", "install", args @ ..] => {
                for package in args.iter().filter(|a| !a.starts_with('-')) {
                    copy_package(tree, package)?;
                    if *package == "ca-certificates" {
                        copy_dir(Path::new("/etc/ssl/certs"), &tree.join("etc/ssl/certs"))?;
                    }
                }
            }
            ["mkdir", "-p", dirs @ ..] => {
                for dir in dirs {
                    mkdir(&tree.join(dir.trim_start_matches('/')), 0o755)?;
                }
            }
            ["chown", owner, paths @ ..] => {
                let (uid, gid) = owner
                    .split_once(':')
                    .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
                    .ok_or_else(|| {
                        HarnessError::Node(format!("RUN chown {owner}: a numeric uid:gid"))
                    })?;
                for path in paths {
                    let p = tree.join(path.trim_start_matches('/'));
                    std::os::unix::fs::chown(&p, Some(uid), Some(gid))
                        .map_err(|e| HarnessError::io(&p, e))?;
                }
            }
            _ => {
                return Err(HarnessError::Node(format!(
                    "the image builder does not know how to do RUN {command} without running it \
                     (e2e/src/images.rs)"
                )));
            }
        }
    }
    Ok(())
}

/// Copies the folder `from` (files and links, not deeper folders' owners) to `to`.
pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<(), HarnessError> {
    std::fs::create_dir_all(to).map_err(|e| HarnessError::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| HarnessError::io(from, e))? {
        let entry = entry.map_err(|e| HarnessError::io(from, e))?;
        let (source, dest) = (entry.path(), to.join(entry.file_name()));
        let meta = std::fs::symlink_metadata(&source).map_err(|e| HarnessError::io(&source, e))?;
        let _ = std::fs::remove_file(&dest);
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&source).map_err(|e| HarnessError::io(&source, e))?;
            std::os::unix::fs::symlink(&target, &dest).map_err(|e| HarnessError::io(&dest, e))?;
        } else if meta.is_dir() {
            copy_dir(&source, &dest)?;
        } else {
            std::fs::copy(&source, &dest).map_err(|e| HarnessError::io(&source, e))?;
        }
    }
    Ok(())
}

/// The configuration (OCI image config JSON) of the one image in the OCI archive `archive`, read
/// through its index and manifest.
pub fn archive_config(archive: &Path) -> Result<serde_json::Value, HarnessError> {
    let member = |name: &str| -> Result<serde_json::Value, HarnessError> {
        let mut tar = Command::new("tar");
        tar.arg("-xOf").arg(archive).arg(name);
        let text = crate::cmd::run(tar, None)?.ok(&format!("tar -xOf {name}"))?;
        serde_json::from_str(&text)
            .map_err(|e| HarnessError::Node(format!("{name} in {}: {e}", archive.display())))
    };
    let blob = |digest: &serde_json::Value| -> Result<serde_json::Value, HarnessError> {
        let digest = digest.as_str().unwrap_or_default();
        member(&format!("blobs/{}", digest.replacen(':', "/", 1)))
    };
    let index = member("index.json")?;
    let manifest = blob(&index["manifests"][0]["digest"])?;
    blob(&manifest["config"]["digest"])
}
