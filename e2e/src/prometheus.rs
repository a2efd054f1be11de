//! A real Prometheus server and `promtool` for the monitoring tests (Debian's `prometheus`
//! package, unpacked into the tool cache by `e2e/tools/prometheus.sh` when missing), a
//! certificate for the binaries' secure operations port, and HTTPS scrapes of that port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::Value;

use crate::HarnessError;
use crate::cmd::Outcome;
use crate::control_plane::{free_port, plain_get};

/// The Prometheus and promtool executables.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The server.
    pub prometheus: PathBuf,
    /// The rule and metrics checker.
    pub promtool: PathBuf,
}

impl Tools {
    /// Finds them, running `e2e/tools/prometheus.sh` (which prints their folder, installing
    /// them first when missing).
    pub fn locate() -> Result<Self, HarnessError> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/prometheus.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| HarnessError::io(&script, e))?;
        if !out.status.success() {
            return Err(HarnessError::Tools(format!(
                "{} failed: Prometheus and promtool are not available",
                script.display()
            )));
        }
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(Self {
            prometheus: dir.join("prometheus"),
            promtool: dir.join("promtool"),
        })
    }

    /// Runs `promtool` with `args`, feeding it `stdin`.
    pub fn promtool(&self, args: &[&str], stdin: Option<&str>) -> Result<Outcome, HarnessError> {
        let mut cmd = Command::new(&self.promtool);
        cmd.args(args);
        crate::cmd::run(cmd, stdin)
    }
}

/// A CA and a serving certificate for 127.0.0.1 and localhost, written as `tls.crt` and
/// `tls.key` into `dir` (the layout of a mounted `kubernetes.io/tls` Secret, for
/// `--metrics-cert-dir`). Returns the CA certificate, PEM.
pub fn serving_certificate(dir: &Path) -> Result<String, HarnessError> {
    let pki = |what: &'static str| move |e: rcgen::Error| HarnessError::Pki(format!("{what}: {e}"));
    let ca_key = KeyPair::generate().map_err(pki("CA key"))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki("CA"))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "platform-operator-e2e-metrics-ca",
    );
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(pki("CA certificate"))?;
    let key = KeyPair::generate().map_err(pki("serving key"))?;
    let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .map_err(pki("serving params"))?;
    let cert = params
        .signed_by(&key, &ca)
        .map_err(pki("serving certificate"))?;
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    for (name, text) in [("tls.crt", cert.pem()), ("tls.key", key.serialize_pem())] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| HarnessError::io(&path, e))?;
    }
    let ca_pem = ca.pem();
    let path = dir.join("ca.crt");
    std::fs::write(&path, &ca_pem).map_err(|e| HarnessError::io(&path, e))?;
    Ok(ca_pem)
}

