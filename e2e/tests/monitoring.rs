//! Monitoring, with the real `promtool`, `helm` and Prometheus: the alerts pass their
//! `promtool test rules` cases on synthetic series and each has a runbook; every query of the
//! Grafana dashboard parses as PromQL and names only documented metrics (docs/metrics.md, which
//! unit tests tie to the binaries' registries; `chart_install.rs` checks them against a real
//! scrape); the chart's monitoring objects render as the values ask, and the Prometheus
//! Operator's schemas (`@kubernetes-models/prometheus-operator`) accept them; and, on the shared
//! control plane, the secure operations port answers 401, 403 or 200 as the API server decides,
//! caches those answers only for its TTL, and a real Prometheus scrapes it.

use std::collections::BTreeSet;

use e2e::chart::{Helm, Rendered, chart_dir, strings};
use e2e::prometheus::{Tools, metric_names};
use serde_json::{Value, json};

const NS: &str = "platform-operator";
const PASSPHRASE: &str = "passphrase.existingSecret=platform-operator-passphrase";

fn tools() -> Tools {
    Tools::locate().unwrap_or_else(|e| panic!("prometheus tools: {e}"))
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        e2e::control_plane::base_dir().join(format!("monitoring-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn alerts_file() -> std::path::PathBuf {
    chart_dir().join("files/alerts.yaml")
}

fn alerts() -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(alerts_file()).expect("alerts.yaml"))
        .expect("alerts.yaml parses")
}

fn dashboard() -> Value {
    e2e::prometheus::dashboard().unwrap_or_else(|e| panic!("{e}"))
}

fn documented() -> Vec<String> {
    e2e::prometheus::documented_metrics().unwrap_or_else(|e| panic!("{e}"))
}

