//! Writes the generated CRD into the chart's `crds/` folder and the field reference into
//! `docs/reference.md`, from the Rust types in `common/src/crd.rs`.
//!
//! `cargo run -p common --bin crdgen` writes both; `-- --check` only reports whether they are current.

use std::path::Path;

fn main() -> std::process::ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = false;
    for (rel, content) in [
        (common::schema::CRD_PATH, common::schema::crd_yaml()),
        (
            common::schema::REFERENCE_PATH,
            common::schema::reference_markdown(),
        ),
    ] {
        let path = root.join(rel);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == content {
            println!("{rel}: up to date");
            continue;
        }
        if check {
            eprintln!("{rel}: stale; run `cargo run -p common --bin crdgen`");
            stale = true;
        } else if let Err(e) = std::fs::write(&path, content) {
            eprintln!("{rel}: cannot write: {e}");
            return std::process::ExitCode::FAILURE;
        } else {
            println!("{rel}: written");
        }
    }
    if stale {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
