//! End-to-end: the webhook binary as a process against the real local API server. Each test
//! registers its own webhook configurations (`clientConfig.url: https://127.0.0.1:<port>/...`,
//! no caBundle, scoped to the test's namespaces by a label) and lets the webhook inject its CA.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::control_plane::free_port;
use e2e::shared::Shared;
use e2e::webhook::{ca_bundle, wait_for_bundle};

fn register(cluster: &Shared, id: &str, port: u16) {
    e2e::webhook::register(cluster, id, port).expect("configurations apply");
}

fn unregister(cluster: &Shared, id: &str) {
    e2e::webhook::unregister(cluster, id);
}

fn start(cluster: &Shared, id: &str, ns: &str, extra: &[&str], port: u16) -> e2e::webhook::Webhook {
    e2e::webhook::Webhook::start(
        Path::new(env!("CARGO_BIN_EXE_webhook")),
        cluster,
        id,
        ns,
        extra,
        Some(port),
    )
}

fn cluster() -> Shared {
    let shared = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    shared.install_crd().unwrap_or_else(|e| panic!("{e}"));
    shared
}

fn apply(cluster: &Shared, manifest: &str, extra: &[&str]) -> e2e::cmd::Outcome {
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "--server-side", "--field-manager=e2e", "-f", "-"])
        .args(extra);
    e2e::cmd::run(cmd, Some(manifest)).expect("kubectl runs")
}

fn instance(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: platform.di-framework.dev/v1alpha1\nkind: PlatformInstance\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n{spec}"
    )
}