fn dashboard_queries() -> Vec<(String, String)> {
    e2e::prometheus::dashboard_queries().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_alerts_pass_their_promtool_tests() {
    let tools = tools();
    let file = alerts_file().display().to_string();
    tools
        .promtool(&["check", "rules", &file], None)
        .expect("promtool")
        .ok("promtool check rules alerts.yaml")
        .unwrap_or_else(|e| panic!("{e}"));
    // The test file names the rule file relative to itself; the copy names the chart's.
    let cases =
        std::fs::read_to_string(e2e::repo_root().join("e2e/tests/prometheus/alerts_test.yaml"))
            .expect("alerts_test.yaml");
    let dir = scratch("alerts");
    let test_file = dir.join("alerts_test.yaml");
    std::fs::write(&test_file, format!("rule_files: [{file:?}]\n{cases}")).expect("write");
    let out = tools
        .promtool(&["test", "rules", &test_file.display().to_string()], None)
        .expect("promtool");
    assert!(
        out.success && out.stdout.contains("SUCCESS"),
        "promtool test rules failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    // Every alert is exercised: each name appears in at least one case that expects it to fire.
    let parsed: Value = serde_saphyr::from_str(&cases).expect("cases parse");
    let mut fired = BTreeSet::new();
    for test in parsed["tests"].as_array().into_iter().flatten() {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fired.insert(case["alertname"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    let names: BTreeSet<String> = alert_rules()
        .iter()
        .map(|r| r["alert"].as_str().unwrap_or_default().to_string())
        .collect();
    let untested: Vec<_> = names.difference(&fired).collect();
    assert!(
        untested.is_empty(),
        "alerts never shown firing: {untested:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn alert_rules() -> Vec<Value> {
    alerts()["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn every_alert_has_a_runbook_and_names_only_documented_metrics() {
    let ops = std::fs::read_to_string(e2e::repo_root().join("docs/operations.md"))
        .expect("operations.md");
    let headings: BTreeSet<String> = ops
        .lines()
        .filter_map(|l| l.strip_prefix("### PlatformOperator"))
        .map(|rest| format!("PlatformOperator{}", rest.trim()))
        .collect();
    let documented = documented();
    let rules = alert_rules();
    assert!(rules.len() >= 11, "{rules:?}");
    let mut names = BTreeSet::new();
    for rule in &rules {
        let name = rule["alert"].as_str().expect("an alert rule").to_string();
        assert!(
            ["critical", "warning", "info"]
                .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: {key}"
            );
        }
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        assert!(
            url.ends_with(&format!("docs/operations.md#{}", name.to_lowercase())),
            "{name}: runbook_url {url}"
        );
        assert!(
            headings.contains(&name),
            "{name}: no ### {name} in docs/operations.md"
        );
        let expr = rule["expr"].as_str().unwrap_or_default();
        let used = metric_names(expr, &documented);
        assert!(
            !used.is_empty(),
            "{name} names no metric of the operator: {expr}"
        );
        for metric in used {
            assert!(
                documented.contains(&metric),
                "{name} uses {metric}, which docs/metrics.md does not list"
            );
        }
        names.insert(name);
    }
    let orphans: Vec<_> = headings.difference(&names).collect();
    assert!(orphans.is_empty(), "runbooks without an alert: {orphans:?}");
}

#[test]
fn every_dashboard_query_is_valid_promql_naming_only_documented_metrics() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let documented = documented();
    // Each query as a recording rule, so that promtool's PromQL parser checks it.
    let mut rules = Vec::new();
    for (i, (title, expr)) in queries.iter().enumerate() {
        assert!(
            !expr.contains('$'),
            "{title}: a dashboard variable Grafana would not fill in: {expr}"
        );
        let used = metric_names(expr, &documented);
        assert!(
            !used.is_empty(),
            "{title} names no metric of the operator: {expr}"
        );
        for metric in used {
            assert!(
                documented.contains(&metric),
                "{title} uses {metric}, which docs/metrics.md does not list"
            );
        }
        rules.push(json!({"record": format!("dashboard:query_{i}"), "expr": expr}));
    }
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = scratch("dashboard");
    let path = dir.join("dashboard-rules.json");
    // YAML is a superset of JSON: promtool reads the JSON document as a rule file.
    std::fs::write(&path, serde_json::to_string_pretty(&file).expect("json")).expect("write");
    let out = tools()
        .promtool(&["check", "rules", &path.display().to_string()], None)
        .expect("promtool");
    assert!(
        out.success
            && out
                .stdout
                .contains(&format!("SUCCESS: {} rules found", queries.len())),
        "promtool check rules on the dashboard's queries:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    // A broken query is caught: the check can fail.
    std::fs::write(
        &path,
        r#"{"groups": [{"name": "d", "rules": [{"record": "r", "expr": "sum by (le (rate(x[5m]))"}]}]}"#,
    )
    .expect("write");
    let out = tools()
        .promtool(&["check", "rules", &path.display().to_string()], None)
        .expect("promtool");
    assert!(!out.success, "promtool accepted a broken query");
    let _ = std::fs::remove_dir_all(dir);
    // Grafana's shape: a datasource variable every panel uses, and unique panel ids.
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "platform-operator");
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(panel["id"].as_i64().expect("id")),
            "duplicate id {panel}"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
        }
    }
}

fn render(sets: &[&str]) -> Rendered {
    let mut all = vec![PASSPHRASE];
    all.extend_from_slice(sets);
    Helm::offline()
        .expect("helm")
        .template(NS, &all)
        .unwrap_or_else(|e| panic!("helm template {all:?} failed: {e}"))
}

fn pod_template(r: &Rendered, deployment: &str) -> Value {
    r.get("Deployment", deployment)["spec"]["template"].clone()
}

const DEPLOYMENTS: [(&str, &str, &str); 2] = [
    (
        "controller",
        "platform-operator-controller",
        "platform-operator-controller-metrics",
    ),
    (
        "webhook",
        "platform-operator-webhook",
        "platform-operator-webhook",
    ),
];

#[test]
fn by_default_metrics_are_secure_and_annotated_for_scraping_and_no_monitor_renders() {
    let r = render(&[]);
    let reader = r.get("ClusterRole", "platform-operator-metrics-reader");
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let auth = r.get("ClusterRole", "platform-operator-metrics-auth");
    assert_eq!(
        auth["rules"],
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}
        ])
    );
    let binding = r.get("ClusterRoleBinding", "platform-operator-metrics-auth");
    assert_eq!(binding["roleRef"]["name"], "platform-operator-metrics-auth");
    assert_eq!(
        binding["subjects"],
        json!([
            {"kind": "ServiceAccount", "name": "platform-operator", "namespace": NS},
            {"kind": "ServiceAccount", "name": "platform-operator-webhook", "namespace": NS}
        ])
    );
    for (_, deployment, _) in DEPLOYMENTS {
        let args = r.args(deployment);
        assert!(
            args.contains(&"--metrics-secure=true".to_string()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--metrics-auth-cache-ttl=30s".to_string()),
            "{args:?}"
        );
        assert!(
            !args.iter().any(|a| a.starts_with("--metrics-cert-dir")),
            "{args:?}"
        );
        let template = pod_template(&r, deployment);
        assert_eq!(
            template["metadata"]["annotations"],
            json!({"prometheus.io/scrape": "true", "prometheus.io/port": "8080",
                   "prometheus.io/path": "/metrics", "prometheus.io/scheme": "https"}),
            "{deployment}"
        );
        let c = r.container(deployment);
        assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    }
    for kind in ["ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(
            !r.objects.iter().any(|o| o["kind"] == kind),
            "{kind} rendered by default"
        );
    }
    assert!(r.find("ConfigMap", "platform-operator-dashboard").is_none());
}

