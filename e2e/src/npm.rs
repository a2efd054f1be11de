//! A real npm registry on loopback (verdaccio, pinned by `e2e/tools/verdaccio/package-lock.json`)
//! serving the STAND-IN `@di-framework/platform` and proxying every other package to the public
//! npm registry.
//!
//! `@di-framework/*` is local only (no uplink) and publishable without real credentials; the
//! stand-in versions are published afresh from `e2e/standin-platform/` on each start, each
//! stamped with its version and behaviour ([`STANDIN_VERSIONS`]). Proxied packages (such as
//! `@pulumi/pulumi` and its dependencies) are kept under [`uplink_cache_dir`], shared by every
//! registry and run, so warm runs do not download them again. Verdaccio logs every request as
//! JSON lines to `<dir>/logs/verdaccio.log`; [`RegistryHandle::tarball_downloads`] counts them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::HarnessError;

/// The npm name of the stand-in package.
pub const STANDIN_PACKAGE: &str = "@di-framework/platform";

/// What a published stand-in version does when the operator runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Deploys every object and reports every output.
    Good,
    /// The create (or update) of the ConfigMap `di-platform/platform-settings` throws a clear error.
    Fail,
    /// The create (or update) of the ConfigMap `di-platform/platform-settings` never settles.
    Hang,
    /// Deploys nothing: tries to reach the cluster the operator runs in (in-cluster variables,
    /// `KUBECONFIG`, `~/.kube/config`) and registers a `kubernetes` resource with no provider.
    Host,
    /// Deploys nothing: `deploy()` allocates memory without bound until node's heap limit stops
    /// it.
    Runaway,
}

impl Behaviour {
    /// The word stamped into the package (`good`, `fail`, `hang`, `host`, `runaway`).
    pub fn as_str(self) -> &'static str {
        match self {
            Behaviour::Good => "good",
            Behaviour::Fail => "fail",
            Behaviour::Hang => "hang",
            Behaviour::Host => "host",
            Behaviour::Runaway => "runaway",
        }
    }
}

/// The stand-in versions [`RegistryHandle::publish_standins`] publishes, with their behaviour.
pub const STANDIN_VERSIONS: [(&str, Behaviour); 6] = [
    ("6.0.21", Behaviour::Good),
    ("6.0.22", Behaviour::Good),
    ("6.0.23", Behaviour::Fail),
    ("6.0.24", Behaviour::Hang),
    ("6.0.25", Behaviour::Host),
    ("6.0.26", Behaviour::Runaway),
];

/// A version of the stand-in that is never published (the "unknown version" case).
pub const UNPUBLISHED_VERSION: &str = "6.0.99";

/// How long [`RegistryHandle::warm_uplinks`] lets npm fetch the stand-in's dependencies from the
/// public registry (a new machine's first fetch, beside CI's other lanes, has taken minutes).
pub const WARM_LIMIT: Duration = Duration::from_secs(20 * 60);

/// The `dependencies` object of the stand-in's `package.json`, as compact JSON.
fn standin_dependencies() -> Result<String, HarnessError> {
    let path = standin_source().join("package.json");
    let text = std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
    let manifest: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| HarnessError::Command {
            what: format!("reading {}", path.display()),
            stderr: e.to_string(),
        })?;
    Ok(manifest["dependencies"].to_string())
}

/// The stand-in package's source folder.
pub fn standin_source() -> PathBuf {
    crate::repo_root().join("e2e/standin-platform")
}

/// Where proxied packages are kept between runs: `<cache>/npm-registry/uplinks`.
pub fn uplink_cache_dir() -> PathBuf {
    crate::tools::cache_dir().join("npm-registry/uplinks")
}

/// What tests need from a running registry; cheap to clone, valid while the registry runs.
#[derive(Debug, Clone)]
pub struct RegistryHandle {
    url: String,
    dir: PathBuf,
    log: PathBuf,
    npmrc: PathBuf,
}

impl RegistryHandle {
    /// The registry's URL, `http://127.0.0.1:<port>/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The registry's port on loopback.
    pub fn port(&self) -> Option<u16> {
        self.url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
    }

    /// The registry's folder (config, storage of the stand-ins, `logs/`, publish staging).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Verdaccio's log: one JSON object a line, one `"req"` line for each request.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// An npm user config with `registry=` this registry and a placeholder token (the registry
    /// lets anyone publish `@di-framework/*`; npm only insists on having some token).
    pub fn npmrc(&self) -> &Path {
        &self.npmrc
    }

