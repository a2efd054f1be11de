//! The Helm chart offline, with the real helm binary: `helm lint --strict`, what `helm template`
//! renders for the defaults and for every value changed (each seed value reaches its flag), the
//! Pod Security `restricted` settings, both RBAC modes, the pods' NetworkPolicies, the webhook
//! configurations' shape, every schema and cross-value rule with a wrong value and its message,
//! the offline passphrase rule, vendoring Headlamp (with a **stand-in** Headlamp chart: the
//! upstream one cannot be fetched here), and that docs/chart.md lists exactly the values in
//! values.yaml.

use std::collections::BTreeSet;
use std::path::Path;

use e2e::chart::{Helm, Rendered, TEST_DIGEST, chart_dir, strings};
use serde_json::{Value, json};

const NS: &str = "platform-operator";
const PASSPHRASE: &str = "passphrase.existingSecret=platform-operator-passphrase";

fn helm() -> Helm {
    Helm::offline().unwrap_or_else(|e| panic!("helm: {e}"))
}

/// Renders offline with the passphrase Secret named (as offline renders must) plus `sets`.
fn render(sets: &[&str]) -> Rendered {
    let mut all = vec![PASSPHRASE];
    all.extend_from_slice(sets);
    helm()
        .template(NS, &all)
        .unwrap_or_else(|e| panic!("helm template {all:?} failed: {e}"))
}

/// Renders offline expecting failure; returns helm's standard error.
fn render_err(sets: &[&str]) -> String {
    match helm().template(NS, sets) {
        Ok(r) => panic!("helm template {sets:?} rendered {:?}", r.names()),
        Err(e) => e,
    }
}

fn env(container: &Value, name: &str) -> Value {
    container["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

fn volume<'a>(rendered: &'a Rendered, deployment: &str, name: &str) -> &'a Value {
    rendered.get("Deployment", deployment)["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("volume {name} of {deployment}"))
}

fn mount_path(container: &Value, name: &str) -> String {
    container["volumeMounts"]
        .as_array()
        .and_then(|v| v.iter().find(|m| m["name"] == name))
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("mount {name}"))
        .to_string()
}

#[test]
fn the_chart_lints_strictly_and_needs_no_network_for_its_dependencies() {
    let helm = helm();
    let chart = chart_dir().display().to_string();
    for extra in [&[][..], &["--set", PASSPHRASE][..]] {
        let mut args = vec!["lint", "--strict", "--with-subcharts", &chart];
        args.extend_from_slice(extra);
        let out = helm.run(&args).expect("helm lint runs");
        assert!(
            out.success && out.stdout.contains("3 chart(s) linted, 0 chart(s) failed"),
            "{}\n{}",
            out.stdout,
            out.stderr
        );
        assert!(
            !out.stdout.contains("[WARNING]") && !out.stdout.contains("[ERROR]"),
            "{}",
            out.stdout
        );
    }
    let list = helm
        .ok(&["dependency", "list", &chart])
        .expect("dependency list");
    for sub in ["controller", "webhook"] {
        assert!(
            list.lines()
                .any(|l| l.starts_with(sub) && l.contains("6.0.22") && l.contains("unpacked")),
            "{list}"
        );
    }
    // `helm dependency build` works offline on a copy (it must not try to download anything).
    let copy = scratch("dependency-build");
    copy_dir(&chart_dir(), &copy.join("platform-operator"));
    let copied = copy.join("platform-operator").display().to_string();
    helm.ok(&["dependency", "build", &copied])
        .expect("dependency build offline");
    let _ = std::fs::remove_dir_all(copy);
}

