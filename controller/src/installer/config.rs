//! Maps an instance's `spec.platform` onto the program's plaintext settings, its secret values
//! (Pulumi secrets, never in argv) and a hash of both, so any change re-applies the program.
//! Pure: the caller reads the Secrets.

use common::crd::PlatformSettings;
use serde_json::{Value, json};

/// The stack config key of the plaintext settings object.
pub const SETTINGS_KEY: &str = "platform:settings";
/// The stack config key of the target cluster's admin kubeconfig (a secret).
pub const KUBECONFIG_KEY: &str = "platform:kubeconfig";
/// The stack config key of tenant auth's OAuth client secret (a secret).
pub const CLIENT_SECRET_KEY: &str = "platform:tenantAuthClientSecret";
/// The stack config key that lists the packages whose default providers are disabled.
pub const DISABLE_DEFAULT_PROVIDERS_KEY: &str = "pulumi:disable-default-providers";

/// A secret value: its `Debug` shows `..`, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(pub String);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("..")
    }
}

/// What one install gives the program.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramConfig {
    /// The plaintext settings (no secret in it).
    pub settings: Value,
    /// Secret stack config values: (key, value).
    pub secrets: Vec<(&'static str, Redacted)>,
    /// A hash over the settings and the secrets (salted with the instance's UID, so the hash
    /// recorded in status says nothing about a secret's value).
    pub hash: String,
}

/// Where the pieces come from.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// `spec.platform` (`None`: every default).
    pub platform: Option<&'a PlatformSettings>,
    /// The node-local storage root of this instance (under `--storage-root-base`).
    pub storage_root: String,
    /// The vCluster's API URL, as its kubeconfig names it.
    pub kubernetes_endpoint: String,
    /// The vCluster's admin kubeconfig.
    pub kubeconfig: String,
    /// Tenant auth's client secret, read from `clientSecretRef` (when tenant auth is set).
    pub client_secret: Option<String>,
    /// The instance's UID (salts the hash).
    pub uid: String,
}

/// The program's plaintext settings for `inputs`.
pub fn settings(inputs: &Inputs<'_>) -> Value {
    let mut out = match inputs.platform.map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => serde_json::Map::new(),
    };
    out.retain(|_, v| !v.is_null());
    if let Some(Value::Object(auth)) = out.get_mut("tenantAuth") {
        auth.remove("clientSecretRef");
    }
    // The gateway's URLs are top-level settings of the platform (seed 003).
    for key in ["httpEndpoint", "routeUrlPattern"] {
        if let Some(value) = out
            .get_mut("gateway")
            .and_then(Value::as_object_mut)
            .and_then(|gateway| gateway.remove(key))
        {
            out.insert(key.into(), value);
        }
    }
    for (key, default) in [
        ("tenants", json!([])),
        ("users", json!([])),
        ("egressAllowedDestinations", json!([])),
        ("networkPolicyEngine", json!("existing")),
        ("gateway", json!({"httpNodePort": 0})),
    ] {
        out.entry(key).or_insert(default);
    }
    out.insert("storageRoot".into(), json!(inputs.storage_root));
    out.insert(
        "kubernetesEndpoint".into(),
        json!(inputs.kubernetes_endpoint),
    );
    Value::Object(out)
}

/// Everything one install gives the program, with its hash.
pub fn program_config(inputs: &Inputs<'_>) -> ProgramConfig {
    let settings = settings(inputs);
    let mut secrets = vec![(KUBECONFIG_KEY, Redacted(inputs.kubeconfig.clone()))];
    if let Some(secret) = &inputs.client_secret {
        secrets.push((CLIENT_SECRET_KEY, Redacted(secret.clone())));
    }
    let settings_text = settings.to_string();
    let mut parts: Vec<&[u8]> = vec![inputs.uid.as_bytes(), settings_text.as_bytes()];
    parts.extend(
        secrets
            .iter()
            .flat_map(|(k, v)| [k.as_bytes(), v.0.as_bytes()]),
    );
    let hash = format!("sha256:{}", &super::modules::sha256_hex(&parts)[..16]);
    ProgramConfig {
        settings,
        secrets,
        hash,
    }
}