/// Applies until it is denied with `words` (the NodePort cache follows watches, so a conflict
/// shows a moment after the other object appears).
async fn eventually_denied(cluster: &Shared, manifest: &str, words: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = apply(cluster, manifest, &[]);
        if !out.success && words.iter().all(|w| out.stderr.contains(w)) {
            return out.stderr;
        }
        assert!(
            Instant::now() < deadline,
            "never denied with {words:?}: {out:?}"
        );
        if out.success {
            // Undo the accidental create so the next try is a create again.
            let _ = cluster.kubectl_ok(&["delete", "-f", "-", "--wait=false"], Some(manifest));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn every_rule_through_kubectl_and_deletion_never_blocked() {
    let cluster = cluster();
    let id = "rules";
    let ns = cluster
        .create_namespace("wh-rules", &[("e2e-webhook", id)])
        .expect("namespace");
    let port = free_port().expect("port");
    register(&cluster, id, port);
    let mut webhook = start(&cluster, id, &ns, &[], port);
    webhook.wait_ready().await;
    let bundle = wait_for_bundle(&cluster, id).await;
    assert!(!bundle.is_empty());

    // Defaulted version.
    let out = apply(
        &cluster,
        &instance(&ns, "defaulted", "  target: { type: vcluster }\n"),
        &[],
    );
    assert!(out.success, "{out:?}");
    assert_eq!(
        cluster
            .kubectl_ok(
                &[
                    "-n",
                    &ns,
                    "get",
                    "pi",
                    "defaulted",
                    "-o",
                    "jsonpath={.spec.version}"
                ],
                None
            )
            .expect("get"),
        "6.0.22"
    );

    // Downgrade below the installed version.
    assert!(apply(&cluster, &instance(&ns, "down", "  version: 6.0.22\n"), &[]).success);
    cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "patch",
                "pi",
                "down",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"installedVersion":"6.0.22"}}"#,
            ],
            None,
        )
        .expect("status patch");
    let out = apply(&cluster, &instance(&ns, "down", "  version: 6.0.21\n"), &[]);
    assert!(
        !out.success && out.stderr.contains("below the installed version 6.0.22"),
        "{out:?}"
    );

    // A Secret the requester cannot read: alice may write instances but not read Secrets.
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{ name: pi-writer, namespace: {ns} }}\nrules:\n  - apiGroups: [platform.di-framework.dev]\n    resources: [platforminstances]\n    verbs: [get, list, watch, create, update, patch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{ name: alice, namespace: {ns} }}\nroleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: pi-writer }}\nsubjects: [{{ apiGroup: rbac.authorization.k8s.io, kind: User, name: alice }}]\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&rbac))
        .expect("rbac");
    let auth = format!(
        "  version: 6.0.22\n  platform:\n    tenantAuth:\n      image: ghcr.io/di-framework/tenant-auth@sha256:{}\n      issuer: https://id.example\n      clientId: console\n      clientSecretRef: {{ name: oauth, key: clientSecret }}\n",
        "a".repeat(64)
    );
    let out = apply(&cluster, &instance(&ns, "auth", &auth), &["--as=alice"]);
    assert!(
        !out.success && out.stderr.contains("alice may not get Secret"),
        "{out:?}"
    );

    // A missing Secret is admitted without a word: the webhook reads no Secret (the controller
    // reports a missing one in a condition).
    let out = apply(&cluster, &instance(&ns, "auth", &auth), &[]);
    assert!(out.success, "{out:?}");
    assert!(!out.stderr.contains("Warning:"), "{out:?}");

    // NodePort collisions: with another instance, and with a plain Service.
    assert!(
        apply(
            &cluster,
            &instance(
                &ns,
                "port-a",
                "  version: 6.0.22\n  platform: { gateway: { httpNodePort: 30480 } }\n"
            ),
            &[]
        )
        .success
    );
    eventually_denied(
        &cluster,
        &instance(
            &ns,
            "port-b",
            "  version: 6.0.22\n  platform: { gateway: { httpNodePort: 30480 } }\n",
        ),
        &[
            "httpNodePort 30480 is already used by PlatformInstance",
            "port-a",
        ],
    )
    .await;
    let service = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: plain, namespace: {ns} }}\nspec:\n  type: NodePort\n  selector: {{ app: none }}\n  ports: [{{ port: 80, nodePort: 30481 }}]\n"
    );
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&service))
        .expect("service");
    eventually_denied(
        &cluster,
        &instance(
            &ns,
            "port-c",
            "  version: 6.0.22\n  platform: { gateway: { httpNodePort: 30481 } }\n",
        ),
        &["httpNodePort 30481 is already used by Service", "plain"],
    )
    .await;

    // Deletion is never blocked, even with the webhook stopped.
    assert!(
        apply(
            &cluster,
            &instance(&ns, "going", "  version: 6.0.22\n"),
            &[]
        )
        .success
    );
    cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "patch",
                "pi",
                "going",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":["platform.di-framework.dev/instance"]}}"#,
            ],
            None,
        )
        .expect("finalizer");
    cluster
        .kubectl_ok(&["-n", &ns, "delete", "pi", "going", "--wait=false"], None)
        .expect("delete");
    webhook.stop();
    // With the validating webhook down (failurePolicy: Fail), ordinary writes fail closed ...
    let out = apply(
        &cluster,
        &instance(&ns, "while-down", "  version: 6.0.22\n"),
        &[],
    );
    assert!(!out.success, "the validating webhook fails closed: {out:?}");
    // ... but the controller's finalizer removal goes through, and the instance is gone.
    cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "patch",
                "pi",
                "going",
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
            ],
            None,
        )
        .expect("finalizer removal is admitted while the webhook is down");
    let out = e2e::cmd::run(
        {
            let mut c = cluster.kubectl();
            c.args(["-n", &ns, "get", "pi", "going"]);
            c
        },
        None,
    )
    .expect("kubectl");
    assert!(!out.success && out.stderr.contains("NotFound"), "{out:?}");
    unregister(&cluster, id);
}

