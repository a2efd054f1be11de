//! Certificates for a test control plane, issued with `rcgen`: one CA, the API server's serving
//! certificate for the loopback address, an admin client certificate (group `system:masters`)
//! and the service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::HarnessError;

/// The user name of the admin client certificate (group `system:masters`).
pub const ADMIN_USER: &str = "platform-operator-e2e-admin";

/// Files written by [`Pki::write`].
#[derive(Debug, Clone)]
pub struct PkiFiles {
    /// The CA certificate (PEM), trusted for serving and client certificates.
    pub ca_cert: PathBuf,
    /// The CA key (PEM), for the controller-manager's signers.
    pub ca_key: PathBuf,
    /// The API server's serving certificate.
    pub serving_cert: PathBuf,
    /// Its key.
    pub serving_key: PathBuf,
    /// The service-account signing key (PKCS#8 PEM).
    pub service_account_key: PathBuf,
    /// Its public half, for verifying tokens.
    pub service_account_pub: PathBuf,
}

/// PEM material of one control plane.
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate, PEM.
    pub ca_cert: String,
    /// CA key, PEM.
    pub ca_key: String,
    /// Serving certificate, PEM.
    pub serving_cert: String,
    /// Serving key, PEM.
    pub serving_key: String,
    /// Admin client certificate, PEM.
    pub admin_cert: String,
    /// Admin client key, PEM.
    pub admin_key: String,
    /// kube-controller-manager's client certificate and key (user `system:kube-controller-manager`).
    pub controller_manager: (String, String),
    /// kube-scheduler's client certificate and key (user `system:kube-scheduler`).
    pub scheduler: (String, String),
    /// Service-account signing key, PEM.
    pub service_account_key: String,
    /// Its public key, PEM.
    pub service_account_pub: String,
}

fn pki_err(what: &str) -> impl FnOnce(rcgen::Error) -> HarnessError + '_ {
    move |e| HarnessError::Pki(format!("{what}: {e}"))
}

impl Pki {
    /// Issues a fresh CA and the certificates of one control plane.
    pub fn issue() -> Result<Self, HarnessError> {
        Self::issue_for(&[
            "127.0.0.1",
            // The `kubernetes` Service's ClusterIP, as pods on the real node reach the API server.
            crate::real_node::KUBERNETES_SERVICE_IP,
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ])
    }

    /// Issues a fresh CA and the certificates of one control plane whose API server's default
    /// serving certificate names exactly `serving_names` (DNS names and IP addresses).
    pub fn issue_for(serving_names: &[&str]) -> Result<Self, HarnessError> {
        let ca_key = KeyPair::generate().map_err(pki_err("CA key"))?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params()?, ca_key)
            .map_err(pki_err("CA certificate"))?;

        let serving_key = KeyPair::generate().map_err(pki_err("serving key"))?;
        let mut serving = CertificateParams::new(
            serving_names
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>(),
        )
        .map_err(pki_err("serving params"))?;
        serving.distinguished_name = name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving
            .signed_by(&serving_key, &ca)
            .map_err(pki_err("serving certificate"))?;

        let admin_key = KeyPair::generate().map_err(pki_err("admin key"))?;
        let mut admin =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_err("admin params"))?;
        admin.distinguished_name = name(ADMIN_USER, Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin
            .signed_by(&admin_key, &ca)
            .map_err(pki_err("admin certificate"))?;

        let controller_manager =
            client_certificate(&ca_key_pem, "system:kube-controller-manager", None)?;
        let scheduler = client_certificate(&ca_key_pem, "system:kube-scheduler", None)?;
        let service_account_key = KeyPair::generate().map_err(pki_err("service-account key"))?;
        Ok(Self {
            ca_cert: ca.pem(),
            ca_key: ca_key_pem,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            controller_manager,
            scheduler,
            service_account_pub: service_account_key.public_key_pem(),
            service_account_key: service_account_key.serialize_pem(),
        })
    }

    /// A serving certificate (PEM) and its key (PEM) for exactly `names` (DNS names and IP
    /// addresses), issued by this control plane's CA.
    pub fn serving_certificate(&self, names: &[String]) -> Result<(String, String), HarnessError> {
        serving_certificate(&self.ca_key, names)
    }

    /// Writes the files the control-plane processes read into `dir`.
    pub fn write(&self, dir: &Path) -> Result<PkiFiles, HarnessError> {
        std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
        let write = |file: &str, content: &str| -> Result<PathBuf, HarnessError> {
            let path = dir.join(file);
            std::fs::write(&path, content).map_err(|e| HarnessError::io(&path, e))?;
            Ok(path)
        };
        Ok(PkiFiles {
            ca_cert: write("ca.crt", &self.ca_cert)?,
            ca_key: write("ca.key", &self.ca_key)?,
            serving_cert: write("apiserver.crt", &self.serving_cert)?,
            serving_key: write("apiserver.key", &self.serving_key)?,
            service_account_key: write("sa.key", &self.service_account_key)?,
            service_account_pub: write("sa.pub", &self.service_account_pub)?,
        })
    }
}

/// The parameters of every control plane's CA (its key differs).
fn ca_params() -> Result<CertificateParams, HarnessError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err("CA params"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = name("platform-operator-e2e-ca", None);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// A serving certificate (PEM) and its key (PEM) for exactly `names`, issued by the CA whose key
/// is `ca_key_pem` (a CA of [`Pki::issue`]).
pub fn serving_certificate(
    ca_key_pem: &str,
    names: &[String],
) -> Result<(String, String), HarnessError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(pki_err("CA key"))?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate().map_err(pki_err("serving key"))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(pki_err("serving params"))?;
    params.distinguished_name = name("kube-apiserver", None);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(pki_err("serving certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A client certificate (PEM) and its key (PEM) for the user `user` in the group `group`,
/// issued by the CA whose key is `ca_key_pem`: an identity of its own for a person or a tool.
pub fn client_certificate(
    ca_key_pem: &str,
    user: &str,
    group: Option<&str>,
) -> Result<(String, String), HarnessError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(pki_err("CA key"))?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate().map_err(pki_err("client key"))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(pki_err("client params"))?;
    params.distinguished_name = name(user, group);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(pki_err("client certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}