#[test]
fn the_defaults_reach_their_flags() {
    let r = render(&[]);
    assert_eq!(
        r.args("platform-operator-controller"),
        [
            "--leader-elect=true",
            "--storage-root-base=/var/lib/kubesolo/instances",
            "--install-timeout=30m",
            "--repair-interval=30m",
            "--target-poll=10s",
            "--max-concurrent-installs=2",
            "--max-retries=5",
            "--cleanup-image=ghcr.io/di-framework/platform-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "--npm-registry=https://registry.npmjs.org/",
            "--npm-allow-scripts=false",
            "--pulumi-sdk-version=3.248.0",
            "--pod-security-standard=baseline",
            "--install-image=ghcr.io/di-framework/platform-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "--install-state-claim=platform-operator-state",
            r#"--install-pod-resources={"limits":{"ephemeral-storage":"6Gi","memory":"2Gi"},"requests":{"cpu":"100m","ephemeral-storage":"1Gi","memory":"256Mi"}}"#,
            "--state-dir=/var/lib/platform-operator/state",
            "--passphrase-file=/etc/platform-operator/passphrase/passphrase",
            "--metrics-bind-address=0.0.0.0:8080",
            "--metrics-secure=true",
            "--metrics-auth-cache-ttl=30s",
        ],
        "no --cleanup-namespace or --npm-registry-file unless set; the cleanup Jobs and the install pods run the operator's own image, the install pods on the state claim"
    );
    let controller = r.container("platform-operator-controller");
    // Install pods run on the controller's node (the claim is ReadWriteOnce), under an account
    // with no permissions whose token is never mounted.
    assert_eq!(
        env(controller, "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let account = r.get("ServiceAccount", "platform-operator-install");
    assert_eq!(account["automountServiceAccountToken"], false);
    let bound: Vec<_> = r
        .objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
        .filter(|o| {
            o["subjects"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["name"] == "platform-operator-install"))
        })
        .map(|o| o["metadata"]["name"].clone())
        .collect();
    assert!(
        bound.is_empty(),
        "the install pods' account is bound: {bound:?}"
    );
    assert!(
        controller["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().all(|m| m["name"] != "npm-registry")),
        "no registry Secret is mounted unless named"
    );
    assert_eq!(
        controller["image"],
        "ghcr.io/di-framework/platform-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
    );
    assert_eq!(controller["command"], json!(["/usr/local/bin/controller"]));
    assert_eq!(
        controller["resources"],
        json!({"requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"},
               "limits": {"memory": "2Gi", "ephemeral-storage": "6Gi"}})
    );
    let deployment = r.get("Deployment", "platform-operator-controller");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"], "platform-operator",
        "the operator's user is system:serviceaccount:<ns>:platform-operator"
    );
    // The state claim the chart creates (the default class: no storageClassName) and keeps.
    let claim = r.get("PersistentVolumeClaim", "platform-operator-state");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert!(claim["spec"].get("storageClassName").is_none());
    assert_eq!(
        claim["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(
        volume(&r, "platform-operator-controller", "state")["persistentVolumeClaim"]["claimName"],
        "platform-operator-state"
    );
    // The passphrase named by passphrase.existingSecret is mounted at --passphrase-file.
    assert_eq!(
        volume(&r, "platform-operator-controller", "passphrase")["secret"]["secretName"],
        "platform-operator-passphrase"
    );
    assert!(
        r.find("Secret", "platform-operator-passphrase").is_none(),
        "with existingSecret the chart creates no Secret"
    );
    assert_eq!(
        mount_path(controller, "passphrase"),
        "/etc/platform-operator/passphrase"
    );
    assert_eq!(
        mount_path(controller, "state"),
        "/var/lib/platform-operator/state"
    );
    // HOME and /tmp on emptyDirs with the seed's limits.
    assert_eq!(env(controller, "HOME")["value"], "/home/platform-operator");
    assert_eq!(mount_path(controller, "home"), "/home/platform-operator");
    assert_eq!(mount_path(controller, "tmp"), "/tmp");
    assert_eq!(
        volume(&r, "platform-operator-controller", "home")["emptyDir"]["sizeLimit"],
        "4Gi"
    );
    assert_eq!(
        volume(&r, "platform-operator-controller", "tmp")["emptyDir"]["sizeLimit"],
        "1Gi"
    );
    // The webhook.
    assert_eq!(
        r.args("platform-operator-webhook"),
        [
            "--cert-lifetime=8760h",
            "--service-name=platform-operator-webhook",
            "--mutating-webhook-configuration=platform-operator",
            "--validating-webhook-configuration=platform-operator",
            "--admission-bind-address=0.0.0.0:9443",
            "--metrics-bind-address=0.0.0.0:8080",
            "--metrics-secure=true",
            "--metrics-auth-cache-ttl=30s",
        ]
    );
    assert_eq!(
        r.get("Deployment", "platform-operator-webhook")["spec"]["replicas"],
        1
    );
    assert!(r.find("Deployment", "headlamp").is_none());
}

#[test]
fn every_value_reaches_its_flag() {
    let r = render(&[
        "image.repository=registry.example/team/operator",
        &format!("image.digest={TEST_DIGEST}"),
        "image.pullPolicy=Always",
        "replicaCount=3",
        "leaderElect=true",
        "storageRootBase=/srv/instances",
        "installTimeout=45m",
        "repairInterval=1h30m",
        "targetPoll=5s",
        "maxConcurrentInstalls=4",
        "maxRetries=0",
        "cleanupNamespace=storage-cleanup",
        "npmRegistry=http://npm.internal:4873/",
        "npmRegistrySecret.name=npm-mirror",
        "npmRegistrySecret.key=mirror-url",
        "npmAllowScripts=true",
        "pulumiSdkVersion=3.250.0",
        "podSecurityStandard=restricted",
        "extraArgs={--log-level=debug,--program-heap-limit=1536}",
        "installPod.resources.requests.cpu=50m",
        "installPod.resources.limits.memory=3Gi",
        &format!("cleanupImage=mirror.example/operator@{TEST_DIGEST}"),
        "extraEnv[0].name=HTTPS_PROXY",
        "extraEnv[0].value=http://proxy.internal:3128",
        "extraEnv[1].name=NODE_EXTRA_CA_CERTS",
        "extraEnv[1].value=/etc/ssl/site/ca.pem",
        "state.size=25Gi",
        "state.storageClassName=fast-local",
        "resources.requests.cpu=250m",
        "resources.limits.memory=3Gi",
        "emptyDirSizeLimit.home=8Gi",
        "emptyDirSizeLimit.tmp=2Gi",
        "webhook.replicas=2",
        "webhook.failurePolicy=Ignore",
        "webhook.timeoutSeconds=12",
        "webhook.certLifetime=720h",
        "webhook.extraArgs={--log-format=json}",
        "webhook.resources.limits.memory=512Mi",
    ]);
    assert_eq!(
        r.args("platform-operator-controller"),
        [
            "--leader-elect=true",
            "--storage-root-base=/srv/instances",
            "--install-timeout=45m",
            "--repair-interval=1h30m",
            "--target-poll=5s",
            "--max-concurrent-installs=4",
            "--max-retries=0",
            "--cleanup-namespace=storage-cleanup",
            &format!("--cleanup-image=mirror.example/operator@{TEST_DIGEST}"),
            "--npm-registry=http://npm.internal:4873/",
            "--npm-registry-file=/etc/platform-operator/npm-registry/url",
            "--npm-allow-scripts=true",
            "--pulumi-sdk-version=3.250.0",
            "--pod-security-standard=restricted",
            &format!("--install-image=registry.example/team/operator@{TEST_DIGEST}"),
            "--install-state-claim=platform-operator-state",
            r#"--install-pod-resources={"limits":{"ephemeral-storage":"6Gi","memory":"3Gi"},"requests":{"cpu":"50m","ephemeral-storage":"1Gi","memory":"256Mi"}}"#,
            "--state-dir=/var/lib/platform-operator/state",
            "--passphrase-file=/etc/platform-operator/passphrase/passphrase",
            "--metrics-bind-address=0.0.0.0:8080",
            "--metrics-secure=true",
            "--metrics-auth-cache-ttl=30s",
            "--log-level=debug",
            "--program-heap-limit=1536",
        ]
    );
    let controller = r.container("platform-operator-controller");
    // extraEnv: proxy and CA bundle reach the controller (and the tools it runs), after the
    // chart's own variables.
    assert_eq!(
        env(controller, "HTTPS_PROXY")["value"],
        "http://proxy.internal:3128"
    );
    assert_eq!(
        env(controller, "NODE_EXTRA_CA_CERTS")["value"],
        "/etc/ssl/site/ca.pem"
    );
    assert_eq!(env(controller, "HOME")["value"], "/home/platform-operator");
    let image = format!("registry.example/team/operator@{TEST_DIGEST}");
    assert_eq!(controller["image"], image.as_str());
    assert_eq!(controller["imagePullPolicy"], "Always");
    assert_eq!(controller["resources"]["requests"]["cpu"], "250m");
    assert_eq!(controller["resources"]["limits"]["memory"], "3Gi");
    assert_eq!(
        r.get("Deployment", "platform-operator-controller")["spec"]["replicas"],
        3
    );
    let claim = r.get("PersistentVolumeClaim", "platform-operator-state");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "25Gi");
    assert_eq!(claim["spec"]["storageClassName"], "fast-local");
    assert_eq!(
        volume(&r, "platform-operator-controller", "home")["emptyDir"]["sizeLimit"],
        "8Gi"
    );
    let registry = volume(&r, "platform-operator-controller", "npm-registry");
    assert_eq!(registry["secret"]["secretName"], "npm-mirror");
    assert_eq!(
        registry["secret"]["items"],
        serde_json::json!([{"key": "mirror-url", "path": "url"}])
    );
    assert_eq!(
        mount_path(controller, "npm-registry"),
        "/etc/platform-operator/npm-registry"
    );
    assert_eq!(
        volume(&r, "platform-operator-controller", "tmp")["emptyDir"]["sizeLimit"],
        "2Gi"
    );
    let webhook = r.container("platform-operator-webhook");
    assert_eq!(webhook["image"], image.as_str());
    assert_eq!(webhook["resources"]["limits"]["memory"], "512Mi");
    let args = r.args("platform-operator-webhook");
    assert!(
        args.contains(&"--cert-lifetime=720h".to_string()),
        "{args:?}"
    );
    assert_eq!(args.last().map(String::as_str), Some("--log-format=json"));
    assert_eq!(
        r.get("Deployment", "platform-operator-webhook")["spec"]["replicas"],
        2
    );
    let validating = r.get("ValidatingWebhookConfiguration", "platform-operator");
    assert_eq!(validating["webhooks"][0]["failurePolicy"], "Ignore");
    assert_eq!(validating["webhooks"][0]["timeoutSeconds"], 12);
    let mutating = r.get("MutatingWebhookConfiguration", "platform-operator");
    assert_eq!(mutating["webhooks"][0]["timeoutSeconds"], 12);
    assert_eq!(
        mutating["webhooks"][0]["failurePolicy"], "Ignore",
        "the mutating webhook is always Ignore"
    );
    // The cleanup Jobs' Role follows cleanupNamespace.
    let r = render(&[
        "rbac.clusterAdmin=false",
        "cleanupNamespace=storage-cleanup",
    ]);
    assert_eq!(
        r.get("Role", "platform-operator-cleanup")["metadata"]["namespace"],
        "storage-cleanup"
    );
}

