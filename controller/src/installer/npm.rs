//! Installs the platform package at its exact version with npm, from the npm cache shared on the
//! state volume (N instances at one version download it once). npm's `--json` error object
//! (`error.code`) maps onto typed errors; its human text is never parsed.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::process;

/// The npm CLI as the installer runs it.
#[derive(Clone, Debug)]
pub struct Npm {
    pub binary: String,
    pub registry: String,
    /// The shared npm cache folder.
    pub cache: PathBuf,
    /// Let npm run install scripts (`--npm-allow-scripts`); otherwise `--ignore-scripts`.
    pub allow_scripts: bool,
    /// npm's node heap limit, in MiB (`--npm-heap-limit`, passed as `NODE_OPTIONS`).
    pub heap_limit_mib: u32,
}

/// Errors of an npm install (`code`: npm's error code).
#[derive(Debug, thiserror::Error)]
pub enum NpmError {
    #[error("running {binary} failed: {source}; install npm or set --npm-binary")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    /// The registry has no such package version (E404, ETARGET).
    #[error(
        "{package}@{version} is not in the npm registry {registry} ({code}); set spec.version to a published version"
    )]
    VersionNotFound {
        package: String,
        version: String,
        registry: String,
        code: String,
    },
    #[error(
        "the npm registry {registry} cannot be reached ({code}); check --npm-registry (the chart's npmRegistry) and the operator's egress"
    )]
    Unreachable { registry: String, code: String },
    #[error(
        "npm install of {package}@{version} failed: npm's node process reached its heap limit of {limit_mib} MiB (--npm-heap-limit) and was stopped; the controller and other instances are unaffected. Raise --npm-heap-limit together with the container's memory, or check the package's dependency tree"
    )]
    OutOfMemory {
        package: String,
        version: String,
        limit_mib: u32,
    },
    /// npm failed otherwise (`summary`: npm's one-line summary).
    #[error("npm install failed ({code}): {summary}")]
    Failed { code: String, summary: String },
    /// The installed tree breaks the program contract (see `docs/controller.md`).
    #[error("{0}")]
    Contract(String),
}

/// Checks npm's lockfile: the project's Pulumi SDK (`sdk`) must be the only copy in the tree,
/// so the program's config and the platform's resources share one SDK; a package that brings
/// its own fails the install, naming the version it wants.
pub fn check_single_sdk(lockfile: &str, sdk: &str) -> Result<(), NpmError> {
    let lock: Value = serde_json::from_str(lockfile).map_err(|e| {
        NpmError::Contract(format!(
            "npm wrote a package-lock.json the operator cannot read: {e}"
        ))
    })?;
    let Some(packages) = lock.get("packages").and_then(Value::as_object) else {
        let message =
            "npm's package-lock.json has no packages (lockfile version 2 or later is needed)";
        return Err(NpmError::Contract(message.into()));
    };
    let version = |p: &Value| p.get("version").and_then(Value::as_str).map(String::from);
    let declared = packages
        .get(&format!("node_modules/{sdk}"))
        .and_then(version);
    let suffix = format!("/node_modules/{sdk}");
    if let Some((path, p)) = packages.iter().find(|(k, _)| k.ends_with(&suffix)) {
        let wanted = version(p).unwrap_or_else(|| "another version".into());
        let declared = declared.as_deref().unwrap_or("none");
        let owner = path.trim_end_matches(&suffix);
        return Err(NpmError::Contract(format!(
            "{owner} brings its own {sdk} {wanted} beside the project's {declared}: two Pulumi SDKs in one program; set --pulumi-sdk-version={wanted} (the chart's pulumiSdkVersion)"
        )));
    }
    if declared.is_none() {
        return Err(NpmError::Contract(format!(
            "npm installed no {sdk} into the project; the program needs it"
        )));
    }
    Ok(())
}

