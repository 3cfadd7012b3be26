//! jq expressions in worker processes. A jq program can recurse without end or build a value
//! deep enough to overflow the stack, and a stack overflow aborts the whole process: in the
//! master, with a started transition firing again after every restart, that is a crash loop.
//! So a master evaluates expressions in workers (`agentos expr-worker`, one request at a time
//! each, as many as evaluations run at once) bounded in time and memory; a worker that
//! overruns is killed and one that dies is replaced, and the evaluation fails with the reason.
//! Only the program and its input cross: credentials and templates stay in the master.

use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use std::collections::HashMap;

use agentos_core::expr::{Expr, ExprError, Runner};
use serde_json::{Value, json};

/// Address space a worker may use.
const WORKER_MEMORY_BYTES: u64 = 1 << 30;

/// Workers alive at once, at most: evaluations beyond wait for one to be free.
const MAX_WORKERS: usize = 8;

pub struct ExprPool {
    program: PathBuf,
    args: Vec<String>,
    timeout: Duration,
    slots: Mutex<Workers>,
    freed: Condvar,
}

#[derive(Default)]
struct Workers {
    idle: Vec<Worker>,
    /// Workers alive, idle or busy.
    live: usize,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    buf: Vec<u8>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ExprPool {
    /// Workers are `program args..`, which must run [`worker_main`]; an evaluation may take `timeout`.
    pub fn new(program: PathBuf, args: Vec<String>, timeout: Duration) -> Self {
        ExprPool { program, args, timeout, slots: Mutex::new(Workers::default()), freed: Condvar::new() }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Workers> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Workers alive now.
    pub fn live(&self) -> usize {
        self.slots().live
    }

    /// An idle worker, a new one while fewer than [`MAX_WORKERS`] live, or the next one freed.
    fn take(&self) -> Result<Worker, String> {
        let mut slots = self.slots();
        loop {
            if let Some(w) = slots.idle.pop() {
                return Ok(w);
            }
            if slots.live < MAX_WORKERS {
                slots.live += 1;
                drop(slots);
                return self.spawn().inspect_err(|_| self.give_back(None));
            }
            slots = self.freed.wait(slots).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Returns a worker after its evaluation; `None`: it was killed.
    fn give_back(&self, worker: Option<Worker>) {
        let mut slots = self.slots();
        match worker {
            Some(w) => slots.idle.push(w),
            None => slots.live -= 1,
        }
        self.freed.notify_one();
    }

    /// The first output of `src` on `input`, computed by a worker.
    pub fn eval(&self, src: &str, input: &Value) -> Result<Option<Value>, ExprError> {
        let mut line = serde_json::to_vec(&json!({"src": src, "input": input}))
            .map_err(|e| ExprError::Stopped(format!("the input cannot be sent to the evaluator: {e}")))?;
        line.push(b'\n');
        let mut worker = self.take().map_err(ExprError::Stopped)?;
        match worker.ask(&line, self.timeout) {
            Ok(answer) => {
                self.give_back(Some(worker));
                answer
            }
            Err(why) => {
                // Dropping the worker kills it.
                drop(worker);
                self.give_back(None);
                Err(ExprError::Stopped(why))
            }
        }
    }

    fn spawn(&self) -> Result<Worker, String> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            // The master's pid: the worker checks that it is still its parent (see worker_main).
            .env(WORKER_ENV, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start an expression worker ({}): {e}", self.program.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        Ok(Worker { child, stdin, stdout, buf: Vec::new() })
    }
}

impl Worker {
    /// Sends one request and reads its one answer line. `Err`: the worker is no longer usable.
    fn ask(&mut self, line: &[u8], timeout: Duration) -> Result<Result<Option<Value>, ExprError>, String> {
        let died = "the expression stopped its evaluator: it recursed too deep, built too deep a value or used more than 1 GiB";
        self.stdin.write_all(line).map_err(|_| died.to_string())?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let answer: Value = serde_json::from_slice(&self.buf[..end]).map_err(|e| e.to_string())?;
                self.buf.drain(..=end);
                return Ok(match answer.get("err").and_then(Value::as_str) {
                    Some(e) => Err(ExprError::of_kind(answer["kind"].as_str().unwrap_or_default(), e.to_string())),
                    None => Ok(answer.get("ok").cloned().filter(|_| answer["some"] == true)),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fd = libc::pollfd { fd: self.stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut fd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if ready == 0 || left.is_zero() {
                return Err(format!("the expression ran longer than {} ms and was stopped", timeout.as_millis()));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stdout.read(&mut chunk) {
                Ok(0) => return Err(died.to_string()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(died.to_string()),
            }
        }
    }
}

/// The argument that makes a program an expression worker (see [`worker_if_asked`]).
pub const WORKER_ARG: &str = "expr-worker";

/// Set in a worker's environment, so a program started as a worker that does not answer
/// [`WORKER_ARG`] refuses to start a master rather than start one per evaluation.
pub const WORKER_ENV: &str = "AGENTOS_EXPR_WORKER";
/// [`WORKER_ENV`] for code that must not allocate: a program's allocator, choosing at its first
/// allocation.
pub const WORKER_ENV_C: &std::ffi::CStr = c"AGENTOS_EXPR_WORKER";

/// A runner whose every evaluation goes to workers started as `this-program expr-worker`,
/// each evaluation bounded by `timeout`: the program must answer that argument with
/// [`worker_main`], which [`worker_if_asked`] does at the top of `main`.
pub fn runner_for_this_program(timeout: Duration) -> Result<Runner, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find this program to start expression workers: {e}"))?;
    Ok(runner(ExprPool::new(exe, vec![WORKER_ARG.into()], timeout)))
}

/// A runner whose evaluations go to `pool`. An evaluation waits for its worker (up to the
/// pool's timeout); on a worker thread of a multi-threaded runtime the wait is announced to
/// the runtime (`block_in_place`), which hands that thread's other tasks to another thread
/// meanwhile: a spinning expression once held up every request whose task was queued behind it.
pub fn runner(pool: ExprPool) -> Runner {
    Runner::sandboxed(Arc::new(move |src: &str, input: &Value| {
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_worker { tokio::task::block_in_place(|| pool.eval(src, input)) } else { pool.eval(src, input) }
    }))
}

/// Runs this process as an expression worker when it was started as one, and answers the
/// exit code it must end with; `None` otherwise. Call it first in the `main` of a program that
/// starts a master.
pub fn worker_if_asked() -> Option<std::process::ExitCode> {
    (std::env::args().nth(1).as_deref() == Some(WORKER_ARG)).then(worker_main)
}

/// Whether this process was started as an expression worker.
pub fn started_as_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// The worker: one JSON request per line on stdin (`{"src", "input"}`), one answer per line on
/// stdout (`{"some", "ok"}` or `{"err", "kind"}`, the kind of [`ExprError`]), until stdin closes. Its memory is capped, and it is
/// not dumpable (its inputs are token data).
pub fn worker_main() -> std::process::ExitCode {
    let limit = libc::rlimit { rlim_cur: WORKER_MEMORY_BYTES, rlim_max: WORKER_MEMORY_BYTES };
    // SAFETY: setrlimit and prctl only change limits and flags of this process.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &limit);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // A worker spinning on an endless program never reads stdin again, so the master's death
    // (kill -9) would not end it: it would spin on, orphaned. It watches its parent instead: the
    // master named by its pid, not whoever is the parent when the worker first looks. A master
    // killed between starting a worker and the worker's first look (a test that kills mid-fire
    // did it) left workers spinning for good, their parent already init.
    // SAFETY: getppid has no preconditions; _exit ends the process without running anything.
    let parent = std::env::var(WORKER_ENV)
        .ok()
        .and_then(|v| v.parse::<libc::pid_t>().ok())
        .filter(|p| *p > 1)
        .unwrap_or_else(|| unsafe { libc::getppid() });
    if unsafe { libc::getppid() } != parent {
        return std::process::ExitCode::FAILURE;
    }
    let watch = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if unsafe { libc::getppid() } != parent {
                unsafe { libc::_exit(1) };
            }
        }
    });
    if watch.is_err() {
        return std::process::ExitCode::FAILURE;
    }
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    // Compiling loads the jq standard library: programs are compiled once per worker.
    let mut compiled: HashMap<String, Expr> = HashMap::new();
    for line in stdin.lines() {
        let Ok(line) = line else { break };
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(req) => {
                let src = req["src"].as_str().unwrap_or("");
                if !compiled.contains_key(src) {
                    if compiled.len() >= 1024 {
                        compiled.clear();
                    }
                    if let Ok(e) = Expr::compile(src) {
                        compiled.insert(src.to_string(), e);
                    }
                }
                let result = match compiled.get(src) {
                    Some(e) => e.eval_here(&req["input"]),
                    None => Expr::compile(src).and_then(|e| e.eval_here(&req["input"])),
                };
                match result {
                    Ok(Some(v)) => json!({"some": true, "ok": v}),
                    Ok(None) => json!({"some": false}),
                    Err(e) => json!({"err": e.message(), "kind": e.kind()}),
                }
            }
            Err(e) => json!({"err": format!("bad request to the expression worker: {e}")}),
        };
        let mut out = serde_json::to_vec(&answer).unwrap_or_else(|_| b"{\"err\":\"unencodable answer\"}".to_vec());
        out.push(b'\n');
        if stdout.write_all(&out).and_then(|()| stdout.flush()).is_err() {
            break;
        }
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_variable_is_one_name_in_both_spellings() {
        assert_eq!(WORKER_ENV_C.to_str(), Ok(WORKER_ENV));
    }

    /// A stand-in worker in sh: the pool's own mechanics (reuse, the cap, time limits, deaths)
    /// against real processes, without the agentos binary.
    fn pool(script: &str, timeout_ms: u64) -> ExprPool {
        ExprPool::new("sh".into(), vec!["-c".into(), script.into()], Duration::from_millis(timeout_ms))
    }

    const ECHO_ONE: &str = r#"while read l; do echo '{"some":true,"ok":1}'; done"#;

    #[test]
    fn workers_are_reused_capped_stopped_at_their_time_limit_and_replaced_when_they_die() {
        let p = pool(ECHO_ONE, 5000);
        assert_eq!(p.eval(".", &json!(null)), Ok(Some(json!(1))));
        assert_eq!(p.eval(".", &json!(null)), Ok(Some(json!(1))));
        assert_eq!(p.live(), 1, "the idle worker is reused");

        let p = std::sync::Arc::new(pool(r#"while read l; do sleep 0.05; echo '{"some":false}'; done"#, 5000));
        let handles: Vec<_> = (0..3 * MAX_WORKERS)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || p.eval(".", &json!(null)))
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), Ok(None));
        }
        assert!(p.live() <= MAX_WORKERS, "{} workers", p.live());

        let slow = pool("read l; sleep 5", 200);
        let err = slow.eval(".", &json!(null)).unwrap_err();
        assert!(matches!(&err, ExprError::Stopped(m) if m.contains("longer than 200 ms")), "{err:?}");
        assert_eq!(slow.live(), 0, "the worker that overran is gone");

        let dies = pool("read l; exit 3", 5000);
        let err = dies.eval(".", &json!(null)).unwrap_err();
        assert!(matches!(&err, ExprError::Stopped(m) if m.contains("stopped its evaluator")), "{err:?}");
        assert_eq!(dies.live(), 0);

        let errs = pool(r#"while read l; do echo '{"err":"no such function","kind":"compile"}'; done"#, 5000);
        assert_eq!(errs.eval(".", &json!(null)), Err(ExprError::Compile("no such function".into())));
        assert_eq!(errs.live(), 1, "an error of the program is not the worker's");
    }
}