#[test]
fn an_existing_claim_and_secret_are_used_and_nothing_is_created_for_them() {
    let r = render(&[
        "state.existingClaim=my-state",
        "passphrase.existingSecret=my-passphrase",
    ]);
    assert!(
        r.find("PersistentVolumeClaim", "platform-operator-state")
            .is_none()
    );
    assert!(r.find("Secret", "platform-operator-passphrase").is_none());
    assert_eq!(
        volume(&r, "platform-operator-controller", "state")["persistentVolumeClaim"]["claimName"],
        "my-state"
    );
    let passphrase = volume(&r, "platform-operator-controller", "passphrase");
    assert_eq!(passphrase["secret"]["secretName"], "my-passphrase");
    assert_eq!(
        passphrase["secret"]["items"],
        json!([{"key": "passphrase", "path": "passphrase"}])
    );
}

#[test]
fn both_pods_meet_pod_security_restricted() {
    let r = render(&[]);
    for (deployment, ports) in [
        ("platform-operator-controller", vec![("metrics", 8080)]),
        (
            "platform-operator-webhook",
            vec![("admission", 9443), ("metrics", 8080)],
        ),
    ] {
        let pod = &r.get("Deployment", deployment)["spec"]["template"]["spec"];
        assert_eq!(
            pod["securityContext"],
            json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                   "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}),
            "{deployment}"
        );
        let c = &pod["containers"][0];
        assert_eq!(
            c["securityContext"],
            json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
                   "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                   "privileged": false, "capabilities": {"drop": ["ALL"]},
                   "seccompProfile": {"type": "RuntimeDefault"}}),
            "{deployment}"
        );
        assert_eq!(
            c["livenessProbe"]["httpGet"],
            json!({"path": "/healthz", "port": "metrics", "scheme": "HTTPS"})
        );
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"path": "/readyz", "port": "metrics", "scheme": "HTTPS"})
        );
        for (name, port) in ports {
            assert!(
                c["ports"].as_array().is_some_and(|p| p
                    .iter()
                    .any(|p| p["name"] == name && p["containerPort"] == port)),
                "{deployment} port {name}"
            );
        }
        assert_eq!(
            env(c, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
        // Only volume types the restricted profile allows.
        for v in pod["volumes"].as_array().cloned().unwrap_or_default() {
            assert!(
                v.get("emptyDir").is_some()
                    || v.get("secret").is_some()
                    || v.get("persistentVolumeClaim").is_some(),
                "{v}"
            );
        }
    }
    // Services: the webhook's TLS port and metrics; the controller's metrics.
    let svc = r.get("Service", "platform-operator-webhook");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "https", "port": 443, "targetPort": "admission", "protocol": "TCP"},
               {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}])
    );
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/component"],
        "webhook"
    );
    let svc = r.get("Service", "platform-operator-controller-metrics");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}])
    );
}