#[test]
fn plain_metrics_drop_the_auth_role_and_scrape_over_http() {
    let r = render(&[
        "metrics.secure=false",
        "prometheus.serviceMonitor.enabled=true",
    ]);
    assert!(
        r.find("ClusterRole", "platform-operator-metrics-auth")
            .is_none()
    );
    assert!(
        r.find("ClusterRoleBinding", "platform-operator-metrics-auth")
            .is_none()
    );
    assert!(
        r.find("ClusterRole", "platform-operator-metrics-reader")
            .is_some()
    );
    for (component, deployment, _) in DEPLOYMENTS {
        assert!(
            r.args(deployment)
                .contains(&"--metrics-secure=false".to_string())
        );
        assert_eq!(
            r.container(deployment)["livenessProbe"]["httpGet"]["scheme"],
            "HTTP"
        );
        let monitor = r.get("ServiceMonitor", &format!("platform-operator-{component}"));
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "http");
        assert!(
            endpoint.get("bearerTokenFile").is_none() && endpoint.get("tlsConfig").is_none(),
            "{endpoint}"
        );
    }
}

#[test]
fn service_monitors_rules_and_the_dashboard_render_when_enabled() {
    let r = render(&[
        "prometheus.serviceMonitor.enabled=true",
        "prometheus.serviceMonitor.labels.release=kube-prometheus-stack",
        "prometheus.serviceMonitor.interval=15s",
        "prometheus.prometheusRule.enabled=true",
        "prometheus.prometheusRule.labels.role=alert-rules",
        "dashboard.enabled=true",
        "dashboard.namespace=monitoring",
    ]);
    for (component, deployment, service) in DEPLOYMENTS {
        let monitor = r.get("ServiceMonitor", &format!("platform-operator-{component}"));
        assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(monitor["metadata"]["namespace"], NS);
        assert_eq!(
            monitor["metadata"]["labels"]["release"],
            "kube-prometheus-stack"
        );
        assert_eq!(
            monitor["spec"]["namespaceSelector"],
            json!({"matchNames": [NS]})
        );
        // The selector picks exactly this deployment's Service, and its port exists there.
        let svc = r.get("Service", service);
        let selector = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels");
        for (k, v) in selector {
            assert_eq!(&svc["metadata"]["labels"][k], v, "{service} label {k}");
        }
        for (other_component, _, other) in DEPLOYMENTS {
            if other_component != component {
                let o = r.get("Service", other);
                assert!(
                    selector
                        .iter()
                        .any(|(k, v)| &o["metadata"]["labels"][k] != v),
                    "the {component} monitor also selects {other}"
                );
            }
        }
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .any(|p| p["name"] == "metrics")
        );
        assert_eq!(
            monitor["spec"]["endpoints"],
            json!([{"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "30s",
                    "scheme": "https",
                    "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                    "tlsConfig": {"insecureSkipVerify": true}}])
        );
        // A monitor replaces the annotations.
        assert!(
            pod_template(&r, deployment)["metadata"]
                .get("annotations")
                .is_none()
        );
    }
    // Their shape, by the Prometheus Operator's own schemas.
    let monitoring: Vec<Value> = r
        .objects
        .iter()
        .filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1")
        .cloned()
        .collect();
    assert_eq!(
        monitoring.len(),
        3,
        "two ServiceMonitors and the PrometheusRule"
    );
    let checked = e2e::prometheus::validate_monitoring(&monitoring).expect("validator");
    assert!(checked.success, "{}{}", checked.stdout, checked.stderr);
    // The validator does refuse a wrong shape.
    let mut wrong = r.get("ServiceMonitor", "platform-operator-webhook").clone();
    wrong["spec"]["endpoints"][0]["scheme"] = json!("httpz");
    let refused = e2e::prometheus::validate_monitoring(&[wrong]).expect("validator");
    assert!(
        !refused.success && refused.stdout.contains("scheme"),
        "{}",
        refused.stdout
    );
    let rule = r.get("PrometheusRule", "platform-operator");
    assert_eq!(rule["metadata"]["labels"]["role"], "alert-rules");
    assert_eq!(
        rule["spec"]["groups"],
        alerts()["groups"],
        "the shipped rules are the tested file"
    );
    let cm = r.get("ConfigMap", "platform-operator-dashboard");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value =
        serde_json::from_str(cm["data"]["platform-operator.json"].as_str().expect("json"))
            .expect("the ConfigMap holds JSON");
    assert_eq!(shipped, dashboard());
}

#[test]
fn pod_monitors_and_a_mounted_certificate() {
    let r = render(&[
        "prometheus.podMonitor.enabled=true",
        "metrics.certSecret=operator-metrics-tls",
    ]);
    assert!(!r.objects.iter().any(|o| o["kind"] == "ServiceMonitor"));
    let monitors: Vec<Value> = r
        .objects
        .iter()
        .filter(|o| o["kind"] == "PodMonitor")
        .cloned()
        .collect();
    assert_eq!(monitors.len(), 2);
    let checked = e2e::prometheus::validate_monitoring(&monitors).expect("validator");
    assert!(checked.success, "{}{}", checked.stdout, checked.stderr);
    for (component, deployment, service) in DEPLOYMENTS {
        let monitor = r.get("PodMonitor", &format!("platform-operator-{component}"));
        let template = pod_template(&r, deployment);
        for (k, v) in monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
        {
            assert_eq!(
                &template["metadata"]["labels"][k], v,
                "{deployment} label {k}"
            );
        }
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        assert_eq!(endpoint["port"], "metrics");
        assert_eq!(
            endpoint["tlsConfig"],
            json!({"ca": {"secret": {"name": "operator-metrics-tls", "key": "ca.crt"}},
                   "serverName": format!("{service}.{NS}.svc")})
        );
        let args = r.args(deployment);
        assert!(
            args.contains(&"--metrics-cert-dir=/etc/platform-operator/metrics-tls".to_string()),
            "{args:?}"
        );
        let c = r.container(deployment);
        assert!(
            c["volumeMounts"].as_array().expect("mounts").iter().any(|m| m
                == &json!({"name": "metrics-tls", "mountPath": "/etc/platform-operator/metrics-tls", "readOnly": true})),
            "{deployment}: {}",
            c["volumeMounts"]
        );
        let volumes = template["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .clone();
        let volume = volumes
            .iter()
            .find(|v| v["name"] == "metrics-tls")
            .expect("metrics-tls volume");
        assert_eq!(volume["secret"]["secretName"], "operator-metrics-tls");
        assert_eq!(
            strings(&json!(
                volume["secret"]["items"]
                    .as_array()
                    .expect("items")
                    .iter()
                    .map(|i| i["key"].clone())
                    .collect::<Vec<_>>()
            )),
            ["tls.crt", "tls.key"]
        );
    }
}

#[test]
fn monitoring_values_are_checked() {
    let helm = Helm::offline().expect("helm");
    let fails = |sets: &[&str], says: &str| {
        let mut all = vec![PASSPHRASE];
        all.extend_from_slice(sets);
        match helm.template(NS, &all) {
            Ok(r) => panic!("{sets:?} rendered {:?}", r.names()),
            Err(e) => assert!(e.contains(says), "{sets:?}: {e}"),
        }
    };
    fails(
        &[
            "prometheus.serviceMonitor.enabled=true",
            "prometheus.podMonitor.enabled=true",
        ],
        "prometheus.serviceMonitor.enabled and prometheus.podMonitor.enabled are both true",
    );
    fails(
        &["metrics.secure=false", "metrics.certSecret=x"],
        "metrics.certSecret is set but metrics.secure is false",
    );
    fails(
        &["extraArgs[0]=--metrics-secure=false"],
        "extraArgs sets --metrics-secure",
    );
    fails(
        &["webhook.extraArgs[0]=--metrics-cert-dir=/x"],
        "webhook.extraArgs sets --metrics-cert-dir",
    );
    fails(&["metrics.authCacheTTL=soon"], "authCacheTTL");
    fails(&["prometheus.serviceMonitor.interval=5"], "interval");
    fails(&["dashboard.enabled=yes"], "enabled");
    fails(&["prometheus.prometheusRule.enable=true"], "enable");
}

/// The webhook binary serving its operations port securely (the binaries' default) with a
/// mounted certificate and a short auth cache, against the shared control plane as its admin;
/// stopped on drop.
struct SecureWebhook {
    child: std::process::Child,
    port: u16,
    ca: String,
    log: std::path::PathBuf,
}

impl Drop for SecureWebhook {
    fn drop(&mut self) {
        e2e::process::terminate(&mut self.child, std::time::Duration::from_secs(10));
        if std::thread::panicking() {
            eprintln!(
                "--- webhook log ---\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

impl SecureWebhook {
    async fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        e2e::prometheus::secure_get(self.port, &self.ca, path, token)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }
}

async fn secure_webhook(
    cluster: &e2e::shared::Shared,
    ns: &str,
    dir: &std::path::Path,
    ttl: &str,
) -> SecureWebhook {
    let (_, bin) = e2e::chart::operator_binaries().expect("operator binaries");
    let certs = dir.join("metrics-tls");
    let ca = e2e::prometheus::serving_certificate(&certs).expect("certificate");
    let port = e2e::control_plane::free_port().expect("port");
    let admission = e2e::control_plane::free_port().expect("port");
    let log = dir.join("webhook.log");
    let file = std::fs::File::create(&log).expect("log");
    let mut cmd = std::process::Command::new(bin);
    cmd.env("KUBECONFIG", &cluster.kubeconfig)
        .args(["--namespace", ns])
        .arg(format!("--admission-bind-address=127.0.0.1:{admission}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{port}"))
        .arg(format!("--metrics-cert-dir={}", certs.display()))
        .arg(format!("--metrics-auth-cache-ttl={ttl}"))
        .args(["--extra-san", "127.0.0.1"])
        .arg(format!("--mutating-webhook-configuration=e2e-metrics-{ns}"))
        .arg(format!(
            "--validating-webhook-configuration=e2e-metrics-{ns}"
        ))
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file);
    e2e::process::die_with_parent(&mut cmd);
    let webhook = SecureWebhook {
        child: cmd.spawn().expect("webhook starts"),
        port,
        ca,
        log,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !matches!(
        e2e::prometheus::secure_get(port, &webhook.ca, "/healthz", None).await,
        Ok((200, _))
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "the webhook's secure port did not answer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    webhook
}

#[tokio::test]
async fn the_secure_port_answers_only_authorized_scrapers_and_a_real_prometheus_scrapes_it() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    cluster.install_crd().expect("CRD");
    let ns = cluster.create_namespace("metrics", &[]).expect("namespace");
    let dir = scratch("secure");
    // The chart's ClusterRole for scrapers, as the chart renders it.
    let reader_role = render(&[]);
    let role =
        serde_json::to_string(reader_role.get("ClusterRole", "platform-operator-metrics-reader"))
            .expect("json");
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&role))
        .expect("the metrics-reader ClusterRole");
    let webhook = secure_webhook(&cluster, &ns, &dir, "3s").await;

    let reader = e2e::prometheus::scraper_token(&cluster, &ns, "reader", true).expect("token");
    let nobody = e2e::prometheus::scraper_token(&cluster, &ns, "nobody", false).expect("token");
    let (status, body) = webhook.get("/metrics", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(webhook.get("/metrics", Some("not-a-token")).await.0, 401);
    let (status, body) = webhook.get("/metrics", Some(&nobody)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("platform-operator-metrics-reader"), "{body}");
    let (status, body) = webhook.get("/metrics", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("platform_operator_build_info{binary=\"webhook\""),
        "{body}"
    );
    // The probes' paths stay open.
    assert_eq!(webhook.get("/healthz", None).await.0, 200);

    // The answers are cached per token for the TTL, then asked again: a revoked binding is
    // refused once the TTL has passed.
    let revoked = e2e::prometheus::scraper_token(&cluster, &ns, "revoked", true).expect("token");
    assert_eq!(webhook.get("/metrics", Some(&revoked)).await.0, 200);
    cluster
        .kubectl_ok(
            &["delete", "clusterrolebinding", &format!("revoked-{ns}")],
            None,
        )
        .expect("delete the binding");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let status = webhook.get("/metrics", Some(&revoked)).await.0;
        if status == 403 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            std::time::Instant::now() < deadline,
            "the revoked token is still allowed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }

    // A real Prometheus scrapes it over HTTPS, verifying the certificate, with the reader's token.
    let tools = tools();
    let token_file = dir.join("token");
    std::fs::write(&token_file, &reader).expect("token file");
    let config = e2e::prometheus::secure_scrape_config(
        &[("platform-operator-webhook".to_string(), webhook.port)],
        &dir.join("metrics-tls/ca.crt"),
        &token_file,
        &[],
    );
    let mut prometheus = e2e::prometheus::Server::start(&tools, &dir.join("prometheus"), &config)
        .expect("prometheus");
    prometheus.wait_ready().await.expect("ready");
    let found = prometheus
        .series(r#"platform_operator_build_info{binary="webhook"} == 1"#)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", prometheus.log_text()));
    assert_eq!(
        found[0]["metric"]["job"], "platform-operator-webhook",
        "{found:?}"
    );
    assert_eq!(
        found[0]["metric"]["instance"],
        format!("127.0.0.1:{}", webhook.port)
    );
    let targets = prometheus.targets().await.expect("targets");
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0]["health"], "up", "{:?}", targets[0]);
    // ... and promtool's linter accepts what it scraped.
    let out = tools
        .promtool(&["check", "metrics"], Some(&body))
        .expect("promtool");
    assert!(out.success, "{}{}", out.stdout, out.stderr);

    // A scraper whose token is refused is a target that is down, with the reason.
    std::fs::write(&token_file, &nobody).expect("token file");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let targets = prometheus.targets().await.expect("targets");
        if targets[0]["health"] == "down" {
            assert!(
                targets[0]["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("403")),
                "{:?}",
                targets[0]
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still up: {:?}",
            targets[0]
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    drop(prometheus);
    drop(webhook);
    let _ = cluster.kubectl_ok(
        &["delete", "clusterrolebinding", &format!("reader-{ns}")],
        None,
    );
    let _ = std::fs::remove_dir_all(dir);
}