/// GETs `path` from the secure operations port on 127.0.0.1:`port`, verifying it against
/// `ca_pem`, with `token` as bearer token when given; the status and the body.
pub async fn secure_get(
    port: u16,
    ca_pem: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), HarnessError> {
    let mut connection = crate::https::HttpsConnection::connect(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        "127.0.0.1",
        ca_pem,
        &[b"http/1.1"],
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    )
    .await?;
    let (status, body) = connection.get(path, token).await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A ServiceAccount `account` in `namespace` (bound to the chart's ClusterRole
/// `platform-operator-metrics-reader` by the ClusterRoleBinding `<account>-<namespace>` when
/// `reader`; that role must exist) and a token for it from the TokenRequest API.
pub fn scraper_token(
    cluster: &crate::shared::Shared,
    namespace: &str,
    account: &str,
    reader: bool,
) -> Result<String, HarnessError> {
    cluster.kubectl_ok(
        &["-n", namespace, "create", "serviceaccount", account],
        None,
    )?;
    if reader {
        cluster.kubectl_ok(
            &[
                "create",
                "clusterrolebinding",
                &format!("{account}-{namespace}"),
                "--clusterrole=platform-operator-metrics-reader",
                &format!("--serviceaccount={namespace}:{account}"),
            ],
            None,
        )?;
    }
    Ok(cluster
        .kubectl_ok(
            &["-n", namespace, "create", "token", account, "--duration=1h"],
            None,
        )?
        .trim()
        .to_string())
}

/// A Prometheus configuration scraping each `(job, port)` on 127.0.0.1 every second over
/// HTTPS, verifying the certificate against `ca_file`, with the bearer token in `token_file`
/// (as a Prometheus in a cluster reads its ServiceAccount's), and evaluating `rule_files`.
pub fn secure_scrape_config(
    jobs: &[(String, u16)],
    ca_file: &Path,
    token_file: &Path,
    rule_files: &[PathBuf],
) -> String {
    let mut config = String::from(
        "global: { scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s }\n",
    );
    let rules: Vec<String> = rule_files
        .iter()
        .map(|f| format!("{:?}", f.display().to_string()))
        .collect();
    config.push_str(&format!(
        "rule_files: [{}]\nscrape_configs:\n",
        rules.join(", ")
    ));
    for (job, port) in jobs {
        config.push_str(&format!(
            "  - job_name: {job}\n    scheme: https\n    tls_config: {{ ca_file: {ca:?} }}\n    authorization: {{ type: Bearer, credentials_file: {token:?} }}\n    static_configs: [{{ targets: [\"127.0.0.1:{port}\"] }}]\n",
            ca = ca_file.display().to_string(),
            token = token_file.display().to_string(),
        ));
    }
    config
}

/// Percent-encodes `value` for a URL query.
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Prometheus configuration scraping each `(job, address)` (pods' `ip:port`) every second over
/// HTTPS without verifying the certificate (each pod issues its own at start, as with the
/// chart's default `metrics.certSecret`), with the bearer token in `token_file`.
pub fn pod_scrape_config(jobs: &[(String, Vec<String>, PathBuf)]) -> String {
    let mut config = String::from(
        "global: { scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s }\nscrape_configs:\n",
    );
    for (job, targets, token_file) in jobs {
        let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        config.push_str(&format!(
            "  - job_name: {job}\n    scheme: https\n    tls_config: {{ insecure_skip_verify: true }}\n    authorization: {{ type: Bearer, credentials_file: {token:?} }}\n    static_configs: [{{ targets: [{targets}] }}]\n",
            token = token_file.display().to_string(),
            targets = targets.join(", "),
        ));
    }
    config
}

/// A Prometheus server on loopback (the machine's, or a network namespace's); stopped on drop
/// (its log printed if the test fails).
pub struct Server {
    child: Child,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    netns: Option<crate::node_net::NetnsHandle>,
}

impl Server {
    /// Starts `tools.prometheus` with the configuration `config` (YAML), keeping its data and
    /// log in `dir`.
    pub fn start(tools: &Tools, dir: &Path, config: &str) -> Result<Self, HarnessError> {
        Self::start_in(tools, dir, config, None)
    }

    /// As [`Server::start`], inside the network namespace `netns` when given (such as the real
    /// node's, to scrape pods): it listens on that namespace's loopback, and its API is asked
    /// from a thread that enters it.
    pub fn start_in(
        tools: &Tools,
        dir: &Path,
        config: &str,
        netns: Option<&crate::node_net::Netns>,
    ) -> Result<Self, HarnessError> {
        std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).map_err(|e| HarnessError::io(&config_file, e))?;
        let check = tools.promtool(
            &["check", "config", &config_file.display().to_string()],
            None,
        )?;
        check.ok("promtool check config")?;
        let port = free_port()?;
        let log = dir.join("prometheus.log");
        let file = std::fs::File::create(&log).map_err(|e| HarnessError::io(&log, e))?;
        let mut cmd = Command::new(&tools.prometheus);
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-lifecycle")
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| HarnessError::io(&log, e))?)
            .stderr(file);
        crate::process::die_with_parent(&mut cmd);
        if let Some(ns) = netns {
            ns.enter_on_spawn(&mut cmd);
        }
        let child = cmd
            .spawn()
            .map_err(|e| HarnessError::io(&tools.prometheus, e))?;
        let netns = netns
            .map(|ns| ns.handle())
            .transpose()
            .map_err(|e| HarnessError::io(Path::new("/run/netns"), e))?;
        Ok(Self {
            child,
            port,
            log,
            netns,
        })
    }

    /// A plain GET of its `path`, from its network namespace.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let Some(netns) = &self.netns else {
            return plain_get(self.port, path).await;
        };
        netns.plain_get(self.port, path).await
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `/-/ready` answers 200.
    pub async fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = self.get("/-/ready").await {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(HarnessError::Exited {
                    name: "prometheus",
                    status: format!("{status}: {}", self.log_text()),
                });
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout {
                    what: "prometheus to be ready".into(),
                    after: Duration::from_secs(60),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// GETs `path_and_query` from the HTTP API; the JSON answer, whatever its status.
    pub async fn api(&self, path_and_query: &str) -> Result<Value, HarnessError> {
        let (_, text) = self
            .get(path_and_query)
            .await
            .ok_or_else(|| HarnessError::Command {
                what: format!("GET {path_and_query} from prometheus"),
                stderr: "no answer".into(),
            })?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        serde_json::from_str(body).map_err(|e| HarnessError::Command {
            what: format!("GET {path_and_query} from prometheus"),
            stderr: format!("not JSON ({e}): {body}"),
        })
    }

    /// Evaluates the instant query `expr`: its `data.result`, or the error Prometheus gave
    /// (a parse error, for one).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, HarnessError> {
        let answer = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        if answer["status"] != "success" {
            return Err(HarnessError::Command {
                what: format!("query {expr}"),
                stderr: format!("{} {}", answer["errorType"], answer["error"]),
            });
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Waits up to a minute for `expr` to return at least one series; returns them.
    pub async fn series(&self, expr: &str) -> Result<Vec<Value>, HarnessError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let result = self.query(expr).await?;
            if !result.is_empty() {
                return Ok(result);
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout {
                    what: format!("a series for {expr}"),
                    after: Duration::from_secs(60),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The active targets (`/api/v1/targets`).
    pub async fn targets(&self) -> Result<Vec<Value>, HarnessError> {
        let answer = self.api("/api/v1/targets?state=active").await?;
        Ok(answer["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        crate::process::terminate(&mut self.child, Duration::from_secs(10));
        if std::thread::panicking() {
            eprintln!(
                "--- prometheus log {} ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// The folder holding `@kubernetes-models/prometheus-operator` at the version pinned by
/// `e2e/tools/prometheus-operator-models/package-lock.json`, installed with `npm ci` into the tool
/// cache (keyed by a hash of the two files) on first use.
pub fn operator_models() -> Result<PathBuf, HarnessError> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/prometheus-operator-models");
    let mut pinned = Vec::new();
    for name in ["package.json", "package-lock.json"] {
        let path = here.join(name);
        pinned.extend(std::fs::read(&path).map_err(|e| HarnessError::io(&path, e))?);
    }
    let key = ring::digest::digest(&ring::digest::SHA256, &pinned);
    let key: String = key.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tools = crate::tools::cache_dir().join("tools");
    let out = tools.join(format!("prometheus-operator-models-{key}"));
    // One install at a time in this process (tests run in parallel); other processes are kept
    // apart by the folder name and the rename.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if out.join(".complete").exists() {
        return Ok(out);
    }
    // Installed beside the target and renamed, so that no run sees half an install.
    let tmp = tools.join(format!(
        ".prometheus-operator-models-{key}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| HarnessError::io(&tmp, e))?;
    for name in ["package.json", "package-lock.json"] {
        std::fs::copy(here.join(name), tmp.join(name)).map_err(|e| HarnessError::io(&tmp, e))?;
    }
    let mut npm = Command::new("npm");
    npm.current_dir(&tmp).args([
        "ci",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ]);
    crate::cmd::run(npm, None)?.ok("npm ci @kubernetes-models/prometheus-operator")?;
    let done = tmp.join(".complete");
    std::fs::write(&done, "").map_err(|e| HarnessError::io(&done, e))?;
    if std::fs::rename(&tmp, &out).is_err() && !out.join(".complete").exists() {
        return Err(HarnessError::io(
            &out,
            std::io::Error::other("could not place the install"),
        ));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(out)
}

/// Validates Prometheus Operator objects (ServiceMonitor, PodMonitor, PrometheusRule) against
/// the operator's schemas (`e2e/tests/prometheus/validate-monitoring.mjs`): one line per object,
/// and whether all are valid.
pub fn validate_monitoring(objects: &[Value]) -> Result<Outcome, HarnessError> {
    let models = operator_models()?;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/prometheus/validate-monitoring.mjs");
    let mut node = Command::new("node");
    node.arg(&script).arg(&models);
    let input = serde_json::to_string(objects).map_err(|e| HarnessError::Command {
        what: "encoding the objects".into(),
        stderr: e.to_string(),
    })?;
    crate::cmd::run(node, Some(&input))
}

/// Every metric docs/metrics.md lists (the first cell of its table rows).
pub fn documented_metrics() -> Result<Vec<String>, HarnessError> {
    let path = crate::repo_root().join("docs/metrics.md");
    let doc = std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
    Ok(doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("platform_operator_"))
        .map(str::to_string)
        .collect())
}

/// The chart's Grafana dashboard (`files/dashboard.json`).
pub fn dashboard() -> Result<Value, HarnessError> {
    let path = crate::chart::chart_dir().join("files/dashboard.json");
    let text = std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| HarnessError::Command {
        what: format!("reading {}", path.display()),
        stderr: e.to_string(),
    })
}

fn panel_queries(panels: &Value, out: &mut Vec<(String, String)>) {
    for panel in panels.as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            out.push((
                panel["title"].as_str().unwrap_or("?").to_string(),
                // Grafana's built-in interval variable, given a value as Grafana does before it
                // sends the query.
                expr.replace("$__rate_interval", "5m"),
            ));
        }
        panel_queries(&panel["panels"], out);
    }
}

/// `(panel title, PromQL as Grafana sends it)` of every query of every panel of the dashboard,
/// rows' nested panels included.
pub fn dashboard_queries() -> Result<Vec<(String, String)>, HarnessError> {
    let mut out = Vec::new();
    panel_queries(&dashboard()?["panels"], &mut out);
    Ok(out)
}

/// The metric families a `/metrics` body holds (its `# TYPE` lines).
pub fn families(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The metric names an expression names: every identifier starting `platform_operator_`,
/// with a histogram's `_bucket`, `_sum` or `_count` taken off when `families` knows the base.
/// Names inside string literals (label values) are not metric names and are skipped.
pub fn metric_names(expr: &str, families: &[String]) -> Vec<String> {
    // Blank out string literals, keeping offsets.
    let mut quote = None;
    let expr: String = expr
        .chars()
        .map(|c| match quote {
            Some(q) if c == q => {
                quote = None;
                c
            }
            Some(_) => ' ',
            None => {
                if matches!(c, '"' | '\'' | '`') {
                    quote = Some(c);
                }
                c
            }
        })
        .collect();
    let expr = expr.as_str();
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("platform_operator_") {
        let start = i + at;
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
        if start > 0 && ident(bytes[start - 1]) {
            i = start + 1;
            continue;
        }
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        let mut name = expr[start..end].to_string();
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix)
                && families.iter().any(|f| f == base)
            {
                name = base.to_string();
            }
        }
        if !out.contains(&name) {
            out.push(name);
        }
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_from_expressions() {
        let families = vec!["platform_operator_x_seconds".to_string()];
        assert_eq!(
            metric_names(
                "histogram_quantile(0.9, sum by (le) (rate(platform_operator_x_seconds_bucket[5m]))) / platform_operator_y_total{a=\"platform_operator_z\"}",
                &families
            ),
            vec![
                "platform_operator_x_seconds".to_string(),
                "platform_operator_y_total".to_string()
            ]
        );
        assert_eq!(
            metric_names("platform_operator_unknown_count", &families),
            vec!["platform_operator_unknown_count".to_string()]
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(encode("up{a=\"b\"} > 0"), "up%7Ba%3D%22b%22%7D%20%3E%200");
    }
}