#[test]
fn rbac_binds_cluster_admin_or_the_platform_operator_cluster_role() {
    // Default: cluster-admin.
    let r = render(&[]);
    let binding = r.get("ClusterRoleBinding", "platform-operator-cluster-admin");
    assert_eq!(binding["roleRef"]["name"], "cluster-admin");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "platform-operator", "namespace": NS}])
    );
    assert!(r.find("ClusterRoleBinding", "platform-operator").is_none());
    assert!(
        r.find("ClusterRole", "platform-operator").is_some(),
        "the ClusterRole is always there, named platform-operator"
    );
    // rbac.clusterAdmin=false: the ClusterRole platform-operator, a Role for the Lease and one for
    // the cleanup Jobs; no cluster-admin anywhere.
    let r = render(&[
        "rbac.clusterAdmin=false",
        "rbac.extraRules[0].apiGroups={policy}",
        "rbac.extraRules[0].resources={poddisruptionbudgets}",
        "rbac.extraRules[0].verbs={get,create}",
    ]);
    assert!(
        r.find("ClusterRoleBinding", "platform-operator-cluster-admin")
            .is_none()
    );
    let binding = r.get("ClusterRoleBinding", "platform-operator");
    assert_eq!(binding["roleRef"]["name"], "platform-operator");
    assert_eq!(binding["subjects"][0]["name"], "platform-operator");
    let rules = r.get("ClusterRole", "platform-operator")["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !rules
            .iter()
            .any(|r| strings(&r["verbs"]).contains(&"*".to_string()))
    );
    assert!(
        !rules
            .iter()
            .any(|r| strings(&r["resources"]).contains(&"*".to_string()))
    );
    assert!(
        rules.contains(
            &json!({"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "patch"]})
        ),
        "Retain sets the host namespace's volumes to Retain"
    );
    assert_eq!(
        rules.last(),
        Some(
            &json!({"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create"]})
        ),
        "rbac.extraRules is appended"
    );
    let lease = r.get("Role", "platform-operator");
    assert_eq!(lease["metadata"]["namespace"], NS);
    assert_eq!(lease["rules"][0]["resources"], json!(["leases"]));
    assert_eq!(
        lease["rules"][1],
        json!({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete"]}),
        "the install Jobs, in the release namespace only"
    );
    let cleanup = r.get("Role", "platform-operator-cleanup");
    assert_eq!(
        cleanup["metadata"]["namespace"], NS,
        "the release namespace by default"
    );
    assert_eq!(cleanup["rules"][0]["resources"], json!(["jobs"]));
    for name in ["platform-operator", "platform-operator-cleanup"] {
        assert_eq!(
            r.get("RoleBinding", name)["subjects"][0]["name"],
            "platform-operator"
        );
    }
    // The webhook has its own account and role whatever rbac.clusterAdmin says.
    for r in [render(&[]), r] {
        assert_eq!(
            r.get("ClusterRoleBinding", "platform-operator-webhook")["subjects"][0]["name"],
            "platform-operator-webhook"
        );
        let rules = r.get("ClusterRole", "platform-operator-webhook")["rules"].clone();
        let configs = rules
            .as_array()
            .and_then(|r| {
                r.iter().find(|r| {
                    strings(&r["resources"]).contains(&"mutatingwebhookconfigurations".into())
                })
            })
            .cloned()
            .unwrap_or_default();
        assert_eq!(configs["resourceNames"], json!(["platform-operator"]));
        // Least privilege: no Secret read cluster-wide; in the release namespace only its own
        // certificate Secret by name (create cannot be limited by name).
        assert!(
            rules
                .as_array()
                .into_iter()
                .flatten()
                .all(|rule| !strings(&rule["resources"]).contains(&"secrets".into())),
            "the webhook's ClusterRole grants nothing on Secrets: {rules}"
        );
        for rule in r.get("Role", "platform-operator-webhook")["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            if strings(&rule["verbs"]) != ["create"] {
                assert_eq!(
                    rule["resourceNames"],
                    json!(["platform-operator-webhook-tls"]),
                    "{rule}"
                );
            }
        }
        assert_eq!(
            r.get("Deployment", "platform-operator-webhook")["spec"]["template"]["spec"]["serviceAccountName"],
            "platform-operator-webhook"
        );
    }
}

#[test]
fn each_pod_has_a_network_policy_admitting_only_the_ports_it_serves() {
    let policy_ports = |r: &Rendered, name: &str| -> Vec<(u64, Value)> {
        let policy = r.get("NetworkPolicy", name);
        assert_eq!(
            policy["spec"]["podSelector"]["matchLabels"],
            r.get("Deployment", name)["spec"]["selector"]["matchLabels"],
            "{name}: the policy selects the Deployment's pods"
        );
        assert_eq!(
            policy["spec"]["policyTypes"],
            json!(["Ingress"]),
            "{name}: egress is not restricted"
        );
        let mut ports = Vec::new();
        for rule in policy["spec"]["ingress"].as_array().expect("ingress rules") {
            for port in rule["ports"].as_array().expect("ports") {
                assert_eq!(port["protocol"], "TCP");
                ports.push((
                    port["port"].as_u64().expect("a port number"),
                    rule["from"].clone(),
                ));
            }
        }
        ports.sort_by_key(|(p, _)| *p);
        ports
    };
    let served = |r: &Rendered, name: &str| -> Vec<u64> {
        let mut ports: Vec<u64> = r.container(name)["ports"]
            .as_array()
            .expect("container ports")
            .iter()
            .filter_map(|p| p["containerPort"].as_u64())
            .collect();
        ports.sort();
        ports
    };
    // By default: every port the pods serve, from anywhere (no `from`), so any Prometheus and
    // the API server (whose address no selector names) still get through; nothing else.
    let r = render(&[]);
    assert_eq!(
        policy_ports(&r, "platform-operator-controller"),
        vec![(8080, Value::Null)]
    );
    assert_eq!(
        policy_ports(&r, "platform-operator-webhook"),
        vec![(8080, Value::Null), (9443, Value::Null)]
    );
    for name in ["platform-operator-controller", "platform-operator-webhook"] {
        let admitted: Vec<u64> = policy_ports(&r, name).iter().map(|(p, _)| *p).collect();
        assert_eq!(
            admitted,
            served(&r, name),
            "{name}: the ports its container serves"
        );
    }
    // metricsFrom narrows the operations port of both pods; the admission port stays open.
    let r = render(&[
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
        "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
        "networkPolicy.metricsFrom[1].ipBlock.cidr=10.0.0.0/8",
    ]);
    let from = json!([
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}}
        },
        {"ipBlock": {"cidr": "10.0.0.0/8"}}
    ]);
    assert_eq!(
        policy_ports(&r, "platform-operator-controller"),
        vec![(8080, from.clone())]
    );
    assert_eq!(
        policy_ports(&r, "platform-operator-webhook"),
        vec![(8080, from), (9443, Value::Null)]
    );
    // Off: no policy at all.
    let r = render(&["networkPolicy.enabled=false"]);
    assert!(
        !r.names().iter().any(|n| n.starts_with("NetworkPolicy/")),
        "{:?}",
        r.names()
    );
}

