//! The test npm registry's own set-up: before any test installs the stand-in, its dependencies
//! are in the registry's uplink cache, fetched by a real npm install that asks for no stand-in
//! tarball (so the tests' download counts are only their own).

use e2e::npm::{STANDIN_PACKAGE, STANDIN_VERSIONS, count_tarball_gets};

#[test]
fn the_shared_registry_starts_with_the_standins_dependencies_in_its_uplink_cache() {
    let registry = e2e::npm::shared().unwrap_or_else(|e| panic!("npm registry: {e}"));
    let uplinks = e2e::npm::uplink_cache_dir();
    let stamp = std::fs::read_to_string(uplinks.join(".warmed")).expect("the warm-up's stamp");
    assert!(stamp.contains("\"@pulumi/pulumi\""), "{stamp}");
    // Verdaccio keeps each proxied package in a folder of its own, with its tarballs.
    let sdk = uplinks.join("@pulumi/pulumi");
    let tarballs = std::fs::read_dir(&sdk)
        .unwrap_or_else(|e| panic!("{}: {e}", sdk.display()))
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tgz"))
        .count();
    assert!(
        tarballs >= 1,
        "no @pulumi/pulumi tarball in {}",
        sdk.display()
    );

    // What the warm-up runs (on a warm machine `shared` skipped it by its stamp), run here again:
    // every dependency tarball asked of this registry, no stand-in's, and the folder removed.
    registry
        .install_standin_dependencies()
        .expect("installing the stand-in's dependencies");
    let log = std::fs::read_to_string(registry.log()).expect("verdaccio's log");
    let sdk_version = stamp
        .split("\"@pulumi/pulumi\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the SDK's version in the stamp");
    assert!(
        count_tarball_gets(&log, "@pulumi/pulumi", sdk_version) >= 1,
        "npm did not ask this registry for @pulumi/pulumi@{sdk_version}"
    );
    for (version, _) in STANDIN_VERSIONS {
        assert_eq!(
            registry.tarball_downloads(STANDIN_PACKAGE, version),
            0,
            "installing the dependencies asked for the stand-in {version}"
        );
    }
    assert!(
        !registry.dir().join("warm").exists(),
        "the scratch folder is removed"
    );
    // Once stamped, warming is a no-op.
    registry.warm_uplinks().expect("warm again");
}
