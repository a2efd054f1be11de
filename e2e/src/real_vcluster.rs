//! The real vCluster (issue 29), for the tests on the real node: its chart archive, vendored
//! outside the clone (`../shared/vendor/vcluster`, checked against its `SHA256SUMS`), and the
//! images its chart and syncer run, made without a registry from binaries `e2e/tools/build.sh
//! vcluster` builds from source (vcluster from the vendored archive, kine and CoreDNS from their
//! Go modules) and the harness's own Kubernetes binaries:
//!
//! - [`VCLUSTER_IMAGE`], the syncer (`/vcluster start`);
//! - [`DISTRO_IMAGE`], the distro image whose `/kubernetes/*` the chart's init container copies
//!   to `/binaries` (kube-apiserver, kube-controller-manager and kube-scheduler 1.35.4, kine,
//!   helm);
//! - [`COREDNS_IMAGE`], the CoreDNS vCluster deploys inside for a 1.35 virtual cluster, also the
//!   node's cluster DNS ([`crate::cluster_dns`]).
//!
//! Each is named as the chart's values (or, for CoreDNS, the syncer) select it, so the kubelet
//! finds it imported; docs/development.md lists how each differs from the published image.
//!
//! For upgrade tests, [`package_next_chart`] packages the same chart again as a later version
//! ([`NEXT_CHART_VERSION`]) and [`tag_next_image`] gives the syncer image that version's tag.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::HarnessError;
use crate::images::{BuiltImage, ImageSpec};

/// The vendored chart's version.
pub const CHART_VERSION: &str = "0.37.0-rc.1";
/// The vendored chart archive's file name.
pub const CHART_ARCHIVE: &str = "vcluster-0.37.0-rc.1.tgz";
/// The syncer image the chart's values select (`controlPlane.statefulSet.image`: the chart names
/// the `vcluster-pro` repository at its own version).
pub const VCLUSTER_IMAGE: &str = "ghcr.io/loft-sh/vcluster-pro:0.37.0-rc.1";
/// The version of the second chart the upgrade test packages from the same archive
/// ([`package_next_chart`]): a later pre-release of the same version, so it sorts after
/// [`CHART_VERSION`] and claims no release upstream made.
pub const NEXT_CHART_VERSION: &str = "0.37.0-rc.1-next";
/// The syncer image the second chart selects (the chart tags the image with its own version):
/// the same image as [`VCLUSTER_IMAGE`], tagged so on the node ([`tag_next_image`]).
pub const NEXT_VCLUSTER_IMAGE: &str = "ghcr.io/loft-sh/vcluster-pro:0.37.0-rc.1-next";
/// The distro image the chart's values select (`controlPlane.distro.k8s.image`).
pub const DISTRO_IMAGE: &str = "ghcr.io/loft-sh/kubernetes:v1.36.0";
/// The CoreDNS image the syncer deploys inside a virtual cluster of Kubernetes 1.35
/// (`pkg/constants/coredns.go`, prefixed with `docker.io` as `pkg/coredns` does).
pub const COREDNS_IMAGE: &str = "docker.io/coredns/coredns:1.14.1";
/// What the distro image carries in `/kubernetes`, copied by the chart's init container.
pub const DISTRO_BINARIES: [&str; 5] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kine",
    "helm",
];
/// `PATH` in the images (Alpine's, as the published images have).
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The vendored vCluster folder: `PLATFORM_OPERATOR_VCLUSTER_VENDOR`, or `../shared/vendor/vcluster`
/// beside the clone.
pub fn vendor_dir() -> PathBuf {
    std::env::var_os("PLATFORM_OPERATOR_VCLUSTER_VENDOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("../shared/vendor/vcluster"))
}

/// The real chart archive and its sha256 (hex), checked against the vendored `SHA256SUMS`.
pub fn chart() -> Result<(PathBuf, String), HarnessError> {
    let dir = vendor_dir();
    let sums_path = dir.join("SHA256SUMS");
    let sums = std::fs::read_to_string(&sums_path).map_err(|e| {
        HarnessError::Tools(format!(
            "the vendored vCluster is missing ({}: {e}); set PLATFORM_OPERATOR_VCLUSTER_VENDOR",
            sums_path.display()
        ))
    })?;
    let expected = sums
        .lines()
        .find_map(|l| {
            let (sum, name) = l.split_once(char::is_whitespace)?;
            (name.trim() == CHART_ARCHIVE).then(|| sum.to_string())
        })
        .ok_or_else(|| HarnessError::Tools(format!("{CHART_ARCHIVE} is not in SHA256SUMS")))?;
    let archive = dir.join(CHART_ARCHIVE);
    let actual = crate::images::sha256_file(&archive)?;
    if actual != expected {
        return Err(HarnessError::Tools(format!(
            "{} has sha256 {actual}, SHA256SUMS says {expected}",
            archive.display()
        )));
    }
    Ok((archive, actual))
}

/// The binaries `e2e/tools/build.sh vcluster` builds.
#[derive(Debug, Clone)]
pub struct Tools {
    bin: PathBuf,
}

impl Tools {
    /// Runs `e2e/tools/build.sh vcluster` (nothing to do when warm; waits for a build another
    /// process runs) and checks that vcluster, kine and coredns are there.
    pub fn locate() -> Result<Self, HarnessError> {
        let script = crate::repo_root().join("e2e/tools/build.sh");
        let status = Command::new("bash")
            .arg(&script)
            .arg("vcluster")
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| HarnessError::io(&script, e))?;
        if !status.success() {
            return Err(HarnessError::Tools(format!(
                "{} vcluster failed with {status}",
                script.display()
            )));
        }
        let tools = Tools {
            bin: crate::tools::cache_dir().join("bin"),
        };
        for name in ["vcluster", "kine", "coredns"] {
            if !tools.bin.join(name).is_file() {
                return Err(HarnessError::Tools(format!(
                    "{name} is missing from {}",
                    tools.bin.display()
                )));
            }
        }
        Ok(tools)
    }

    /// The binary `name`, its link resolved (the image trees copy the file).
    pub fn bin(&self, name: &str) -> Result<PathBuf, HarnessError> {
        let link = self.bin.join(name);
        std::fs::canonicalize(&link).map_err(|e| HarnessError::io(&link, e))
    }
}