/// The API server URL of the current context of `kubeconfig` (the vCluster's endpoint).
pub fn kubeconfig_server(kubeconfig: &str) -> Option<String> {
    let config = kube::config::Kubeconfig::from_yaml(kubeconfig).ok()?;
    let context_name = config.current_context.clone()?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)?
        .context
        .as_ref()?;
    config
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)?
        .cluster
        .as_ref()?
        .server
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(yaml: &str) -> PlatformSettings {
        serde_saphyr::from_str(yaml).expect("platform settings")
    }

    fn inputs<'a>(p: Option<&'a PlatformSettings>, secret: Option<&str>) -> Inputs<'a> {
        Inputs {
            platform: p,
            storage_root: "/var/lib/kubesolo/instances/pi-team-a-one-1234".into(),
            kubernetes_endpoint: "https://vcluster.pi-team-a-one-1234.svc:443".into(),
            kubeconfig: "apiVersion: v1\nkind: Config\n".into(),
            client_secret: secret.map(String::from),
            uid: "uid-1".into(),
        }
    }

    #[test]
    fn every_setting_reaches_the_program_and_no_secret_does() {
        let p = platform(
            r#"
networkPolicyEngine: kube-router
gateway: { httpNodePort: 30080, httpEndpoint: "http://apps.example:30080", routeUrlPattern: "http://{route}.{tenant}.apps.example:30080/" }
tenants: [{ name: acme }]
users: [{ name: dev, memberships: [{ tenant: acme, role: developer }] }]
tenantAuth:
  image: "ghcr.io/di-framework/tenant-auth@sha256:0000000000000000000000000000000000000000000000000000000000000000"
  issuer: https://id.example
  clientId: console
  clientSecretRef: { name: oauth, key: clientSecret }
  registry: { component: "ghcr.io/di-framework/oci-registry@sha256:1111111111111111111111111111111111111111111111111111111111111111" }
tenantHostImage: "ghcr.io/di-framework/wash@sha256:2222222222222222222222222222222222222222222222222222222222222222"
tenantHostImagePullPolicy: IfNotPresent
egressAllowedDestinations: ["https://api.example"]
"#,
        );
        let config = program_config(&inputs(Some(&p), Some("s3cret")));
        let s = &config.settings;
        assert_eq!(s["networkPolicyEngine"], "kube-router");
        assert_eq!(s["gateway"], json!({"httpNodePort": 30080}));
        assert_eq!(s["httpEndpoint"], "http://apps.example:30080");
        assert_eq!(
            s["routeUrlPattern"],
            "http://{route}.{tenant}.apps.example:30080/"
        );
        assert_eq!(s["tenants"], json!([{"name": "acme"}]));
        assert_eq!(
            s["users"][0]["memberships"][0],
            json!({"tenant": "acme", "role": "developer"})
        );
        assert_eq!(s["tenantAuth"]["issuer"], "https://id.example");
        assert_eq!(s["tenantAuth"]["clientId"], "console");
        assert!(s["tenantAuth"]["registry"]["component"].is_string());
        assert!(s["tenantAuth"].get("clientSecretRef").is_none());
        assert_eq!(s["tenantHostImagePullPolicy"], "IfNotPresent");
        assert!(
            s["tenantHostImage"]
                .as_str()
                .is_some_and(|i| i.contains("wash"))
        );
        assert_eq!(
            s["egressAllowedDestinations"],
            json!(["https://api.example"])
        );
        assert_eq!(
            s["storageRoot"],
            "/var/lib/kubesolo/instances/pi-team-a-one-1234"
        );
        assert_eq!(
            s["kubernetesEndpoint"],
            "https://vcluster.pi-team-a-one-1234.svc:443"
        );
        assert!(!s.to_string().contains("s3cret"));
        assert!(!format!("{config:?}").contains("s3cret"));
        assert!(!config.hash.contains("s3cret"));
        assert_eq!(
            config.secrets.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [KUBECONFIG_KEY, CLIENT_SECRET_KEY]
        );
    }

    #[test]
    fn defaults_without_spec_platform() {
        let config = program_config(&inputs(None, None));
        assert_eq!(config.settings["tenants"], json!([]));
        assert_eq!(config.settings["users"], json!([]));
        assert_eq!(config.settings["egressAllowedDestinations"], json!([]));
        assert_eq!(config.settings["networkPolicyEngine"], "existing");
        assert_eq!(config.settings["gateway"], json!({"httpNodePort": 0}));
        assert!(config.settings.get("httpEndpoint").is_none());
        assert!(config.settings.get("routeUrlPattern").is_none());
        assert_eq!(config.secrets.len(), 1);
    }

    #[test]
    fn the_hash_follows_settings_and_secrets() {
        let a = program_config(&inputs(None, None));
        assert_eq!(a.hash, program_config(&inputs(None, None)).hash);
        assert!(a.hash.starts_with("sha256:") && a.hash.len() == 7 + 16);
        let p = platform("tenants: [{ name: acme }]");
        assert_ne!(a.hash, program_config(&inputs(Some(&p), None)).hash);
        assert_ne!(
            program_config(&inputs(None, Some("one"))).hash,
            program_config(&inputs(None, Some("two"))).hash,
            "a new client secret re-applies the program"
        );
        let mut other = inputs(None, None);
        other.uid = "uid-2".into();
        assert_ne!(a.hash, program_config(&other).hash, "salted per instance");
    }

    #[test]
    fn reads_the_server_of_the_current_context() {
        let kubeconfig = r#"
apiVersion: v1
kind: Config
current-context: b
clusters:
- name: a
  cluster: { server: "https://a:443" }
- name: b
  cluster: { server: "https://vcluster.pi-x.svc:443" }
contexts:
- name: a
  context: { cluster: a, user: u }
- name: b
  context: { cluster: b, user: u }
users:
- name: u
  user: { token: t }
"#;
        assert_eq!(
            kubeconfig_server(kubeconfig).as_deref(),
            Some("https://vcluster.pi-x.svc:443")
        );
        assert_eq!(kubeconfig_server("not yaml: ["), None);
    }
}