/// The configurations the webhook expects (docs/webhook.md; `e2e::webhook::configurations_in` is
/// the tests' and the demo's copy) without what differs by design: names, clientConfig and, with
/// `selector: false`, the namespaceSelector of the tests' copy.
fn comparable(config: &Value, selector: bool) -> Value {
    let mut webhooks = config["webhooks"].clone();
    for w in webhooks.as_array_mut().into_iter().flatten() {
        if let Some(w) = w.as_object_mut() {
            w.remove("clientConfig");
            if !selector {
                w.remove("namespaceSelector");
            }
        }
    }
    json!({"kind": config["kind"], "webhooks": webhooks})
}

#[test]
fn the_webhook_configurations_have_the_expected_shape_and_no_ca_bundle() {
    use e2e::webhook::{Scope, configurations_in};
    let r = render(&[]);
    let copy = |scope, kind: &str| {
        Rendered::parse(&configurations_in("x", 1, scope))
            .expect("expected YAML")
            .objects
            .iter()
            .find(|o| o["kind"] == kind)
            .cloned()
            .unwrap_or_default()
    };
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let chart = r.get(kind, "platform-operator");
        assert_eq!(
            comparable(chart, false),
            comparable(&copy(Scope::Labelled, kind), false),
            "{kind}: the tests' copy"
        );
        // The demo registers them exactly as the chart does, namespaceSelector included.
        assert_eq!(
            comparable(chart, true),
            comparable(&copy(Scope::LikeTheChart, kind), true),
            "{kind}: the demo's copy"
        );
        let path = if kind.starts_with("Mutating") {
            "/mutate"
        } else {
            "/validate"
        };
        assert_eq!(
            chart["webhooks"][0]["clientConfig"],
            json!({"service": {"name": "platform-operator-webhook", "namespace": NS, "path": path, "port": 443}}),
            "no caBundle: the webhook fills it"
        );
        assert!(!chart.to_string().contains("caBundle"));
    }
}

