//! The image cannot be built here (no container engine), so this checks what can be checked
//! without building it: the Dockerfile's runtime stage puts every file and variable where the
//! binaries' flag defaults (read from their `--help`) and the chart's Deployments expect them, and
//! the chart's object names are the binaries' defaults.

use std::collections::BTreeMap;

use e2e::chart::{Helm, Rendered, operator_binaries};
use e2e::dockerfile::{all, copies, env, stages};
use serde_json::Value;

/// `--flag` → (default, env) from clap's `--help` text.
fn flags(help: &str) -> BTreeMap<String, (Option<String>, Option<String>)> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--") || (trimmed.starts_with('-') && trimmed.contains(", --")) {
            let flag = trimmed
                .split_whitespace()
                .find(|w| w.starts_with("--"))
                .map(|w| w.trim_end_matches(',').to_string());
            current = flag;
            if let Some(f) = &current {
                out.entry(f.clone()).or_insert((None, None));
            }
        }
        let Some(flag) = &current else { continue };
        let entry = out.entry(flag.clone()).or_insert((None, None));
        if let Some(at) = line.find("[default: ") {
            let rest = &line[at + "[default: ".len()..];
            entry.0 = rest.split(']').next().map(str::to_string);
        }
        if let Some(at) = line.find("[env: ") {
            let rest = &line[at + "[env: ".len()..];
            entry.1 = rest.split(['=', ']']).next().map(str::to_string);
        }
    }
    out
}

fn help(bin: &std::path::Path) -> String {
    let out = std::process::Command::new(bin)
        .arg("--help")
        .env_remove("VCLUSTER_CHART_SHA256")
        .output()
        .expect("--help runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn default_of(flags: &BTreeMap<String, (Option<String>, Option<String>)>, flag: &str) -> String {
    flags
        .get(flag)
        .and_then(|f| f.0.clone())
        .unwrap_or_else(|| panic!("{flag} has no default in --help: {flags:?}"))
}

fn rendered() -> Rendered {
    Helm::offline()
        .expect("helm")
        .template(
            "platform-operator",
            &["passphrase.existingSecret=platform-operator-passphrase"],
        )
        .expect("the chart renders")
}

fn mount(container: &Value, name: &str) -> String {
    container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == name))
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("mount {name}"))
        .to_string()
}

