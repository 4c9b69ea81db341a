//! The binary itself: `livegate --version` names this crate's version. (The behaviour is
//! tested by the integration tests, the package in `tests/it`; this test also has
//! `cargo test` build the binary they start.)

#[test]
fn version_names_the_crate_version() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_livegate"))
        .arg("--version")
        .output()
        .expect("run livegate --version");
    assert!(out.status.success(), "livegate --version failed: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")), "`livegate --version` printed {stdout:?}");
}
