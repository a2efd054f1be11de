//! Vetting the kubeconfig a vCluster exports before the controller uses it: whoever can write
//! that Secret chooses what a client built from it does, so only inline material is accepted (a
//! server, a CA, a client certificate and key, a token); anything else is refused by name.

use serde_json::Value;

/// Why an exported kubeconfig was refused; the message names the entry and the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigRefused {
    /// It is not a YAML mapping.
    #[error("it is not a kubeconfig (a YAML mapping): {0}")]
    Unreadable(String),
    /// A key outside the accepted inline material.
    #[error("{section} {entry:?} sets {key}, which the controller does not accept")]
    Key {
        section: &'static str,
        entry: String,
        key: String,
    },
    /// A cluster's server is not an `https://` URL.
    #[error("cluster {entry:?} has server {server:?}; only https:// servers are accepted")]
    Server { entry: String, server: String },
}

const ROOT: &[&str] = &[
    "apiVersion",
    "kind",
    "clusters",
    "contexts",
    "users",
    "current-context",
    "preferences",
];
/// Keys a cluster may have: the server, its CA inline, and the name its certificate carries.
const CLUSTER: &[&str] = &["server", "certificate-authority-data", "tls-server-name"];
/// Keys a user may have: an inline client certificate and key, or a token.
const USER: &[&str] = &["client-certificate-data", "client-key-data", "token"];
const CONTEXT: &[&str] = &["cluster", "user", "namespace"];

/// Accepts `kubeconfig` only if every cluster, user and context carries inline material alone.
pub fn vet(kubeconfig: &str) -> Result<(), KubeconfigRefused> {
    let root: Value = serde_saphyr::from_str(kubeconfig)
        .map_err(|e| KubeconfigRefused::Unreadable(e.to_string()))?;
    let Value::Object(root) = root else {
        return Err(KubeconfigRefused::Unreadable("not a mapping".into()));
    };
    only("kubeconfig", "", root.keys(), ROOT)?;
    for (list, section, allowed) in [
        ("clusters", "cluster", CLUSTER),
        ("users", "user", USER),
        ("contexts", "context", CONTEXT),
    ] {
        let entries = shaped(root.get(list), Value::as_array, || {
            format!("{list} is not a list")
        })?;
        for entry in entries.into_iter().flatten() {
            let Value::Object(entry) = entry else {
                return Err(KubeconfigRefused::Unreadable(format!(
                    "an entry of {list} is not a mapping"
                )));
            };
            let name = entry
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            only(section, name, entry.keys(), &["name", section])?;
            let not_a_mapping = || format!("{section} {name:?} is not a mapping");
            let Some(body) = shaped(entry.get(section), Value::as_object, not_a_mapping)? else {
                continue;
            };
            only(section, name, body.keys(), allowed)?;
            let server = body.get("server").and_then(Value::as_str).unwrap_or("");
            if section == "cluster" && !server.starts_with("https://") {
                return Err(KubeconfigRefused::Server {
                    entry: name.to_string(),
                    server: server.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// `value` as `as_kind` reads it, `None` when absent or null; `Err` saying `what` else.
fn shaped<T: ?Sized>(
    value: Option<&Value>,
    as_kind: fn(&Value) -> Option<&T>,
    what: impl FnOnce() -> String,
) -> Result<Option<&T>, KubeconfigRefused> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_kind(v)
            .map(Some)
            .ok_or_else(|| KubeconfigRefused::Unreadable(what())),
    }
}

/// Every key is one of `allowed`.
fn only<'a>(
    section: &'static str,
    entry: &str,
    keys: impl IntoIterator<Item = &'a String>,
    allowed: &[&str],
) -> Result<(), KubeconfigRefused> {
    match keys.into_iter().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(KubeconfigRefused::Key {
            section,
            entry: entry.to_string(),
            key: key.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What vCluster exports: inline CA, client certificate and key.
    const EXPORTED: &str = "apiVersion: v1
kind: Config
clusters:
- name: my-vcluster
  cluster:
    server: https://vcluster.pi-a-b-1234.svc:443
    certificate-authority-data: Q0E=
contexts:
- name: my-vcluster
  context:
    cluster: my-vcluster
    user: my-vcluster
current-context: my-vcluster
preferences: {}
users:
- name: my-vcluster
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
";

    #[test]
    fn what_vcluster_exports_is_accepted() {
        assert_eq!(vet(EXPORTED), Ok(()));
        let token = EXPORTED.replace(
            "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n",
            "    token: abc\n",
        );
        assert_eq!(vet(&token), Ok(()));
    }

    #[test]
    fn exec_auth_providers_files_and_proxies_are_refused() {
        let user = "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n";
        for (replacement, key) in [
            (
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'curl evil']\n",
                "exec",
            ),
            (
                "    auth-provider:\n      name: oidc\n      config: {idp-issuer-url: https://evil}\n",
                "auth-provider",
            ),
            (
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "tokenFile",
            ),
            (
                "    client-certificate: /etc/cert\n    client-key: /etc/key\n",
                "client-certificate",
            ),
            ("    username: a\n    password: b\n", "password"),
            ("    as: system:admin\n", "as"),
        ] {
            let refused = vet(&EXPORTED.replace(user, replacement));
            assert!(
                matches!(&refused, Err(KubeconfigRefused::Key { section: "user", key: k, .. }) if k == key),
                "{key}: {refused:?}"
            );
        }
        for (line, key) in [
            ("    proxy-url: http://evil:3128\n", "proxy-url"),
            (
                "    certificate-authority: /etc/ca\n",
                "certificate-authority",
            ),
            (
                "    insecure-skip-tls-verify: true\n",
                "insecure-skip-tls-verify",
            ),
        ] {
            let with = EXPORTED.replace(
                "    certificate-authority-data: Q0E=\n",
                &format!("    certificate-authority-data: Q0E=\n{line}"),
            );
            assert!(
                matches!(vet(&with), Err(KubeconfigRefused::Key { section: "cluster", key: k, .. }) if k == key),
                "{key}"
            );
        }
        let plain = EXPORTED.replace("https://vcluster", "http://vcluster");
        assert!(matches!(vet(&plain), Err(KubeconfigRefused::Server { .. })));
        let unknown_root = format!("{EXPORTED}extensions: []\n");
        assert!(matches!(
            vet(&unknown_root),
            Err(KubeconfigRefused::Key {
                section: "kubeconfig",
                ..
            })
        ));
        assert!(matches!(
            vet("- a\n- b\n"),
            Err(KubeconfigRefused::Unreadable(_))
        ));
        let message = vet(&EXPORTED.replace(user, "    exec: {command: sh}\n"))
            .expect_err("refused")
            .to_string();
        assert_eq!(
            message,
            "user \"my-vcluster\" sets exec, which the controller does not accept"
        );
    }

    proptest::proptest! {
        /// Any text at all: an answer, never a panic; and a refusal for anything that is not a
        /// mapping of accepted keys.
        #[test]
        fn any_text_gets_an_answer(text in "\\PC{0,400}") {
            let _ = vet(&text);
        }

        /// Any extra user key outside the accepted three is refused.
        #[test]
        fn any_other_user_key_is_refused(key in "[a-zA-Z-]{1,20}") {
            proptest::prop_assume!(!USER.contains(&key.as_str()));
            let with = EXPORTED.replace(
                "    client-key-data: S0VZ\n",
                &format!("    client-key-data: S0VZ\n    {key}: x\n"),
            );
            let refused = matches!(vet(&with), Err(KubeconfigRefused::Key { .. }));
            proptest::prop_assert!(refused);
        }
    }
}