#[test]
fn the_schema_rejects_wrong_types_and_shapes() {
    let cases: &[(&str, &str)] = &[
        (
            "image.digest=sha256:abc",
            "at '/image/digest': 'sha256:abc' does not match pattern '^sha256:[0-9a-f]{64}$'",
        ),
        ("image.digest=latest", "at '/image/digest'"),
        ("image.repository=", "at '/image/repository'"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        (
            "replicaCount=two",
            "at '/replicaCount': got string, want integer",
        ),
        (
            "replicaCount=-1",
            "at '/replicaCount': minimum: got -1, want 0",
        ),
        (
            "leaderElect=maybe",
            "at '/leaderElect': got string, want boolean",
        ),
        ("storageRootBase=relative/path", "at '/storageRootBase'"),
        (
            "installTimeout=5",
            "at '/installTimeout': got number, want string",
        ),
        ("repairInterval=soon", "at '/repairInterval'"),
        ("repairInterval=0s", "at '/repairInterval'"),
        ("targetPoll=10", "at '/targetPoll'"),
        (
            "maxConcurrentInstalls=0",
            "at '/maxConcurrentInstalls': minimum: got 0, want 1",
        ),
        (
            "maxConcurrentInstalls=many",
            "at '/maxConcurrentInstalls': got string, want integer",
        ),
        ("cleanupNamespace=Not_A_Namespace", "at '/cleanupNamespace'"),
        ("cleanupImage=busybox:1.37", "at '/cleanupImage'"),
        (
            "extraEnv[0].value=x",
            "at '/extraEnv/0': missing property 'name'",
        ),
        ("extraEnv[0].name=NOT-A-NAME", "at '/extraEnv/0/name'"),
        ("npmRegistry=ftp://registry", "at '/npmRegistry'"),
        (
            "podSecurityStandard=lenient",
            "at '/podSecurityStandard': value must be one of 'privileged', 'baseline', 'restricted'",
        ),
        (
            "npmRegistry=https://ci:token@npm.example/",
            "at '/npmRegistry'",
        ),
        ("extraArgs[0]=debug", "at '/extraArgs/0'"),
        (
            "extraArgs=--log-level=debug",
            "at '/extraArgs': got string, want array",
        ),
        ("state.size=lots", "at '/state/size'"),
        (
            "state.storageClassName=Fast_Disks",
            "at '/state/storageClassName'",
        ),
        ("state.existingClaim=Bad_Claim", "at '/state/existingClaim'"),
        (
            "passphrase.existingSecret=Bad_Secret",
            "at '/passphrase/existingSecret'",
        ),
        (
            "rbac.clusterAdmin=yes",
            "at '/rbac/clusterAdmin': got string, want boolean",
        ),
        (
            "rbac.extraRules[0].resources={pods}",
            "at '/rbac/extraRules/0': missing property 'verbs'",
        ),
        (
            "resources.requests.cpu=lots",
            "at '/resources/requests/cpu'",
        ),
        (
            "resources.limit.memory=1Gi",
            "at '/resources': additional properties 'limit' not allowed",
        ),
        ("emptyDirSizeLimit.home=big", "at '/emptyDirSizeLimit/home'"),
        ("emptyDirSizeLimit.tmp=", "at '/emptyDirSizeLimit/tmp'"),
        (
            "webhook.replicas=one",
            "at '/webhook/replicas': got string, want integer",
        ),
        (
            "webhook.failurePolicy=Never",
            "at '/webhook/failurePolicy': value must be one of 'Fail', 'Ignore'",
        ),
        (
            "webhook.timeoutSeconds=31",
            "at '/webhook/timeoutSeconds': maximum: got 31, want 30",
        ),
        (
            "webhook.timeoutSeconds=0",
            "at '/webhook/timeoutSeconds': minimum: got 0, want 1",
        ),
        ("webhook.certLifetime=1year", "at '/webhook/certLifetime'"),
        ("webhook.extraArgs[0]=json", "at '/webhook/extraArgs/0'"),
        (
            "webhook.replica=2",
            "at '/webhook': additional properties 'replica' not allowed",
        ),
        (
            "networkPolicy.enabled=yes",
            "at '/networkPolicy/enabled': got string, want boolean",
        ),
        (
            "networkPolicy.metricsFrom[0].podSelector.app=prometheus",
            "at '/networkPolicy/metricsFrom/0/podSelector': additional properties 'app' not allowed",
        ),
        (
            "networkPolicy.metricsFrom[0].ipBlock.except[0]=10.1.0.0/16",
            "at '/networkPolicy/metricsFrom/0/ipBlock': missing property 'cidr'",
        ),
        (
            "headlamp.enabled=1",
            "at '/headlamp/enabled': got number, want boolean",
        ),
        (
            // The program never runs in the controller's container: no switch to make it.
            "installPod.enabled=false",
            "at '/installPod': additional properties 'enabled' not allowed",
        ),
        (
            "installPod.resources.limits.memory=null",
            "at '/installPod/resources/limits': missing property 'memory'",
        ),
        ("replicas=2", "additional properties 'replicas' not allowed"),
        (
            "controller.replicas=2",
            "at '/controller': additional properties 'replicas' not allowed",
        ),
    ];
    for (set, message) in cases {
        let err = render_err(&[PASSPHRASE, set]);
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(message),
            "--set {set}: expected {message:?} in:\n{err}"
        );
    }
}

