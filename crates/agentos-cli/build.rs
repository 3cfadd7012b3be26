//! Builds the lean `agentos-shim` (`lean/shim.rs`) on x86-64 Linux and puts it beside the
//! binaries Cargo builds. It has no C library and no `std`, so it must abort on a panic, and
//! Cargo sets the panic strategy per profile, not per binary: `rustc` is run here directly, on
//! a program with no dependencies. Elsewhere no lean shim is built, and `agentos install-shims`
//! links to `agentos-shim-full`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=lean");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !(target.starts_with("x86_64-") && target.contains("-linux-")) {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let exe = out.join("agentos-shim");
    let mut cmd = Command::new(rustc);
    cmd.args(["--edition", "2024", "--crate-type", "bin", "--crate-name", "agentos_shim", "--target", &target])
        .args(["-C", "panic=abort", "-C", "opt-level=2", "-C", "relocation-model=static", "-C", "debuginfo=0"])
        .args(["-C", "strip=symbols", "-D", "warnings"])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib", "-C", "link-arg=-static"])
        .arg("-o")
        .arg(&exe)
        .arg("lean/shim.rs");
    let status = cmd.status().expect("run rustc for lean/shim.rs");
    assert!(status.success(), "rustc could not build lean/shim.rs (the lean agentos-shim): {status}");
    // Beside the binaries: OUT_DIR is <target dir>/<profile>/build/<package>-<hash>/out. Written
    // under another name and renamed, so that a build running beside this one never sees half.
    let Some(bins) = out.ancestors().nth(3) else { return };
    let tmp = bins.join(format!(".agentos-shim.{}", std::process::id()));
    std::fs::copy(&exe, &tmp).expect("copy the lean agentos-shim beside the binaries");
    std::fs::rename(&tmp, bins.join("agentos-shim")).expect("put the lean agentos-shim beside the binaries");
}
