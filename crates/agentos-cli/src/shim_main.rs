//! `agentos-shim-full`: a toolkit's call as a small program. The lean `agentos-shim` (see
//! `lean/shim.rs`), which shims link to on x86-64 Linux, hands it every call it does not make
//! itself, and elsewhere `agentos install-shims` links to this program. A toolkit's call is one
//! HTTP exchange, and this program is small so that starting it costs little next to that: no
//! async runtime, no TLS, no HTTP library, a few hundred relocations instead of the tens of
//! thousands of the whole `agentos` binary, and none of the Rust runtime's own start (see
//! [`main`]). A master at an `https://` URL, or one behind a proxy, is reached by the `agentos`
//! binary beside this one, run in its place under the same name (it is a toolkit too).

// The C library calls `main` below directly: the Rust runtime's start-up is skipped. (A test
// build keeps the harness's own `main`, which runs the modules' tests.)
#![cfg_attr(not(test), no_main)]
// What the test build leaves out of reach: the entry below and what only it calls.
#![cfg_attr(test, allow(dead_code))]

#[macro_use]
mod errln;

mod call;
mod lean_http;
mod toolkit;

use std::os::unix::process::CommandExt;

/// The process's entry, called by the C library instead of the Rust runtime's. That start-up
/// finds the main thread's stack bounds (reading `/proc/self/maps`) and sets up an alternate
/// signal stack to report stack overflows: a dozen system calls and the kernel writing out the
/// process's whole memory map, for a program that runs for a millisecond on a shallow stack.
/// What this program uses of the runtime needs none of it: arguments and environment come from
/// the C library as before, and a panic is still reported on stderr (exit status 101, as the
/// runtime gives). Standard output is flushed here, as the runtime would at exit.
#[cfg(not(test))]
#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: std::ffi::c_int, _argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    let status = std::panic::catch_unwind(shim).unwrap_or(101);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    status.into()
}

fn shim() -> u8 {
    // A reader that stops reading (`agentos-x tool | head -c1`) ends this process quietly, as
    // other command-line tools do, instead of a failed write.
    // SAFETY: restores the default action of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let Some(toolkit) = toolkit::toolkit_of_argv0() else {
        errln!("agentos-shim: run me through a link named agentos-<toolkit> (see `agentos install-shims`)");
        return call::EXIT_USAGE;
    };
    let target = call::Target::from_env();
    // An address that names no master is refused by `toolkit::run`, in one line.
    if url::Url::parse(&target.url).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && !lean_http::usable(&u)) {
        return whole_agentos();
    }
    toolkit::run(toolkit, std::env::args_os().skip(1).collect(), |t, _, _, _, _| {
        Err(t.unreachable(&"this master is not reached by a plain HTTP exchange"))
    })
}

/// Runs the `agentos` binary in this process's place, with the same name and arguments: nothing
/// was read or sent yet. The one beside this program (where a link leads), else the first on
/// `PATH` (a shim copied rather than linked).
fn whole_agentos() -> u8 {
    let mut args = std::env::args_os();
    let name = args.next().unwrap_or_default();
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("agentos")));
    let Some(agentos) = beside.filter(|p| runnable(p)).or_else(on_path) else {
        errln!(
            "agentos-shim: an https:// or proxied master needs the agentos binary, and it is neither beside this one nor on PATH"
        );
        return call::EXIT_UNREACHABLE;
    };
    let e = std::process::Command::new(&agentos).arg0(name).args(args).exec();
    errln!("agentos-shim: cannot run {}: {e}", agentos.display());
    call::EXIT_UNREACHABLE
}

/// A file some user may execute.
fn runnable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first `agentos` on `PATH`.
fn on_path() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("agentos")).find(|p| runnable(p))
}
