//! The test npm registry's own set-up: before any test installs the stand-in, its dependencies
//! are in the registry's uplink cache, fetched once, and no stand-in tarball was asked for.

use e2e::npm::{STANDIN_PACKAGE, STANDIN_VERSIONS};

#[test]
fn the_shared_registry_starts_with_the_standins_dependencies_in_its_uplink_cache() {
    let registry = e2e::npm::shared().unwrap_or_else(|e| panic!("npm registry: {e}"));
    let uplinks = e2e::npm::uplink_cache_dir();
    let stamp = std::fs::read_to_string(uplinks.join(".warmed")).expect("the warm-up's stamp");
    assert!(stamp.contains("@pulumi/pulumi"), "{stamp}");
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
    for (version, _) in STANDIN_VERSIONS {
        assert_eq!(
            registry.tarball_downloads(STANDIN_PACKAGE, version),
            0,
            "the warm-up asked for the stand-in {version}"
        );
    }
    // A second call is answered by the stamp, without npm.
    registry.warm_uplinks().expect("warm again");
    assert!(
        !registry.dir().join("warm").exists(),
        "the warm-up's folder is removed"
    );
}