#[test]
fn rules_across_values_fail_with_a_one_line_reason() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["replicaCount=2", "leaderElect=false"],
            "replicaCount is 2: more than 1 replica requires leaderElect=true",
        ),
        (
            &["state.existingClaim=my-state", "passphrase.existingSecret="],
            "state.existingClaim requires passphrase.existingSecret: the chart can't know the passphrase of state in a claim it didn't create",
        ),
        (
            &["headlamp.enabled=true"],
            "headlamp.enabled=true needs the Headlamp chart 0.46.0 vendored",
        ),
        (
            &["extraArgs={--state-dir=/elsewhere}"],
            "extraArgs sets --state-dir, which the chart sets itself: set its value instead",
        ),
        (
            &["extraArgs={--leader-elect=false}"],
            "extraArgs sets --leader-elect, which the chart sets itself",
        ),
        (
            &["extraArgs={--cleanup-image=busybox:1.37}"],
            "extraArgs sets --cleanup-image, which the chart sets itself",
        ),
        (
            &["extraArgs={--install-image=busybox:1.37}"],
            "extraArgs sets --install-image, which the chart sets itself",
        ),
        (
            &["extraEnv[0].name=NODE_NAME", "extraEnv[0].value=elsewhere"],
            "extraEnv sets NODE_NAME, which the chart sets itself",
        ),
        (
            &["extraEnv[0].name=HOME", "extraEnv[0].value=/elsewhere"],
            "extraEnv sets HOME, which the chart sets itself",
        ),
        (
            &["webhook.extraArgs={--cert-lifetime=1h}"],
            "webhook.extraArgs sets --cert-lifetime, which the chart sets itself",
        ),
    ];
    for (sets, message) in cases {
        let mut all = vec![PASSPHRASE];
        all.extend_from_slice(sets);
        let err = render_err(&all);
        let line = err
            .lines()
            .find(|l| l.contains("execution error"))
            .unwrap_or_else(|| panic!("{sets:?}: no template failure in:\n{err}"));
        assert!(
            line.contains(message),
            "{sets:?}: expected {message:?} in:\n{err}"
        );
    }
    // One replica without leader election is fine (and the flag says so), and so is more than
    // one with it.
    let r = render(&["replicaCount=1", "leaderElect=false"]);
    assert!(
        r.args("platform-operator-controller")
            .contains(&"--leader-elect=false".to_string()),
        "{:?}",
        r.args("platform-operator-controller")
    );
    render(&["replicaCount=2"]);
}