#[test]
fn the_image_puts_everything_where_the_binaries_and_the_chart_expect_it() {
    let text = e2e::dockerfile::read().expect("Dockerfile");
    let stages = stages(&text);
    let runtime = stages.last().expect("a runtime stage");
    let (controller_bin, webhook_bin) = operator_binaries().expect("operator binaries");
    let controller = flags(&help(&controller_bin));
    let webhook = flags(&help(&webhook_bin));
    let r = rendered();
    let deployment = r.get("Deployment", "platform-operator-controller");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = r.container("platform-operator-controller");
    let env = env(runtime);
    let copies = copies(runtime);

    // Node.js and npm come with the runtime's base image; the process runs as uid/gid 1000, as
    // the chart's pods do.
    let from = &runtime[0].rest;
    assert!(from.starts_with("node:"), "{from}");
    let user: Vec<&str> = all(runtime, "USER").collect();
    assert_eq!(user, ["1000:1000"]);
    assert_eq!(pod["securityContext"]["runAsUser"], 1000);
    assert_eq!(pod["securityContext"]["runAsGroup"], 1000);

    // Both binaries at the paths the chart's Deployments run.
    for (deployment, binary) in [
        ("platform-operator-controller", "controller"),
        ("platform-operator-webhook", "webhook"),
    ] {
        let command = r.container(deployment)["command"][0]
            .as_str()
            .expect("command")
            .to_string();
        assert!(
            copies.iter().any(|(from, src, dest)| from == "build"
                && src.ends_with(binary)
                && *dest == command),
            "{command} is not copied from the build stage: {copies:?}"
        );
    }
    let entrypoint: Vec<&str> = all(runtime, "ENTRYPOINT").collect();
    assert_eq!(entrypoint, [r#"["/usr/local/bin/controller"]"#]);

    // --vcluster-chart: the chart is copied to its default path; the version in the path is the
    // one the tools stage downloads.
    let chart_path = default_of(&controller, "--vcluster-chart");
    assert_eq!(
        chart_path,
        "/opt/platform-operator/charts/vcluster-0.37.3.tgz"
    );
    assert!(
        copies
            .iter()
            .any(|(from, _, dest)| from == "tools" && *dest == chart_path),
        "{copies:?}"
    );
    let tools = stages
        .iter()
        .find(|s| s[0].rest.ends_with("AS tools"))
        .expect("the tools stage");
    assert!(all(tools, "ARG").any(|a| a == "VCLUSTER_CHART_VERSION=0.37.3"));
    // --vcluster-chart-sha256 is read from VCLUSTER_CHART_SHA256, which the image sets from the
    // same build argument the download was checked against.
    assert_eq!(
        controller
            .get("--vcluster-chart-sha256")
            .and_then(|f| f.1.clone())
            .as_deref(),
        Some("VCLUSTER_CHART_SHA256")
    );
    assert_eq!(
        env.get("VCLUSTER_CHART_SHA256").map(String::as_str),
        Some("sha256:${VCLUSTER_CHART_SHA256}")
    );
    assert!(all(runtime, "ARG").any(|a| a == "VCLUSTER_CHART_SHA256"));
    // Helm and pulumi are Go programs that read the system CA store (node brings its own).
    assert!(
        all(runtime, "RUN").any(|r| r.contains("apt-get install") && r.contains("ca-certificates")),
        "the runtime stage installs the system CA certificates"
    );
    assert!(
        all(tools, "RUN")
            .any(|r| r.contains("${VCLUSTER_CHART_SHA256}  vcluster.tgz\" | sha256sum -c -")),
        "the tools stage checks the chart's digest"
    );

    // --helm-binary, --pulumi-binary, --npm-binary: bare names found on PATH, where the tools
    // stage's binaries (helm, pulumi and its language host) and the base image's npm are.
    let path = env.get("PATH").expect("PATH is set");
    assert!(path.split(':').any(|d| d == "/usr/local/bin"), "{path}");
    for flag in ["--helm-binary", "--pulumi-binary", "--npm-binary"] {
        let name = default_of(&controller, flag);
        assert!(
            !name.contains('/'),
            "{flag} defaults to a name on PATH, not {name}"
        );
    }
    assert!(
        copies.iter().any(|(from, src, dest)| from == "tools"
            && src == "/out/bin/"
            && dest == "/usr/local/bin/"),
        "{copies:?}"
    );
    let installs: String = all(tools, "RUN").collect();
    for tool in [
        "helm",
        "pulumi/pulumi ",
        "pulumi/pulumi-language-nodejs",
        "pulumi/pulumi-resource-pulumi-nodejs",
    ] {
        assert!(installs.contains(tool), "the tools stage installs {tool}");
    }

    // HOME and /tmp: the image's and the chart's emptyDirs agree.
    let home = env.get("HOME").expect("HOME").clone();
    assert_eq!(mount(container, "home"), home);
    assert_eq!(
        container["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == "HOME"))
            .map(|v| v["value"].clone()),
        Some(Value::String(home.clone()))
    );
    assert_eq!(env.get("TMPDIR").map(String::as_str), Some("/tmp"));
    assert_eq!(mount(container, "tmp"), "/tmp");

    // --state-dir and --passphrase-file defaults are where the chart mounts the claim and the
    // Secret's key, and what it passes.
    let state = default_of(&controller, "--state-dir");
    assert_eq!(mount(container, "state"), state);
    let passphrase = default_of(&controller, "--passphrase-file");
    assert_eq!(
        format!("{}/passphrase", mount(container, "passphrase")),
        passphrase
    );
    let args = r.args("platform-operator-controller");
    assert!(args.contains(&format!("--state-dir={state}")), "{args:?}");
    assert!(
        args.contains(&format!("--passphrase-file={passphrase}")),
        "{args:?}"
    );
    assert_eq!(
        default_of(&controller, "--npm-registry"),
        "https://registry.npmjs.org/"
    );
    // Every flag the chart passes exists.
    for (name, flags) in [
        ("platform-operator-controller", &controller),
        ("platform-operator-webhook", &webhook),
    ] {
        for arg in r.args(name) {
            let flag = arg.split('=').next().unwrap_or_default();
            assert!(
                flags.contains_key(flag),
                "the chart passes {flag}, which {name} does not have"
            );
        }
    }

    // Names the chart gives objects are the binaries' defaults.
    assert_eq!(
        default_of(&webhook, "--service-name"),
        "platform-operator-webhook"
    );
    assert!(r.find("Service", "platform-operator-webhook").is_some());
    assert_eq!(
        default_of(&webhook, "--mutating-webhook-configuration"),
        "platform-operator"
    );
    assert!(
        r.find("MutatingWebhookConfiguration", "platform-operator")
            .is_some()
    );
    assert_eq!(
        default_of(&webhook, "--validating-webhook-configuration"),
        "platform-operator"
    );
    assert!(
        r.find("ValidatingWebhookConfiguration", "platform-operator")
            .is_some()
    );
    let tls = default_of(&webhook, "--tls-secret-name");
    assert!(
        r.get("Role", "platform-operator-webhook")
            .to_string()
            .contains(&tls),
        "the webhook's Role names its certificate Secret {tls}"
    );
    let admission = default_of(&webhook, "--admission-bind-address");
    assert!(admission.ends_with(":9443"), "{admission}");
    assert_eq!(
        webhook
            .get("--namespace")
            .and_then(|f| f.1.clone())
            .as_deref(),
        Some("POD_NAMESPACE"),
        "the chart sets POD_NAMESPACE from the downward API"
    );
    assert_eq!(
        controller
            .get("--identity")
            .and_then(|f| f.1.clone())
            .as_deref(),
        Some("POD_NAME")
    );
    assert_eq!(
        pod["serviceAccountName"], "platform-operator",
        "--operator-user's default names it"
    );
    assert!(
        help(&controller_bin).contains("system:serviceaccount:<namespace>:platform-operator"),
        "--operator-user's default"
    );
}

/// The tools stage's check that the real vCluster chart takes the controller's values, run here
/// as written (bash, as the stage's SHELL) against the stand-in chart: it passes with the
/// controller's values, and fails when the values would be refused or the control plane would
/// not be the Deployment the controller waits for.
#[test]
fn the_image_build_renders_the_real_chart_with_the_controllers_values() {
    let text = e2e::dockerfile::read().expect("Dockerfile");
    let stages = stages(&text);
    let tools = stages
        .iter()
        .find(|s| s[0].rest.ends_with("AS tools"))
        .expect("the tools stage");
    let check = all(tools, "RUN")
        .find(|r| r.contains("--print-vcluster-values"))
        .expect("the tools stage runs the controller's --print-vcluster-values")
        .to_string();
    let prefix = "controller=/work/controller helm=/out/bin/helm chart=/out/vcluster.tgz ";
    assert!(check.starts_with(prefix), "{check}");
    // The controller it runs is the build stage's; the chart is the checked download.
    assert!(
        copies(tools).iter().any(|(from, src, dest)| from == "build"
            && src == "/out/controller"
            && dest == "/work/controller"),
        "{:?}",
        copies(tools)
    );
    let download = all(tools, "RUN")
        .find(|r| r.contains("sha256sum -c -") && r.contains("/out/vcluster.tgz"))
        .expect("the checked chart download");
    assert!(download.contains("install -D -m 0444 vcluster.tgz /out/vcluster.tgz"));
    for word in [
        "template vcluster \"$chart\"",
        "--values values.yaml",
        "exit 1",
    ] {
        assert!(check.contains(word), "{word}: {check}");
    }

    let dir = e2e::control_plane::base_dir().join(format!("image-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let helm = Helm::offline().expect("helm");
    let chart = e2e::standin_vcluster::package_chart(
        helm.bin(),
        &dir,
        e2e::standin_vcluster::CHART_VERSION,
    )
    .expect("package the stand-in chart");
    let (controller, _) = operator_binaries().expect("operator binaries");
    let run = |controller: &std::path::Path| {
        let script = check.replacen(
            prefix,
            &format!(
                "controller='{}' helm='{}' chart='{}' ",
                controller.display(),
                helm.bin().display(),
                chart.display()
            ),
            1,
        );
        std::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(&dir)
            .env("KUBECONFIG", dir.join("no-cluster"))
            .output()
            .expect("bash")
    };
    let out = run(&controller);
    assert!(
        out.status.success(),
        "the controller's values: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A controller whose values the chart refuses, and one whose values make a StatefulSet.
    for (name, values) in [
        ("unknown-key", "platformOperator:\n  hostNamespace: x\n"),
        (
            "statefulset",
            "controlPlane:\n  statefulSet:\n    persistence:\n      volumeClaim:\n        enabled: true\n",
        ),
    ] {
        let fake = dir.join(format!("controller-{name}"));
        std::fs::write(&fake, format!("#!/bin/sh\ncat <<'V'\n{values}V\n")).expect("fake");
        let chmod = std::process::Command::new("chmod")
            .arg("+x")
            .arg(&fake)
            .status()
            .expect("chmod");
        assert!(chmod.success());
        let out = run(&fake);
        assert!(
            !out.status.success()
                && String::from_utf8_lossy(&out.stderr).contains("rendered no Deployment vcluster"),
            "{name} must fail the build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
