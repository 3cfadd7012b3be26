//! Runs one process the way a shell command should run on a shared machine: a cleared
//! environment, its own folder and process group, stdout and stderr drained concurrently and
//! bounded, a timeout raced with `select!`, and the whole group killed when it fires.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::cgroup::JobCgroup;

pub struct RunSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The whole environment of the process.
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    /// `None`: stdin is closed (reads see end of file at once).
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr; the rest is read and dropped.
    pub max_output: usize,
    /// Run as this user and group instead of the executor's own.
    pub run_as: Option<(u32, u32)>,
    /// The job's cgroup: the process joins it before it runs, and everything in it is killed
    /// when the main process exits, whatever left the process group.
    pub cgroup: Option<JobCgroup>,
    /// A sealed job's own view of the machine (`spawn::PRIVATE_TMP`); needs root.
    pub private: bool,
    /// The script the program runs (in the executor's cache), kept in reach of a private view.
    pub script: Option<PathBuf>,
}

#[derive(Debug)]
pub struct RunOutput {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub duration: Duration,
    pub timed_out: bool,
    pub cancelled: bool,
    pub truncated: bool,
    /// Output pipes still held open [`DRAIN_AFTER_EXIT`] after the main process exited (by a
    /// process that left its group): what was read until then is in `stdout` and `stderr`.
    pub pipes_left_open: bool,
}