#[tokio::test]
async fn a_restart_keeps_the_ca_and_a_reset_bundle_comes_back() {
    let cluster = cluster();
    let id = "restart";
    let ns = cluster
        .create_namespace("wh-restart", &[("e2e-webhook", id)])
        .expect("namespace");
    let port = free_port().expect("port");
    register(&cluster, id, port);
    let mut first = start(&cluster, id, &ns, &[], port);
    first.wait_ready().await;
    let bundle = wait_for_bundle(&cluster, id).await;
    let secret = cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "get",
                "secret",
                "platform-operator-webhook-tls",
                "-o",
                "jsonpath={.data.ca\\.crt}",
            ],
            None,
        )
        .expect("secret");
    first.stop();

    let mut second = start(&cluster, id, &ns, &[], port);
    second.wait_ready().await;
    assert!(
        apply(
            &cluster,
            &instance(&ns, "after-restart", "  version: 6.0.22\n"),
            &[]
        )
        .success
    );
    assert_eq!(
        wait_for_bundle(&cluster, id).await,
        bundle,
        "same CA after a restart"
    );
    let again = cluster
        .kubectl_ok(
            &[
                "-n",
                &ns,
                "get",
                "secret",
                "platform-operator-webhook-tls",
                "-o",
                "jsonpath={.data.ca\\.crt}",
            ],
            None,
        )
        .expect("secret");
    assert_eq!(again, secret);

    // Someone resets the caBundle (as a chart upgrade without it might): it comes back.
    cluster
        .kubectl_ok(
            &[
                "patch",
                "validatingwebhookconfiguration",
                &format!("e2e-{id}"),
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/webhooks/0/clientConfig/caBundle"}]"#,
            ],
            None,
        )
        .expect("reset");
    assert_eq!(
        wait_for_bundle(&cluster, id).await,
        bundle,
        "the webhook puts its bundle back"
    );
    // A chart-style re-apply without caBundle by another field manager leaves it in place.
    register(&cluster, id, port);
    assert_eq!(
        ca_bundle(&cluster, "validatingwebhookconfiguration", id),
        bundle
    );
    assert!(
        second
            .metrics()
            .await
            .contains("platform_operator_webhook_ca_bundle_writes_total")
    );
    drop(second);
    unregister(&cluster, id);
}

