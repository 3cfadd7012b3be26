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
    // x86-64 Linux with 64-bit pointers (not x32, whose system calls differ).
    let wide = std::env::var("CARGO_CFG_TARGET_POINTER_WIDTH").is_ok_and(|w| w == "64");
    if !(target.starts_with("x86_64-") && target.contains("-linux-") && wide) {
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
    // Beside the binaries: OUT_DIR is <target dir>/<profile>/build/<package>-<hash>/out (with
    // Cargo's default layout; a separate `build.build-dir` leaves the lean shim out, and
    // `install-shims` links to `agentos-shim-full`).
    let Some(bins) = out.ancestors().nth(3) else { return };
    // The lean shim only makes calls faster: a build that cannot make it (another linker, a
    // newer compiler's lint) goes on without it, says so, and leaves no older one behind.
    let built = cmd.status();
    if !built.as_ref().is_ok_and(|s| s.success()) {
        println!(
            "cargo:warning=the lean agentos-shim (lean/shim.rs) was not built ({built:?}); shims link to agentos-shim-full"
        );
        let _ = std::fs::remove_file(bins.join("agentos-shim"));
        return;
    }
    // Written under another name and renamed, so that a build running beside this one never
    // sees half.
    let tmp = bins.join(format!(".agentos-shim.{}", std::process::id()));
    std::fs::copy(&exe, &tmp).expect("copy the lean agentos-shim beside the binaries");
    std::fs::rename(&tmp, bins.join("agentos-shim")).expect("put the lean agentos-shim beside the binaries");
}