/// npm error codes that mean the registry was not reached (besides every `EAI_*`).
const UNREACHABLE: [&str; 8] = [
    "ECONNREFUSED",
    "ECONNRESET",
    "ENOTFOUND",
    "ETIMEDOUT",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "ERR_SOCKET_TIMEOUT",
    "ECONNABORTED",
];

/// `url` with any credentials in it (`user:token@`) replaced, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// Maps npm's `--json` error object onto an error.
pub fn classify(stdout: &str, package: &str, version: &str, registry: &str) -> NpmError {
    let report = serde_json::from_str::<Value>(stdout.trim()).ok();
    let (code, summary) = match report.as_ref().and_then(|r| r.get("error")) {
        Some(e) => {
            let field = |k: &str| e.get(k).and_then(Value::as_str).map(String::from);
            let code = field("code").unwrap_or_else(|| "unknown".into());
            (code, field("summary").unwrap_or_default())
        }
        None => ("unknown".into(), "npm printed no error report".into()),
    };
    match code.as_str() {
        "E404" | "ETARGET" => NpmError::VersionNotFound {
            package: package.into(),
            version: version.into(),
            registry: registry.into(),
            code,
        },
        c if UNREACHABLE.contains(&c) || c.starts_with("EAI_") => NpmError::Unreachable {
            registry: registry.into(),
            code,
        },
        _ => NpmError::Failed {
            code,
            summary: summary.chars().take(300).collect(),
        },
    }
}

impl Npm {
    fn command(&self, project: &Path) -> tokio::process::Command {
        let mut cmd = process::command(&self.binary);
        cmd.current_dir(project)
            .args([
                "install",
                "--json",
                "--save-exact",
                "--prefer-offline",
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                "--loglevel=error",
                "--fetch-retries=1",
                "--fetch-retry-mintimeout=2000",
                "--fetch-retry-maxtimeout=10000",
            ])
            .arg(format!("--cache={}", self.cache.display()))
            // In the environment, not argv: a mirror URL may carry credentials.
            .env("npm_config_registry", &self.registry);
        // npm is a node program too.
        process::cap_node_heap(&mut cmd, self.heap_limit_mib);
        if !self.allow_scripts {
            // No package's install script runs with the operator's environment and volume.
            cmd.arg("--ignore-scripts");
        }
        cmd
    }

    /// The error of an npm run that exited non-zero.
    fn failed(&self, out: &process::Output, package: &str, version: &str) -> NpmError {
        if process::heap_exhausted([out.stdout.as_str(), out.stderr.as_str()]) {
            return NpmError::OutOfMemory {
                package: package.into(),
                version: version.into(),
                limit_mib: self.heap_limit_mib,
            };
        }
        classify(&out.stdout, package, version, &redact(&self.registry))
    }

