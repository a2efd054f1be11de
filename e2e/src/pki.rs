//! Certificates for a test control plane, issued with `rcgen`: one CA, the API server's serving
//! certificate for the loopback address, an admin client certificate (group `system:masters`)
//! and the service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
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
        let ca_key = KeyPair::generate().map_err(pki_err("CA key"))?;
        let ca_key_pem = ca_key.serialize_pem();
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_err("CA params"))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name = name("platform-operator-e2e-ca", None);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca =
            CertifiedIssuer::self_signed(ca_params, ca_key).map_err(pki_err("CA certificate"))?;

        let serving_key = KeyPair::generate().map_err(pki_err("serving key"))?;
        let mut serving = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])
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

        let client = |cn: &str| -> Result<(String, String), HarnessError> {
            let key = KeyPair::generate().map_err(pki_err("client key"))?;
            let mut params =
                CertificateParams::new(Vec::<String>::new()).map_err(pki_err("client params"))?;
            params.distinguished_name = name(cn, None);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params
                .signed_by(&key, &ca)
                .map_err(pki_err("client certificate"))?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let controller_manager = client("system:kube-controller-manager")?;
        let scheduler = client("system:kube-scheduler")?;
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

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}