/// Reads `r` to its end into `kept` (at most `max` bytes, the rest read and dropped). It fills a
/// buffer its caller owns so that a read abandoned half way keeps what came before.
async fn drain(mut r: impl AsyncRead + Unpin, max: usize, kept: &mut Vec<u8>, truncated: &mut bool) {
    // Read straight into `kept` while there is room; past `max`, into a small buffer that is
    // dropped. Most jobs print little: a zeroed 64 KiB buffer per pipe and job, and its page
    // faults, cost more than the reads.
    let mut spill = Vec::new();
    loop {
        let room = max.saturating_sub(kept.len());
        let read = if room > 0 {
            kept.reserve(room.min(16 * 1024));
            let before = kept.len();
            let got = (&mut r).take(room as u64).read_buf(kept).await;
            debug_assert!(kept.len() <= before + room);
            got
        } else {
            spill.resize(16 * 1024, 0);
            r.read(&mut spill).await.inspect(|n| *truncated |= *n > 0)
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn kill_group(pgid: i32) {
    // SAFETY: killpg only sends a signal; a group that is already gone gives ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// How long output pipes may stay open after the group was killed (a process that left the
/// group could hold them forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

pub async fn run(spec: RunSpec, cancel: &CancellationToken) -> std::io::Result<RunOutput> {
    let start = Instant::now();
    let spawned = crate::spawn::spawn(&crate::spawn::Spawn {
        program: &spec.program,
        args: &spec.args,
        env: &spec.env,
        cwd: &spec.cwd,
        stdin: spec.stdin.as_deref(),
        cgroup_procs: spec.cgroup.as_ref().map(JobCgroup::procs_fd),
        run_as: spec.run_as,
        private: spec.private,
        script: spec.script.as_deref(),
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            if let Some(cg) = spec.cgroup {
                cg.release().await;
            }
            return Err(e);
        }
    };
    let pgid = child.pid;
    if let (Some((mut w, written)), Some(input)) = (child.stdin.take(), spec.stdin) {
        // What did not fit in the pipe is fed from a task, so a script that does not read its
        // stdin cannot stall us.
        tokio::spawn(async move {
            let _ = w.write_all(&input[written..]).await;
            drop(w);
        });
    }
    let (out, err) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
    let (mut stdout, mut stderr, mut t1, mut t2) = (Vec::new(), Vec::new(), false, false);
    // The reads borrow the buffers until this block ends, abandoned or not.
    let (status, timed_out, cancelled, pipes_left_open) = {
        // Output is read while the process runs (a full pipe would stall it), in this same task.
        let output = async {
            tokio::join!(
                drain(out, spec.max_output, &mut stdout, &mut t1),
                drain(err, spec.max_output, &mut stderr, &mut t2)
            )
        };
        let waited = async {
            tokio::select! {
                s = child.wait() => s.map(|s| (s, false, false)),
                _ = tokio::time::sleep(spec.timeout) => {
                    kill_group(pgid);
                    child.wait().await.map(|s| (s, true, false))
                }
                _ = cancel.cancelled() => {
                    kill_group(pgid);
                    child.wait().await.map(|s| (s, false, true))
                }
            }
        };
        tokio::pin!(output, waited);
        let mut drained = false;
        let (status, timed_out, cancelled) = loop {
            tokio::select! {
                _ = &mut output, if !drained => drained = true,
                w = &mut waited => break w?,
            }
        };
        // Whatever the script left behind in its group, or anywhere in its cgroup, goes with it.
        if pgid > 0 {
            kill_group(pgid);
        }
        if let Some(cg) = &spec.cgroup {
            cg.kill();
        }
        // A process that left the group (`setsid`) may hold the pipes for ever: read for a
        // bounded time, then keep what came.
        let left_open = !drained && tokio::time::timeout(DRAIN_AFTER_EXIT, output).await.is_err();
        (status, timed_out, cancelled, left_open)
    };
    // An emptied cgroup is kept for the next job; one still holding processes (or cgroups a
    // script made) is removed, waiting for the killed processes to leave off the runtime's thread.
    if let Some(cg) = spec.cgroup {
        cg.release().await;
    }
    Ok(RunOutput {
        exit_code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        duration: start.elapsed(),
        timed_out,
        cancelled,
        truncated: t1 || t2,
        pipes_left_open,
    })
}

/// Finds `name` on `path` (a PATH-style list), as a shell would.
pub fn find_program(name: &str, path: &str) -> Option<PathBuf> {
    path.split(':').filter(|d| !d.is_empty()).map(|d| PathBuf::from(d).join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// True while `pid` runs (a zombie waiting to be reaped counts as gone). SIGKILL is
    /// delivered at once but exit takes a moment, so this looks for up to a second.
    pub(crate) fn alive(pid: i32) -> bool {
        for _ in 0..100 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return false,
                Ok(stat) => {
                    let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next());
                    if state == Some("Z") {
                        return false;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    fn spec(script: &str, timeout_ms: u64) -> RunSpec {
        RunSpec {
            program: find_program("sh", "/usr/bin:/bin").unwrap(),
            args: vec!["-c".into(), script.into()],
            env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
            cwd: std::env::temp_dir(),
            stdin: None,
            timeout: Duration::from_millis(timeout_ms),
            max_output: 1024,
            run_as: None,
            cgroup: None,
            private: false,
            script: None,
        }
    }

    #[tokio::test]
    async fn exit_codes_signals_and_bounded_output() {
        let never = CancellationToken::new();
        let o = run(spec("echo out; echo err >&2; exit 3", 5000), &never).await.unwrap();
        assert_eq!((o.exit_code, o.signal, o.timed_out), (Some(3), None, false));
        assert_eq!((o.stdout.as_slice(), o.stderr.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
        let o = run(spec("kill -TERM $$", 5000), &never).await.unwrap();
        assert_eq!((o.exit_code, o.signal), (None, Some(15)));
        let o = run(spec("head -c 5000 /dev/zero", 5000), &never).await.unwrap();
        assert_eq!(o.stdout.len(), 1024);
        assert!(o.truncated);
        // Exactly the bound is whole; one byte more is cut; far more is read to its end (the
        // writer is never stalled on a full pipe) and only the bound kept.
        let o = run(spec("head -c 1024 /dev/zero", 5000), &never).await.unwrap();
        assert_eq!((o.stdout.len(), o.truncated), (1024, false));
        let o = run(spec("head -c 1025 /dev/zero >&2", 5000), &never).await.unwrap();
        assert_eq!((o.stderr.len(), o.truncated, o.stdout.len()), (1024, true, 0));
        let o = run(spec("head -c 3000000 /dev/zero; echo done >&2", 5000), &never).await.unwrap();
        assert_eq!(
            (o.exit_code, o.stdout.len(), o.truncated, o.stderr.as_slice()),
            (Some(0), 1024, true, &b"done\n"[..])
        );
        let o = run(spec("cat", 5000), &never).await.unwrap();
        assert_eq!(o.exit_code, Some(0), "stdin is closed: cat sees end of file at once");
    }

    #[tokio::test]
    async fn input_reaches_the_process_whole_whether_or_not_it_fits_in_the_pipe() {
        let never = CancellationToken::new();
        // The digest of what the process read, against the input's own: nothing lost, doubled
        // or reordered where the part written before the start meets the part fed after it.
        // Empty, small, exactly a pipe's default 64 KiB, and far past it (fed by the task).
        for len in [0usize, 3, 65536, 65537, 3_000_000] {
            let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut s = spec("sha256sum | cut -d' ' -f1", 20_000);
            s.stdin = Some(input.clone());
            let o = run(s, &never).await.unwrap();
            assert_eq!(o.exit_code, Some(0), "{len} bytes: {}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), agentos_core::sha256_hex(&input), "{len} bytes");
        }
        // A process that never reads a large input still ends, and its result comes back.
        let mut s = spec("echo done", 5000);
        s.stdin = Some(vec![b'x'; 3_000_000]);
        let o = run(s, &never).await.unwrap();
        assert_eq!((o.exit_code, o.stdout.as_slice(), o.timed_out), (Some(0), &b"done\n"[..], false));
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_group() {
        let never = CancellationToken::new();
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        // Waits for the grandchild's pid before it waits for the grandchild, so the pid is
        // there to read however late the grandchild starts on a loaded machine.
        let script = format!(
            "sh -c 'echo $$ > {0}; exec sleep 300' & until [ -s {0} ]; do sleep 0.01; done; wait",
            pidfile.display()
        );
        let o = run(spec(&script, 1500), &never).await.unwrap();
        assert!(o.timed_out);
        assert_eq!(o.signal, Some(9));
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(!crate::runner::tests::alive(pid), "the sleeping grandchild {pid} survived");
    }

    #[tokio::test]
    async fn a_detached_child_dies_with_its_job_in_the_jobs_cgroup() {
        // Tests run as root where cgroup v2 is writable; this is the mechanism the executor
        // relies on for what left the process group.
        let ws = tempfile::tempdir().unwrap();
        let cgroups = crate::cgroup::JobCgroups::open().expect("a writable cgroup v2");
        let pidfile = ws.path().join("detached.pid");
        let mut s = spec(
            &format!(
                "echo hello; (setsid sh -c 'echo $$ > {0}; exec sleep 311' &); until [ -s {0} ]; do sleep 0.01; done; echo bye",
                pidfile.display()
            ),
            10_000,
        );
        s.cgroup = Some(cgroups.job().unwrap());
        let o = run(s, &CancellationToken::new()).await.unwrap();
        assert_eq!(o.stdout, b"hello\nbye\n");
        assert!(!o.pipes_left_open, "the detached child was killed, so its pipes closed at once");
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(!alive(pid), "the detached child {pid} survived its job");
        cgroups.close();
    }

    #[tokio::test]
    async fn a_cgroup_its_job_left_empty_serves_the_next_job_and_one_with_a_survivor_does_not() {
        let cgroups = crate::cgroup::JobCgroups::open().expect("a writable cgroup v2");
        let own = |s: &mut RunSpec| s.args = vec!["-c".into(), "cat /proc/self/cgroup".into()];
        let mut s = spec("", 10_000);
        own(&mut s);
        s.cgroup = Some(cgroups.job().unwrap());
        let first = run(s, &CancellationToken::new()).await.unwrap().stdout;
        let mut s = spec("", 10_000);
        own(&mut s);
        s.cgroup = Some(cgroups.job().unwrap());
        let second = run(s, &CancellationToken::new()).await.unwrap().stdout;
        assert!(String::from_utf8_lossy(&first).contains("/job-"), "{}", String::from_utf8_lossy(&first));
        assert_eq!(first, second, "the emptied cgroup is used again");

        // A job whose cgroup still holds a process when it ends: not kept, and the process dies.
        let cg = cgroups.job().unwrap();
        let dir = cg.dir().to_path_buf();
        assert!(String::from_utf8_lossy(&second).trim().ends_with(dir.file_name().unwrap().to_str().unwrap()));
        // A number no other test sleeps for: the executor tests count `sleep 313` machine-wide.
        let mut child = std::process::Command::new("sleep").arg("331").spawn().unwrap();
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        assert!(std::fs::read_to_string(dir.join("cgroup.procs")).unwrap().contains(&child.id().to_string()));
        let cg = cg.reuse().expect_err("a cgroup with a process in it is not kept");
        assert_eq!(cg.remove(), 0);
        assert!(child.wait().unwrap().signal() == Some(9), "the process left in it is killed");
        assert!(!dir.exists(), "the cgroup that held a process is removed");
        let mut s = spec("", 10_000);
        own(&mut s);
        s.cgroup = Some(cgroups.job().unwrap());
        let third = run(s, &CancellationToken::new()).await.unwrap().stdout;
        assert_ne!(third, second, "a new cgroup replaces the removed one");
        cgroups.close();
    }

    #[tokio::test]
    async fn a_kept_cgroup_a_process_moved_into_or_a_cgroup_made_in_is_not_handed_out_again() {
        let cgroups = crate::cgroup::JobCgroups::open().expect("a writable cgroup v2");
        let cg = cgroups.job().unwrap();
        let dir = cg.dir().to_path_buf();
        assert!(cg.reuse().is_ok(), "an empty cgroup is kept");
        // Kept, then joined by a process (as a job running as the executor's user could do).
        let mut child = std::process::Command::new("sleep").arg("314").spawn().unwrap();
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        let next = cgroups.job().unwrap();
        assert_ne!(next.dir(), dir, "the joined cgroup is not used again");
        assert!(child.wait().unwrap().signal() == Some(9), "the process that joined it is killed");
        assert!(!dir.exists(), "and the cgroup removed");
        // A cgroup a job made below its own: not kept. (Kept and taken again first, so that
        // its files are read more than once through the same descriptors.)
        let kept = next.dir().to_path_buf();
        assert!(next.reuse().is_ok());
        let next = cgroups.job().unwrap();
        assert_eq!(next.dir(), kept, "the emptied cgroup is used again");
        let below = next.dir().join("made-by-a-job");
        std::fs::create_dir(&below).unwrap();
        let next = next.reuse().expect_err("a cgroup with a cgroup below it is not kept");
        assert_eq!(next.remove(), 0);
        assert!(!below.exists());
        cgroups.close();
    }

    #[tokio::test]
    async fn output_read_before_a_detached_child_that_holds_stdout_is_kept() {
        // Issue 11: the whole output was dropped (`"stdout": ""`) when the bounded drain ran out.
        let never = CancellationToken::new();
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("detached.pid");
        // The script waits until the child has left its group: killed before `setsid`, it
        // would not hold the pipe.
        let script = format!(
            "echo hello; (setsid sh -c 'echo $$ > {0}; exec sleep 30' &); until [ -s {0} ]; do sleep 0.01; done; echo bye",
            pidfile.display()
        );
        let o = run(spec(&script, 10_000), &never).await.unwrap();
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // SAFETY: kill only sends a signal, to the child this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(o.exit_code, Some(0));
        assert_eq!(o.stdout, b"hello\nbye\n");
        assert!(o.pipes_left_open);
        let o = run(spec("echo alone", 10_000), &never).await.unwrap();
        assert!(!o.pipes_left_open);
    }
}