    /// Runs `npm install` in `project`; `state` is the folder of the tool's pid file.
    pub async fn install(
        &self,
        project: &Path,
        package: &str,
        version: &str,
        state: &Path,
    ) -> Result<(), NpmError> {
        let out = process::run(self.command(project), None, state)
            .await
            .map_err(|source| NpmError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        if !out.success() {
            return Err(self.failed(&out, package, version));
        }
        let lockfile = std::fs::read_to_string(project.join("package-lock.json")).map_err(|e| {
            NpmError::Contract(format!("npm wrote no readable package-lock.json: {e}"))
        })?;
        check_single_sdk(&lockfile, super::SDK_PACKAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_registry_url_never_reach_a_message() {
        assert_eq!(
            redact("https://user:s3cret@npm.example/repo/"),
            "https://***@npm.example/repo/"
        );
        assert_eq!(redact("https://npm.example/"), "https://npm.example/");
    }

    #[test]
    fn npm_runs_with_its_heap_capped_and_a_heap_exhaustion_is_told_apart() {
        let npm = Npm {
            binary: "npm".into(),
            registry: "http://127.0.0.1:4873/".into(),
            cache: "/state/.cache/npm".into(),
            allow_scripts: false,
            heap_limit_mib: 384,
        };
        let cmd = npm.command(Path::new("/state/team/one/platform"));
        assert_eq!(
            process::env_of(&cmd, "NODE_OPTIONS").as_deref(),
            Some("--max-old-space-size=384")
        );
        let out = process::Output {
            code: Some(134),
            stdout: String::new(),
            stderr: "<--- Last few GCs --->\nFATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n".into(),
        };
        let error = npm.failed(&out, "@di-framework/platform", "6.0.22");
        assert!(
            matches!(error, NpmError::OutOfMemory { limit_mib: 384, .. }),
            "{error}"
        );
        let text = error.to_string();
        assert!(text.contains("@di-framework/platform@6.0.22"), "{text}");
        assert!(text.contains("384 MiB (--npm-heap-limit)"), "{text}");
        let other = process::Output {
            code: Some(1),
            stdout: r#"{"error":{"code":"E404","summary":"Not Found"}}"#.into(),
            stderr: String::new(),
        };
        assert!(matches!(
            npm.failed(&other, "@di-framework/platform", "6.0.99"),
            NpmError::VersionNotFound { .. }
        ));
    }

    #[test]
    fn the_tree_holds_one_pulumi_sdk() {
        let one = r#"{"lockfileVersion":3,"packages":{"":{},
            "node_modules/@di-framework/platform":{"version":"6.0.22"},
            "node_modules/@pulumi/pulumi":{"version":"3.248.0"}}}"#;
        check_single_sdk(one, "@pulumi/pulumi").expect("one SDK");
        let two = r#"{"lockfileVersion":3,"packages":{"":{},
            "node_modules/@di-framework/platform":{"version":"6.0.22"},
            "node_modules/@di-framework/platform/node_modules/@pulumi/pulumi":{"version":"3.250.0"},
            "node_modules/@pulumi/pulumi":{"version":"3.248.0"}}}"#;
        let e = check_single_sdk(two, "@pulumi/pulumi").expect_err("two SDKs");
        let text = e.to_string();
        assert!(
            text.contains(
                "node_modules/@di-framework/platform brings its own @pulumi/pulumi 3.250.0"
            ),
            "{text}"
        );
        assert!(text.contains("--pulumi-sdk-version=3.250.0"), "{text}");
        let none = r#"{"lockfileVersion":3,"packages":{"":{}}}"#;
        assert!(check_single_sdk(none, "@pulumi/pulumi").is_err());
        assert!(check_single_sdk("not json", "@pulumi/pulumi").is_err());
    }

    #[test]
    fn error_codes_map_onto_errors_with_the_fix() {
        let e404 = r#"{"error":{"code":"E404","summary":"Not Found - GET x","detail":"…"}}"#;
        let e = classify(e404, "@di-framework/platform", "6.0.99", "http://r");
        assert!(matches!(e, NpmError::VersionNotFound { .. }));
        assert!(e.to_string().contains("@di-framework/platform@6.0.99"));
        assert!(e.to_string().contains("spec.version"));
        let target = r#"{"error":{"code":"ETARGET","summary":"No matching version"}}"#;
        assert!(matches!(
            classify(target, "p", "1.0.0", "r"),
            NpmError::VersionNotFound { .. }
        ));
        let refused = r#"{"error":{"code":"ECONNREFUSED","summary":"FetchError"}}"#;
        let e = classify(refused, "p", "1.0.0", "http://127.0.0.1:9");
        assert!(matches!(e, NpmError::Unreachable { .. }));
        assert!(e.to_string().contains("--npm-registry"));
        assert!(matches!(
            classify(r#"{"error":{"code":"EAI_FAIL"}}"#, "p", "1", "r"),
            NpmError::Unreachable { .. }
        ));
        let other = r#"{"error":{"code":"EACCES","summary":"permission denied"}}"#;
        let e = classify(other, "p", "1.0.0", "r");
        assert!(matches!(e, NpmError::Failed { .. }));
        assert!(e.to_string().contains("permission denied"));
        assert!(matches!(
            classify("garbage", "p", "1", "r"),
            NpmError::Failed { .. }
        ));
    }
}