#[test]
fn an_offline_render_without_passphrase_existing_secret_fails_and_says_what_to_set() {
    let err = render_err(&[]);
    assert!(
        err.contains("this render cannot see the cluster")
            && err.contains("set passphrase.existingSecret=platform-operator-passphrase"),
        "{err}"
    );
    // With it, the render names the Secret and generates nothing.
    let r = render(&[]);
    assert!(!r.objects.iter().any(|o| o["kind"] == "Secret"));
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = e2e::control_plane::base_dir().join(format!("chart-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from)
        .expect("read_dir")
        .filter_map(Result::ok)
    {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A **stand-in** for the upstream Headlamp chart 0.46.0 (it cannot be fetched here): a
/// ConfigMap showing the values the operator chart passes to it.
fn standin_headlamp_archive(dir: &Path, helm: &Helm) -> std::path::PathBuf {
    let src = dir.join("headlamp");
    std::fs::create_dir_all(src.join("templates")).expect("mkdir");
    std::fs::write(
        src.join("Chart.yaml"),
        "apiVersion: v2\nname: headlamp\nversion: 0.46.0\ndescription: A stand-in for the upstream Headlamp chart in tests.\n",
    )
    .expect("write");
    std::fs::write(
        src.join("values.yaml"),
        "config:\n  watchPlugins: false\npluginsManager:\n  enabled: false\n  configContent: \"\"\n",
    )
    .expect("write");
    std::fs::write(
        src.join("templates/standin.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: headlamp-standin\ndata:\n  watchPlugins: {{ .Values.config.watchPlugins | quote }}\n  pluginsManager: {{ .Values.pluginsManager.enabled | quote }}\n  configContent: {{ .Values.pluginsManager.configContent | quote }}\n",
    )
    .expect("write");
    let out = dir.display().to_string();
    helm.ok(&["package", &src.display().to_string(), "-d", &out])
        .expect("helm package");
    dir.join("headlamp-0.46.0.tgz")
}

#[test]
fn a_release_vendors_headlamp_and_it_installs_only_when_enabled() {
    let helm = helm();
    let dir = scratch("headlamp");
    let archive = standin_headlamp_archive(&dir, &helm);
    let chart = dir.join("platform-operator");
    copy_dir(&chart_dir(), &chart);
    let mut script = std::process::Command::new("bash");
    script
        .arg(e2e::repo_root().join("charts/vendor-headlamp.sh"))
        .arg(&archive)
        .arg(&chart)
        .env("HELM", helm.bin());
    let out = e2e::cmd::run(script, None)
        .expect("script runs")
        .ok("vendor-headlamp.sh")
        .expect("vendoring succeeds");
    assert!(out.contains("vendored headlamp 0.46.0"), "{out}");

    // A wrong digest is refused.
    let mut script = std::process::Command::new("bash");
    script
        .arg(e2e::repo_root().join("charts/vendor-headlamp.sh"))
        .arg(&archive)
        .arg(dir.join("elsewhere"))
        .env("HELM", helm.bin())
        .env("HEADLAMP_CHART_SHA256", "00".repeat(32));
    assert!(!e2e::cmd::run(script, None).expect("script runs").success);

    let chart_s = chart.display().to_string();
    let lint = helm
        .run(&["lint", "--strict", &chart_s])
        .expect("helm lint runs");
    assert!(
        lint.success && !lint.stdout.contains("[WARNING]"),
        "{}{}",
        lint.stdout,
        lint.stderr
    );

    let off = helm
        .template_chart(&chart, NS, &[PASSPHRASE])
        .expect("render");
    assert!(
        off.find("ConfigMap", "headlamp-standin").is_none(),
        "off by default"
    );
    let on = helm
        .template_chart(&chart, NS, &[PASSPHRASE, "headlamp.enabled=true"])
        .expect("render with headlamp");
    let standin = on.get("ConfigMap", "headlamp-standin");
    assert_eq!(
        standin["data"]["watchPlugins"], "true",
        "the chart's setting reaches Headlamp"
    );
    assert_eq!(standin["data"]["pluginsManager"], "true");
    let plugins: Value = serde_saphyr::from_str(
        standin["data"]["configContent"]
            .as_str()
            .unwrap_or_default(),
    )
    .expect("plugin configuration is YAML");
    assert_eq!(
        plugins,
        json!({"plugins": [{"name": "di-framework-platform",
                            "source": "https://artifacthub.io/packages/headlamp/di-framework-platform/di-framework-platform",
                            "version": "6.0.22"}]})
    );
    assert!(
        on.find("Deployment", "platform-operator-controller")
            .is_some()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Every leaf key of a values tree: scalars, lists and empty maps (`headlamp.*` below the
/// operator chart's own keys is listed too: the chart sets it).
fn leaf_keys(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_keys(&key, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

#[test]
fn docs_chart_md_lists_exactly_the_values_of_values_yaml() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml parses");
    let mut keys = BTreeSet::new();
    leaf_keys("", &values, &mut keys);
    let doc =
        std::fs::read_to_string(e2e::repo_root().join("docs/chart.md")).expect("docs/chart.md");
    // The first cell of each row of the values tables: `key` (several keys share a row when
    // separated by commas).
    let mut documented = BTreeSet::new();
    let mut in_values = false;
    for line in doc.lines() {
        if line.starts_with("## ") {
            in_values = line.trim() == "## Values";
        }
        if !in_values || !line.starts_with("| `") {
            continue;
        }
        let cell = line.split('|').nth(1).unwrap_or_default();
        for key in cell.split(',') {
            let key = key.trim().trim_matches('`');
            if !key.is_empty() {
                documented.insert(key.to_string());
            }
        }
    }
    let missing: Vec<_> = keys.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&keys).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/chart.md is out of step with values.yaml: not documented {missing:?}; documented but not in values.yaml {extra:?}"
    );
    // Each documented default is the one in values.yaml (second cell, in backticks).
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(key), Some(default)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let key = key.trim_matches('`');
        if key.contains(',') || !keys.contains(key) {
            continue;
        }
        let Some(shown) = default.strip_prefix('`').and_then(|d| d.split('`').next()) else {
            continue;
        };
        let mut actual = &values;
        for part in key.split('.') {
            actual = &actual[part];
        }
        let actual = match actual {
            Value::String(s) if s.is_empty() => "\"\"".into(),
            Value::String(s) => s.clone(),
            Value::Array(a) if a.is_empty() => "[]".into(),
            other => other.to_string(),
        };
        if actual.contains('\n') {
            continue;
        }
        assert_eq!(shown, actual, "docs/chart.md: default of {key}");
    }
}

/// `defaultInstanceResources` (issue 31, item 6) reaches the controller as JSON, only when set.
#[test]
fn the_fleet_wide_quota_default_is_passed_as_json() {
    let flag = |r: &Rendered| {
        let args = r.args("platform-operator-controller");
        args.into_iter()
            .find(|a| a.starts_with("--default-instance-resources="))
    };
    assert_eq!(flag(&render(&[])), None);
    let set = render(&["defaultInstanceResources.quota.count/pods=50"]);
    assert_eq!(
        flag(&set).as_deref(),
        Some(r#"--default-instance-resources={"quota":{"count/pods":50}}"#)
    );
}
