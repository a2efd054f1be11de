//! The vCluster chart shipped with the operator: checked by sha256 digest before anything uses it,
//! and its version read with `helm show chart`.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;

use crate::helm::Helm;

/// Why the chart (at path `.0`) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The file could not be read.
    #[error(
        "cannot read the vCluster chart {0}: {1}; set --vcluster-chart to the shipped chart archive"
    )]
    Read(String, #[source] std::io::Error),
    /// Its digest (`.1`) differs from the expected one (`.2`).
    #[error(
        "the vCluster chart {0} has sha256 {1}, not the expected {2}: refusing to start; ship the chart this release was built with, or set --vcluster-chart-sha256 to the digest of the chart you trust"
    )]
    Digest(String, String, String),
    /// `helm show chart` found no version (`.1`: why).
    #[error("the vCluster chart {0} has no readable Chart.yaml version: {1}")]
    Version(String, String),
}

/// The sha256 of a file, in lower-case hex.
pub fn sha256_file(path: &Path) -> Result<String, std::io::Error> {
    let mut file = std::fs::File::open(path)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        context.update(&buf[..n]);
    }
    Ok(hex(context.finish().as_ref()))
}

/// `bytes` in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks the chart against `expected` (`sha256:<hex>` or bare hex).
pub fn verify(path: &Path, expected: &str) -> Result<(), ChartError> {
    let shown = path.display().to_string();
    let actual = sha256_file(path).map_err(|source| ChartError::Read(shown.clone(), source))?;
    let expected = expected
        .trim()
        .trim_start_matches("sha256:")
        .to_ascii_lowercase();
    if actual != expected {
        return Err(ChartError::Digest(shown, actual, expected));
    }
    Ok(())
}

/// The chart's version, from `helm show chart` (its Chart.yaml).
pub async fn version(helm: &Helm, path: &Path) -> Result<String, ChartError> {
    let shown = path.display().to_string();
    let err = |reason: String| ChartError::Version(shown.clone(), reason);
    let args = [OsStr::new("show"), OsStr::new("chart"), path.as_os_str()];
    let out = (helm.run("show chart", &shown, &args).await).map_err(|e| err(e.to_string()))?;
    out.lines()
        .find_map(|l| {
            l.strip_prefix("version:")
                .map(|v| v.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| err("Chart.yaml has no version".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_digest_refuses_and_says_why() {
        let dir = std::env::temp_dir().join(format!("chart-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("chart.tgz");
        std::fs::write(&file, b"not really a chart").expect("write");
        let digest = sha256_file(&file).expect("hash");
        assert_eq!(digest.len(), 64);
        verify(&file, &format!("sha256:{digest}")).expect("matching digest");
        verify(&file, &digest.to_uppercase()).expect("case and prefix do not matter");
        let e = verify(&file, &"0".repeat(64)).expect_err("mismatch");
        assert!(
            e.to_string().contains("refusing to start") && e.to_string().contains(&digest),
            "{e}"
        );
        let e = verify(&dir.join("missing.tgz"), &digest).expect_err("missing");
        assert!(e.to_string().contains("--vcluster-chart"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