    /// The `.npmrc` text a project uses to install from this registry.
    pub fn project_npmrc(&self) -> String {
        format!("registry={}\n", self.url)
    }

    /// Publishes every version of [`STANDIN_VERSIONS`], the good ones last (so `latest` is a
    /// good version).
    pub fn publish_standins(&self) -> Result<(), HarnessError> {
        let mut order: Vec<_> = STANDIN_VERSIONS.to_vec();
        order.sort_by_key(|(_, b)| *b == Behaviour::Good);
        for (version, behaviour) in order {
            self.publish_standin(version, behaviour)?;
        }
        Ok(())
    }

    /// Publishes the stand-in from [`standin_source`] as `version`, stamped with `behaviour`.
    pub fn publish_standin(&self, version: &str, behaviour: Behaviour) -> Result<(), HarnessError> {
        let stage = self.dir.join("publish").join(version);
        if stage.exists() {
            std::fs::remove_dir_all(&stage).map_err(|e| HarnessError::io(&stage, e))?;
        }
        copy_tree(&standin_source(), &stage)?;
        let manifest_path = stage.join("package.json");
        let text = std::fs::read_to_string(&manifest_path)
            .map_err(|e| HarnessError::io(&manifest_path, e))?;
        let mut manifest: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| HarnessError::Command {
                what: format!("reading {}", manifest_path.display()),
                stderr: e.to_string(),
            })?;
        manifest["version"] = serde_json::Value::String(version.to_string());
        write_json(&manifest_path, &manifest)?;
        // `publishedBy` makes every publish a new tarball (a new integrity), so an npm cache kept
        // across runs never serves a stand-in tarball of an earlier registry.
        let published_by = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        write_json(
            &stage.join("stamp.json"),
            &serde_json::json!({
                "version": version,
                "behaviour": behaviour.as_str(),
                "publishedBy": published_by,
            }),
        )?;
        let tag = match behaviour {
            Behaviour::Good => "latest".to_string(),
            other => format!("stand-in-{}", other.as_str()),
        };
        let mut npm = Command::new("npm");
        npm.arg("publish")
            .arg(&stage)
            .args(["--registry", &self.url])
            .arg("--userconfig")
            .arg(&self.npmrc)
            .args(["--tag", &tag, "--access", "public", "--ignore-scripts"])
            .args(["--no-audit", "--no-fund", "--loglevel=warn"])
            .env("npm_config_cache", self.dir.join("npm-cache"))
            .current_dir(&self.dir);
        crate::cmd::run(npm, None)?.ok(&format!("npm publish {STANDIN_PACKAGE}@{version}"))?;
        Ok(())
    }

    /// Fills the shared uplink cache ([`uplink_cache_dir`]) with the stand-in's dependencies
    /// (`@pulumi/pulumi` and its tree, fetched from the public registry through this registry)
    /// before any test runs the operator's installer, so that the first install of a new machine
    /// is timed by what the operator does, not by the public registry: a real `npm install` of
    /// those dependencies, with a fresh npm cache of its own so that every tarball is asked of
    /// this registry, under [`WARM_LIMIT`] rather than a test's `--install-timeout`. Done once
    /// per set of dependencies (a stamp in the uplink cache records it), under a file lock, so
    /// test processes started together fetch once. No stand-in tarball is asked for, so
    /// [`RegistryHandle::tarball_downloads`] counts only what the tests themselves asked for.
    pub fn warm_uplinks(&self) -> Result<(), HarnessError> {
        let dependencies = standin_dependencies()?;
        let uplinks = uplink_cache_dir();
        std::fs::create_dir_all(&uplinks).map_err(|e| HarnessError::io(&uplinks, e))?;
        let lock_path = uplinks.join(".warm.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| HarnessError::io(&lock_path, e))?;
        lock.lock().map_err(|e| HarnessError::io(&lock_path, e))?;
        let stamp = uplinks.join(".warmed");
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s == dependencies) {
            return Ok(());
        }
        let took = self.install_standin_dependencies()?;
        eprintln!(
            "npm registry: the stand-in's dependencies fetched into {} in {took:.0?}",
            uplinks.display()
        );
        std::fs::write(&stamp, &dependencies).map_err(|e| HarnessError::io(&stamp, e))
    }

    /// Installs the stand-in's dependencies (not the stand-in) from this registry into a
    /// scratch folder of its own with an empty npm cache, so that each of their tarballs is asked
    /// of this registry (which fetches what its uplink cache lacks); the folder is removed after.
    /// Returns how long npm ran. [`RegistryHandle::warm_uplinks`] is the once-per-machine call.
    pub fn install_standin_dependencies(&self) -> Result<Duration, HarnessError> {
        let dependencies = standin_dependencies()?;
        let folder = self.dir.join("warm");
        if folder.exists() {
            std::fs::remove_dir_all(&folder).map_err(|e| HarnessError::io(&folder, e))?;
        }
        std::fs::create_dir_all(&folder).map_err(|e| HarnessError::io(&folder, e))?;
        let manifest = format!(
            "{{\"name\": \"warm-uplinks\", \"private\": true, \"dependencies\": {dependencies}}}\n"
        );
        let manifest_path = folder.join("package.json");
        std::fs::write(&manifest_path, manifest)
            .map_err(|e| HarnessError::io(&manifest_path, e))?;
        let log_path = self.dir.join("logs/warm-uplinks.log");
        let log = std::fs::File::create(&log_path).map_err(|e| HarnessError::io(&log_path, e))?;
        let err = log
            .try_clone()
            .map_err(|e| HarnessError::io(&log_path, e))?;
        let mut npm = Command::new("npm");
        npm.arg("install")
            .args(["--registry", &self.url])
            .args([
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=http",
            ])
            .arg(format!("--cache={}", folder.join("npm-cache").display()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .current_dir(&folder);
        crate::process::die_with_parent(&mut npm);
        let started = Instant::now();
        let mut child = npm
            .spawn()
            .map_err(|e| HarnessError::io(Path::new("npm"), e))?;
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| HarnessError::io(Path::new("npm"), e))?
            {
                break status;
            }
            if started.elapsed() > WARM_LIMIT {
                crate::process::terminate(&mut child, Duration::from_secs(5));
                return Err(HarnessError::Timeout {
                    what: format!(
                        "npm install of the stand-in's dependencies through {} (log {})",
                        self.url,
                        log_path.display()
                    ),
                    after: WARM_LIMIT,
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if !status.success() {
            return Err(HarnessError::Command {
                what: format!(
                    "npm install of the stand-in's dependencies through {}",
                    self.url
                ),
                stderr: format!("{status}; its log is {}", log_path.display()),
            });
        }
        let _ = std::fs::remove_dir_all(&folder);
        Ok(started.elapsed())
    }

    /// How many times the tarball of `package@version` was requested (GET) from this registry.
    pub fn tarball_downloads(&self, package: &str, version: &str) -> usize {
        let Ok(text) = std::fs::read_to_string(&self.log) else {
            return 0;
        };
        count_tarball_gets(&text, package, version)
    }
}

/// Counts the `GET` request lines for the tarball of `package@version` in a verdaccio JSON log.
pub fn count_tarball_gets(log: &str, package: &str, version: &str) -> usize {
    let base = package.rsplit('/').next().unwrap_or(package);
    let wanted = format!("/{package}/-/{base}-{version}.tgz");
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["req"]["method"] == "GET")
        .filter_map(|v| v["req"]["url"].as_str().map(decode_slashes))
        .filter(|url| url.split('?').next() == Some(wanted.as_str()))
        .count()
}

fn decode_slashes(url: &str) -> String {
    url.replace("%2f", "/").replace("%2F", "/")
}

/// A running verdaccio. Dropping it stops the process; its folder is left to its owner.
#[derive(Debug)]
pub struct Registry {
    handle: RegistryHandle,
    child: Child,
}

impl Registry {
    /// Installs verdaccio when needed (`e2e/tools/verdaccio/install.sh`), writes a config into
    /// `dir` and starts verdaccio on a free loopback port, waiting until it answers. The stand-in
    /// storage (`dir/storage`) is emptied first; call [`RegistryHandle::publish_standins`] next.
    pub fn start(dir: &Path) -> Result<Self, HarnessError> {
        let verdaccio = install()?;
        for sub in ["logs", "publish"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| HarnessError::io(dir, e))?;
        }
        let dir = std::fs::canonicalize(dir).map_err(|e| HarnessError::io(dir, e))?;
        let storage = dir.join("storage");
        if storage.exists() {
            std::fs::remove_dir_all(&storage).map_err(|e| HarnessError::io(&storage, e))?;
        }
        std::fs::create_dir_all(&storage).map_err(|e| HarnessError::io(&storage, e))?;
        let uplinks = uplink_cache_dir();
        std::fs::create_dir_all(&uplinks).map_err(|e| HarnessError::io(&uplinks, e))?;
        let uplinks = std::fs::canonicalize(&uplinks).map_err(|e| HarnessError::io(&uplinks, e))?;

        let port = crate::control_plane::free_port()?;
        let url = format!("http://127.0.0.1:{port}/");
        let config = dir.join("config.yaml");
        let text = config_yaml(
            &storage,
            &relative(&storage, &uplinks),
            &dir.join("htpasswd"),
        );
        std::fs::write(&config, text).map_err(|e| HarnessError::io(&config, e))?;
        let npmrc = dir.join("npmrc");
        let npmrc_text =
            format!("registry={url}\n//127.0.0.1:{port}/:_authToken=stand-in-no-credentials\n");
        std::fs::write(&npmrc, npmrc_text).map_err(|e| HarnessError::io(&npmrc, e))?;

        let log = dir.join("logs/verdaccio.log");
        let out = std::fs::File::create(&log).map_err(|e| HarnessError::io(&log, e))?;
        let err = out.try_clone().map_err(|e| HarnessError::io(&log, e))?;
        let mut command = Command::new(&verdaccio);
        command
            .arg("--config")
            .arg(&config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .current_dir(&dir);
        crate::process::die_with_parent(&mut command);
        let child = command
            .spawn()
            .map_err(|e| HarnessError::io(&verdaccio, e))?;
        let mut registry = Registry {
            handle: RegistryHandle {
                url,
                dir: dir.clone(),
                log: log.clone(),
                npmrc,
            },
            child,
        };
        if let Err(e) = registry.wait_ready(port, Duration::from_secs(60)) {
            return Err(HarnessError::Start {
                message: format!("verdaccio: {e}"),
                logs: log,
            });
        }
        Ok(registry)
    }

    fn wait_ready(&mut self, port: u16, timeout: Duration) -> Result<(), HarnessError> {
        let start = Instant::now();
        loop {
            if ping(port) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(HarnessError::Exited {
                    name: "verdaccio",
                    status: status.to_string(),
                });
            }
            if start.elapsed() > timeout {
                return Err(HarnessError::Timeout {
                    what: "verdaccio to answer /-/ping".into(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A cloneable handle (URL, folder, log, npmrc).
    pub fn handle(&self) -> &RegistryHandle {
        &self.handle
    }

    /// The registry's URL, `http://127.0.0.1:<port>/`.
    pub fn url(&self) -> &str {
        self.handle.url()
    }

    /// Publishes every stand-in version (see [`RegistryHandle::publish_standins`]).
    pub fn publish_standins(&self) -> Result<(), HarnessError> {
        self.handle.publish_standins()
    }

    /// How many times the tarball of `package@version` was requested (GET) from this registry.
    pub fn tarball_downloads(&self, package: &str, version: &str) -> usize {
        self.handle.tarball_downloads(package, version)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        crate::process::terminate(&mut self.child, Duration::from_secs(5));
    }
}

/// Runs `e2e/tools/verdaccio/install.sh` (a no-op when the pinned install is in the cache) and
/// returns the verdaccio program.
fn install() -> Result<PathBuf, HarnessError> {
    let script = crate::repo_root().join("e2e/tools/verdaccio/install.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    let out = crate::cmd::run(cmd, None)?;
    if !out.success {
        return Err(HarnessError::Tools(format!(
            "{} failed: {}",
            script.display(),
            out.stderr.trim()
        )));
    }
    let program = PathBuf::from(out.stdout.trim());
    if !program.exists() {
        return Err(HarnessError::Tools(format!(
            "{} did not produce {}",
            script.display(),
            program.display()
        )));
    }
    Ok(program)
}

/// Verdaccio's config: `@di-framework/*` local and open, everything else through the uplink,
/// stored at `uplinks` (relative to `storage`, as verdaccio wants per-package storage).
fn config_yaml(storage: &Path, uplinks: &str, htpasswd: &Path) -> String {
    format!(
        r#"# Generated by e2e::npm for the end-to-end tests: serves the STAND-IN @di-framework/platform.
storage: {storage:?}
auth:
  htpasswd:
    file: {htpasswd:?}
    max_users: -1
uplinks:
  npmjs:
    url: https://registry.npmjs.org/
    cache: true
    maxage: 30m
    timeout: 60s
    max_fails: 5
    fail_timeout: 30s
packages:
  '@di-framework/*':
    access: $all
    publish: $all
    unpublish: $all
  '**':
    access: $all
    proxy: npmjs
    storage: {uplinks:?}
web:
  enable: false
max_body_size: 200mb
server:
  keepAliveTimeout: 60
log: {{ type: stdout, format: json, level: http }}
"#,
        storage = storage.display().to_string(),
        htpasswd = htpasswd.display().to_string(),
    )
}

/// The path of `to` relative to `from` (both absolute).
fn relative(from: &Path, to: &Path) -> String {
    let a: Vec<Component> = from.components().collect();
    let b: Vec<Component> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = vec!["..".to_string(); a.len() - common];
    parts.extend(
        b[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// Whether verdaccio answers `GET /-/ping` on `port`.
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /-/ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200")
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), HarnessError> {
    std::fs::create_dir_all(to).map_err(|e| HarnessError::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| HarnessError::io(from, e))? {
        let entry = entry.map_err(|e| HarnessError::io(from, e))?;
        let name = entry.file_name();
        if name == "node_modules" {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| HarnessError::io(&src, e))?;
        }
    }
    Ok(())
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), HarnessError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| HarnessError::Command {
        what: format!("writing {}", path.display()),
        stderr: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(|e| HarnessError::io(path, e))
}

static SHARED: OnceLock<Result<RegistryHandle, String>> = OnceLock::new();

/// One registry per test process, with the stand-ins published and the uplink cache warmed
/// ([`RegistryHandle::warm_uplinks`]), started on first call (blocks
/// while it starts). Its folder is `<e2e base>/npm-registry-<pid>-<ms>` (logs in `logs/`), kept
/// while the process runs and swept by a later process.
pub fn shared() -> Result<RegistryHandle, String> {
    SHARED
        .get_or_init(|| {
            let base = crate::control_plane::base_dir();
            crate::process::sweep_ended(&base, "npm-registry-");
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0);
            let dir = base.join(format!("npm-registry-{}-{stamp}", std::process::id()));
            // verdaccio dies with the thread that spawned it: a keeper thread lives as long as
            // the process.
            crate::process::keep_for_process(
                "npm-registry-keeper",
                move || {
                    let registry = Registry::start(&dir).map_err(|e| e.to_string())?;
                    registry.publish_standins().map_err(|e| e.to_string())?;
                    registry
                        .handle()
                        .warm_uplinks()
                        .map_err(|e| e.to_string())?;
                    eprintln!(
                        "shared npm registry at {} (log {})",
                        registry.url(),
                        registry.handle().log().display()
                    );
                    Ok(registry)
                },
                |registry| registry.handle().clone(),
            )
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_gets_of_that_tarball() {
        let log = [
            r#"{"level":30,"req":{"method":"GET","url":"/@di-framework/platform/-/platform-6.0.21.tgz"}}"#,
            r#"{"level":25,"request":{"method":"GET","url":"/@di-framework/platform/-/platform-6.0.21.tgz"},"status":200}"#,
            r#"{"level":30,"req":{"method":"GET","url":"/@di-framework%2fplatform/-/platform-6.0.21.tgz"}}"#,
            r#"{"level":30,"req":{"method":"GET","url":"/@di-framework/platform/-/platform-6.0.22.tgz"}}"#,
            r#"{"level":30,"req":{"method":"GET","url":"/@di-framework%2fplatform"}}"#,
            r#"{"level":30,"req":{"method":"PUT","url":"/@di-framework%2fplatform"}}"#,
            "not json",
        ]
        .join("\n");
        assert_eq!(
            count_tarball_gets(&log, STANDIN_PACKAGE, "6.0.21"),
            2,
            "{log}"
        );
        assert_eq!(count_tarball_gets(&log, STANDIN_PACKAGE, "6.0.22"), 1);
        assert_eq!(count_tarball_gets(&log, STANDIN_PACKAGE, "6.0.99"), 0);
        assert_eq!(count_tarball_gets(&log, "js-yaml", "4.3.2"), 0);
    }

    #[test]
    fn relative_paths_climb_to_the_common_folder() {
        assert_eq!(
            relative(
                Path::new("/tmp/a/storage"),
                Path::new("/root/.cache/x/uplinks")
            ),
            "../../../root/.cache/x/uplinks"
        );
        assert_eq!(relative(Path::new("/a/b"), Path::new("/a/b")), ".");
    }
}