#[tokio::test]
async fn rotations_never_fail_a_request() {
    let cluster = cluster();
    let id = "rotate";
    let ns = cluster
        .create_namespace("wh-rotate", &[("e2e-webhook", id)])
        .expect("namespace");
    let port = free_port().expect("port");
    register(&cluster, id, port);
    // A 16 s lifetime: a new CA is prepared every 8 s and promoted 4 s later.
    let mut webhook = start(&cluster, id, &ns, &["--cert-lifetime=16s"], port);
    webhook.wait_ready().await;
    wait_for_bundle(&cluster, id).await;

    let client = cluster.client().await.expect("client");
    let api: kube::Api<common::crd::PlatformInstance> = kube::Api::namespaced(client, &ns);
    let params = kube::api::PatchParams::apply("e2e-rotation");
    let start = Instant::now();
    let (mut ok, mut failed) = (0u32, Vec::new());
    let mut served = std::collections::BTreeSet::new();
    let mut i = 0u32;
    while start.elapsed() < Duration::from_secs(40) {
        let name = format!("r{}", i % 20);
        let patch = serde_json::json!({
            "apiVersion": "platform.di-framework.dev/v1alpha1",
            "kind": "PlatformInstance",
            "metadata": {"name": name, "annotations": {"e2e/round": i.to_string()}},
            "spec": {"version": "6.0.22"},
        });
        match api
            .patch(&name, &params, &kube::api::Patch::Apply(&patch))
            .await
        {
            Ok(_) => ok += 1,
            Err(e) => failed.push(format!("{:.1}s: {e}", start.elapsed().as_secs_f64())),
        }
        if i.is_multiple_of(10) {
            let m = webhook.metrics().await;
            if let Some(line) = m.lines().find(|l| {
                l.starts_with("platform_operator_webhook_certificate_expiry_timestamp_seconds")
            }) {
                served.insert(line.to_string());
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = webhook.metrics().await;
    let promotes = metrics
        .lines()
        .find(|l| {
            l.starts_with("platform_operator_webhook_certificate_rotations_total{step=\"promote\"}")
        })
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during rotation: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    assert!(
        promotes >= 2.0,
        "expected at least two rotations, saw {promotes}: {metrics}"
    );
    assert!(
        served.len() >= 3,
        "the served certificate changed at least twice: {served:?}"
    );
    eprintln!("rotation: {ok} requests, 0 failed, {promotes} promotions");
    unregister(&cluster, id);
}

#[tokio::test]
async fn replicas_started_together_share_one_ca() {
    let cluster = cluster();
    let id = "replicas";
    let ns = cluster
        .create_namespace("wh-replicas", &[("e2e-webhook", id)])
        .expect("namespace");
    let (port_a, port_b) = (free_port().expect("port"), free_port().expect("port"));
    register(&cluster, id, port_a);
    // Both race to create the certificate Secret; the loser must adopt the winner's CA.
    let mut a = start(&cluster, id, &ns, &[], port_a);
    let mut b = start(&cluster, id, &ns, &[], port_b);
    a.wait_ready().await;
    b.wait_ready().await;
    let bundle = wait_for_bundle(&cluster, id).await;
    let ca = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &bundle)
            .expect("base64"),
    )
    .expect("pem");
    let name = format!("platform-operator-webhook.{ns}.svc");
    for port in [port_a, port_b] {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let conn = e2e::https::HttpsConnection::connect(
            addr,
            &name,
            &ca,
            &[b"h2"],
            &[&rustls::version::TLS13],
        )
        .await;
        assert!(
            conn.is_ok(),
            "replica on {port} serves a certificate from the shared CA: {:?}",
            conn.err()
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        wait_for_bundle(&cluster, id).await,
        bundle,
        "neither replica replaced the other's CA"
    );
    unregister(&cluster, id);
}

/// Runs kubectl with `args` and returns its outcome.
fn kubectl(cluster: &Shared, args: &[&str]) -> e2e::cmd::Outcome {
    let mut cmd = cluster.kubectl();
    cmd.args(args);
    e2e::cmd::run(cmd, None).expect("kubectl runs")
}

/// The matchConditions (docs/webhook.md#when-the-api-server-calls-the-webhooks), against the real
/// API server: every write that has work for a webhook still reaches it and is judged as before
/// (defaulted, refused, warned, the cross-object NodePort check), and the writes that have none
/// (metadata-only, status, no-op re-applies, a finalizer) never reach it, counted from the
/// webhook's own review counter.
#[tokio::test]
async fn the_webhooks_are_called_exactly_when_they_have_work() {
    let cluster = cluster();
    let id = "when";
    let ns = cluster
        .create_namespace("wh-when", &[("e2e-webhook", id)])
        .expect("namespace");
    let port = free_port().expect("port");
    register(&cluster, id, port);
    let mut webhook = start(&cluster, id, &ns, &[], port);
    webhook.wait_ready().await;
    wait_for_bundle(&cluster, id).await;

    // Each step: what it does, and whether each webhook must receive it (1: at least one review;
    // the API server runs admission again when it retries an update whose cached object was
    // stale) or must not (0: no review at all).
    let mut seen = webhook.reviews_answered().await;
    let mut expect = async |step: &str, mutate: u64, validate: u64| {
        let now = webhook.reviews_answered().await;
        let got = (now.0 - seen.0, now.1 - seen.1);
        assert_eq!(
            (got.0.min(1), got.1.min(1)),
            (mutate, validate),
            "{step}: (mutate, validate) reviews received: {got:?}"
        );
        seen = now;
    };

    let patch_given = |body: &str| {
        kubectl(
            &cluster,
            &[
                "-n",
                &ns,
                "patch",
                "pi",
                "given",
                "--type=merge",
                "-p",
                body,
            ],
        )
    };

    // A create without a version: defaulted (both called).
    let bare = instance(&ns, "bare", "  target: { type: vcluster }\n");
    let out = apply(&cluster, &bare, &[]);
    assert!(out.success, "{out:?}");
    let version = |name: &str| {
        cluster
            .kubectl_ok(
                &[
                    "-n",
                    &ns,
                    "get",
                    "pi",
                    name,
                    "-o",
                    "jsonpath={.spec.version}",
                ],
                None,
            )
            .expect("get")
    };
    assert_eq!(version("bare"), "6.0.22");
    expect("create without spec.version", 1, 1).await;

    // A create with a version: validated, not mutated.
    let given = instance(
        &ns,
        "given",
        "  version: 6.0.22\n  platform: { gateway: { httpNodePort: 30580, httpEndpoint: \"http://apps.example:30580\" } }\n",
    );
    let out = apply(&cluster, &given, &[]);
    assert!(out.success, "{out:?}");
    assert!(
        out.stderr.contains("is not a loopback URL"),
        "the route-pattern warning on create: {out:?}"
    );
    expect("create with spec.version", 0, 1).await;

    // Writes with no work for either webhook.
    let out = apply(&cluster, &given, &[]);
    assert!(out.success, "{out:?}");
    expect("the same manifest applied again", 0, 0).await;
    for args in [
        &["-n", &ns, "label", "pi", "given", "team=a"][..],
        &["-n", &ns, "annotate", "pi", "given", "note=hello"],
        &[
            "-n",
            &ns,
            "patch",
            "pi",
            "given",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["platform.di-framework.dev/instance"]}}"#,
        ],
        &[
            "-n",
            &ns,
            "patch",
            "pi",
            "given",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"installedVersion":"6.0.22"}}"#,
        ],
        &[
            "-n",
            &ns,
            "patch",
            "pi",
            "given",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    ] {
        let out = kubectl(&cluster, args);
        assert!(out.success, "{args:?}: {out:?}");
        expect(&format!("{args:?}"), 0, 0).await;
    }

    // A spec change: validated again (and its warnings given), not mutated.
    let out = patch_given(r#"{"spec":{"deletionPolicy":"Delete"}}"#);
    assert!(
        out.success && out.stderr.contains("removes its storage"),
        "the deletion-policy warning: {out:?}"
    );
    expect("a spec change", 0, 1).await;

    // An invalid change is still refused: out of the version range, and a downgrade.
    let out = patch_given(r#"{"spec":{"version":"7.0.0"}}"#);
    assert!(
        !out.success
            && out
                .stderr
                .contains("outside the versions this operator supports"),
        "{out:?}"
    );
    expect("a version out of range", 0, 1).await;
    let out = patch_given(r#"{"spec":{"version":"6.0.21"}}"#);
    assert!(
        !out.success && out.stderr.contains("below the installed version 6.0.22"),
        "{out:?}"
    );
    expect("a downgrade", 0, 1).await;

    // The downgrade annotation is read by a rule, so changing only it reaches the webhook: opting
    // in admits the downgrade, and taking the opt-in back (spec unchanged) is refused again.
    let out = patch_given(
        r#"{"metadata":{"annotations":{"platform.di-framework.dev/allow-downgrade":"true"}},"spec":{"version":"6.0.21"}}"#,
    );
    assert!(
        out.success && out.stderr.contains("downgrading from 6.0.22 to 6.0.21"),
        "{out:?}"
    );
    expect("an opted-in downgrade", 0, 1).await;
    let out = kubectl(
        &cluster,
        &[
            "-n",
            &ns,
            "annotate",
            "pi",
            "given",
            "platform.di-framework.dev/allow-downgrade-",
        ],
    );
    assert!(
        !out.success && out.stderr.contains("below the installed version 6.0.22"),
        "{out:?}"
    );
    expect("the downgrade opt-in taken back", 0, 1).await;

    // The cross-object check: another instance's port is refused.
    let out = apply(
        &cluster,
        &instance(
            &ns,
            "taker",
            "  version: 6.0.22\n  platform: { gateway: { httpNodePort: 30580 } }\n",
        ),
        &[],
    );
    assert!(
        !out.success
            && out
                .stderr
                .contains("httpNodePort 30580 is already used by PlatformInstance"),
        "{out:?}"
    );
    expect("a NodePort held by another instance", 0, 1).await;

    // Taking spec.version out of an existing instance: defaulted again.
    let out = kubectl(
        &cluster,
        &[
            "-n",
            &ns,
            "patch",
            "pi",
            "bare",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/version"}]"#,
        ],
    );
    assert!(out.success, "{out:?}");
    assert_eq!(version("bare"), "6.0.22");
    expect(
        "spec.version removed (defaulted back to what it was: no change left to validate)",
        1,
        0,
    )
    .await;

    webhook.stop();
    unregister(&cluster, id);
}