/// Copies `from` to `to` with mode 0755.
fn install(from: &Path, to: &Path) -> Result<(), HarnessError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| HarnessError::io(parent, e))?;
    }
    std::fs::copy(from, to).map_err(|e| HarnessError::io(from, e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| HarnessError::io(to, e))
}

/// Builds an image from a tree `fill` makes in a scratch folder, removed afterwards.
fn image_from(
    name: &str,
    fill: impl FnOnce(&Path) -> Result<ImageSpec, HarnessError>,
) -> Result<BuiltImage, HarnessError> {
    let slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let tree = crate::images::scratch(&slug)?;
    let result = fill(&tree).and_then(|spec| crate::images::build(&spec));
    let _ = std::fs::remove_dir_all(&tree);
    result
}

/// The syncer image: `/vcluster` (built from the vendored source) with `ENTRYPOINT
/// ["/vcluster", "start"]`, on busybox, Debian's C library (merged-`/usr` layout) (the Kubernetes binaries it runs
/// from `/binaries` are dynamically linked) and Debian's CA store.
pub fn vcluster_image(tools: &Tools) -> Result<BuiltImage, HarnessError> {
    image_from(VCLUSTER_IMAGE, |tree| {
        crate::images::merged_usr_tree(tree)?;
        crate::images::busybox_tree(tree)?;
        crate::images::copy_package(tree, "libc6")?;
        crate::images::copy_package(tree, "ca-certificates")?;
        crate::images::copy_dir(Path::new("/etc/ssl/certs"), &tree.join("etc/ssl/certs"))?;
        install(&tools.bin("vcluster")?, &tree.join("vcluster"))?;
        Ok(ImageSpec {
            name: VCLUSTER_IMAGE.into(),
            rootfs: tree.to_path_buf(),
            entrypoint: vec!["/vcluster".into(), "start".into()],
            workdir: Some("/".into()),
            env: vec![("PATH".into(), IMAGE_PATH.into())],
            ..ImageSpec::default()
        })
    })
}

