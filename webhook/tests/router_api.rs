//! Router tests against the real local API server: the clientSecretRef rule asks it, with a
//! SubjectAccessReview, whether the requester may read the Secret, whenever anything under
//! tenantAuth is new or changed.

mod support;

use serde_json::json;
use support::*;

#[tokio::test]
async fn secret_references_need_read_access_checked_by_the_api_server() {
    let cluster = e2e::shared().unwrap_or_else(|e| panic!("control plane: {e}"));
    let h = harness_with(cluster.client().await.expect("client"), 24);
    let ns = format!("router-secrets-{}", std::process::id());
    let mut create = cluster.kubectl();
    create.args(["create", "namespace", &ns]);
    e2e::cmd::run(create, None)
        .expect("kubectl")
        .ok("create namespace")
        .expect("namespace");
    let with_ref = |secret: &str| {
        instance(
            &ns,
            "auth",
            json!({"version": "6.0.22", "platform": {"tenantAuth": {
                "image": format!("ghcr.io/di-framework/tenant-auth@sha256:{}", "a".repeat(64)),
                "issuer": "https://id.example",
                "clientId": "console",
                "clientSecretRef": {"name": secret, "key": "clientSecret"}
            }}}),
        )
    };
    let nobody = json!({"username": "nobody", "groups": ["system:authenticated"]});
    denied(
        &answer(
            &h,
            "/validate",
            &review("u-s1", "CREATE", with_ref("oauth"), None, nobody.clone()),
        )
        .await,
        &[
            "spec.platform.tenantAuth.clientSecretRef",
            "nobody may not get Secret",
            "oauth",
        ],
    );
    // An unchanged reference on UPDATE is not re-checked: editing the version needs no Secret access.
    let kept = answer(
        &h,
        "/validate",
        &review(
            "u-s2",
            "UPDATE",
            with_ref("oauth"),
            Some(with_ref("oauth")),
            nobody.clone(),
        ),
    )
    .await;
    assert_eq!(kept["allowed"], true, "{kept}");
    // But anything else under tenantAuth (where the secret is sent, what runs with it) is: an
    // editor who may not read the Secret cannot redirect it by keeping the reference as it is.
    let mut redirected = with_ref("oauth");
    redirected["spec"]["platform"]["tenantAuth"]["issuer"] = json!("https://attacker.example");
    for (uid, changed) in [
        ("u-s6", redirected),
        ("u-s7", {
            let mut other = with_ref("oauth");
            other["spec"]["platform"]["tenantAuth"]["image"] =
                json!(format!("ghcr.io/attacker/auth@sha256:{}", "b".repeat(64)));
            other
        }),
        ("u-s8", {
            let mut other = with_ref("oauth");
            other["spec"]["platform"]["tenantAuth"]["registry"] = json!({"component": format!("ghcr.io/attacker/registry@sha256:{}", "c".repeat(64))});
            other
        }),
    ] {
        denied(
            &answer(
                &h,
                "/validate",
                &review(
                    uid,
                    "UPDATE",
                    changed,
                    Some(with_ref("oauth")),
                    nobody.clone(),
                ),
            )
            .await,
            &[
                "spec.platform.tenantAuth.clientSecretRef",
                "nobody may not get Secret",
            ],
        );
    }

    // The webhook reads no Secret: a missing one is admitted without a word (the controller
    // reports it in a condition), so a folder of manifests applies in any order.
    let missing = answer(
        &h,
        "/validate",
        &review("u-s3", "CREATE", with_ref("oauth"), None, admin()),
    )
    .await;
    assert_eq!(missing["allowed"], true, "{missing}");
    assert!(warnings(&missing).is_empty(), "{missing}");
    // Without an API server to ask, a reference is denied, never admitted unchecked.
    let offline = offline();
    denied(
        &answer(
            &offline,
            "/validate",
            &review("u-s5", "CREATE", with_ref("oauth"), None, admin()),
        )
        .await,
        &["could not check whether you may read Secret"],
    );

    let mut secret = cluster.kubectl();
    secret.args([
        "-n",
        &ns,
        "create",
        "secret",
        "generic",
        "oauth",
        "--from-literal=clientSecret=s3cret",
    ]);
    e2e::cmd::run(secret, None)
        .expect("kubectl")
        .ok("create secret")
        .expect("secret");
    let present = answer(
        &h,
        "/validate",
        &review("u-s4", "CREATE", with_ref("oauth"), None, admin()),
    )
    .await;
    assert_eq!(present["allowed"], true, "{present}");
    assert!(warnings(&present).is_empty(), "{present}");
    assert!(
        !present.to_string().contains("s3cret"),
        "secret values never leave the webhook"
    );
}
