//! `agentos-shim`: what `agentos install-shims` links `agentos-{toolkit}` to. A toolkit's call
//! is one HTTP exchange, and this program is small so that starting it costs little next to
//! that: no async runtime, no TLS, no HTTP library, a few hundred relocations instead of the
//! tens of thousands of the whole `agentos` binary. A master at an `https://` URL, or one
//! behind a proxy, is reached by the `agentos` binary beside this one, run in its place under
//! the same name (it is a toolkit too).

mod call;
mod lean_http;
mod toolkit;

use std::os::unix::process::CommandExt;
use std::process::ExitCode;

fn main() -> ExitCode {
    // A reader that stops reading (`agentos-x tool | head -c1`) ends this process quietly, as
    // other command-line tools do, instead of a failed write.
    // SAFETY: restores the default action of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let Some(toolkit) = toolkit::toolkit_of_argv0() else {
        eprintln!("agentos-shim: run me through a link named agentos-<toolkit> (see `agentos install-shims`)");
        return ExitCode::from(call::EXIT_USAGE);
    };
    let target = call::Target::from_env();
    if !url::Url::parse(&target.url).is_ok_and(|u| lean_http::usable(&u)) {
        return whole_agentos();
    }
    toolkit::run(toolkit, std::env::args().skip(1).collect(), |t, _, _, _, _| {
        Err(t.unreachable(&"this master is not reached by a plain HTTP exchange"))
    })
}

/// Runs the `agentos` binary beside this one in this process's place, with the same name and
/// arguments: nothing was read or sent yet.
fn whole_agentos() -> ExitCode {
    let mut args = std::env::args_os();
    let name = args.next().unwrap_or_default();
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("agentos")));
    let Some(agentos) = beside.filter(|p| p.is_file()) else {
        eprintln!(
            "agentos-shim: an https:// or proxied master needs the agentos binary beside this one, and it is not there"
        );
        return ExitCode::from(call::EXIT_UNREACHABLE);
    };
    let e = std::process::Command::new(&agentos).arg0(name).args(args).exec();
    eprintln!("agentos-shim: cannot run {}: {e}", agentos.display());
    ExitCode::from(call::EXIT_UNREACHABLE)
}