/// The distro image: [`DISTRO_BINARIES`] in `/kubernetes` (the harness's Kubernetes 1.35.4 and
/// helm, and kine) on busybox, whose `cp` the chart's init container runs.
pub fn distro_image(
    tools: &Tools,
    kubernetes: &crate::tools::Tools,
) -> Result<BuiltImage, HarnessError> {
    image_from(DISTRO_IMAGE, |tree| {
        crate::images::busybox_tree(tree)?;
        for name in DISTRO_BINARIES {
            let from = if name == "kine" {
                tools.bin(name)?
            } else {
                let link = kubernetes.bin(name);
                std::fs::canonicalize(&link).map_err(|e| HarnessError::io(&link, e))?
            };
            install(&from, &tree.join("kubernetes").join(name))?;
        }
        Ok(ImageSpec {
            name: DISTRO_IMAGE.into(),
            rootfs: tree.to_path_buf(),
            cmd: vec!["sh".into()],
            env: vec![("PATH".into(), IMAGE_PATH.into())],
            ..ImageSpec::default()
        })
    })
}

/// The CoreDNS image: the statically linked `/coredns` alone, `ENTRYPOINT ["/coredns"]`.
pub fn coredns_image(tools: &Tools) -> Result<BuiltImage, HarnessError> {
    image_from(COREDNS_IMAGE, |tree| {
        install(&tools.bin("coredns")?, &tree.join("coredns"))?;
        Ok(ImageSpec {
            name: COREDNS_IMAGE.into(),
            rootfs: tree.to_path_buf(),
            entrypoint: vec!["/coredns".into()],
            ..ImageSpec::default()
        })
    })
}

/// The three images, built or taken from the cache.
pub fn images(tools: &Tools) -> Result<Vec<BuiltImage>, HarnessError> {
    let kubernetes = crate::tools::Tools::locate()?;
    Ok(vec![
        vcluster_image(tools)?,
        distro_image(tools, &kubernetes)?,
        coredns_image(tools)?,
    ])
}

/// The vendored chart packaged again as [`NEXT_CHART_VERSION`] (`helm package --version
/// --app-version`, as the vendored archive was made from the source tree) into `dir`: the
/// archive and its sha256 (hex). Its templates, values and schema are the vendored ones; the
/// version, and so its labels and the syncer image's tag, differ.
pub fn package_next_chart(helm: &Path, dir: &Path) -> Result<(PathBuf, String), HarnessError> {
    let (archive, _) = chart()?;
    let unpacked = dir.join(format!("vcluster-{NEXT_CHART_VERSION}-src"));
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::create_dir_all(&unpacked).map_err(|e| HarnessError::io(&unpacked, e))?;
    let mut tar = Command::new("tar");
    tar.arg("-xzf").arg(&archive).arg("-C").arg(&unpacked);
    crate::cmd::run(tar, None)?.ok("unpacking the vendored vCluster chart")?;
    let mut package = Command::new(helm);
    package
        .arg("package")
        .arg(unpacked.join("vcluster"))
        .arg("-d")
        .arg(dir)
        .args(["--version", NEXT_CHART_VERSION])
        .args(["--app-version", NEXT_CHART_VERSION]);
    let packaged = crate::cmd::run(package, None)?.ok("helm package of the vCluster chart");
    let _ = std::fs::remove_dir_all(&unpacked);
    packaged?;
    let next = dir.join(format!("vcluster-{NEXT_CHART_VERSION}.tgz"));
    let sha = crate::images::sha256_file(&next)?;
    Ok((next, sha))
}

/// Tags the imported syncer image [`VCLUSTER_IMAGE`] as [`NEXT_VCLUSTER_IMAGE`] on `node`, the
/// image the second chart's control plane runs.
pub fn tag_next_image(node: &crate::real_node::RealNode) -> Result<(), HarnessError> {
    node.ctr(&[
        "images",
        "tag",
        "--force",
        VCLUSTER_IMAGE,
        NEXT_VCLUSTER_IMAGE,
    ])
    .map(|_| ())
}
