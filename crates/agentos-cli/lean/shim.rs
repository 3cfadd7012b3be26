//! `agentos-shim`: what `agentos install-shims` links `agentos-{toolkit}` to, on x86-64 Linux.
//!
//! A program linked with the C library spends most of a short life in that library's start-up
//! (on a virtual machine, its probe of the processor's caches traps to the hypervisor once per
//! `cpuid`: about 0.6 ms of a 0.7 ms life here; BENCHMARKS.md, issue 18). This one has no C
//! library and no Rust runtime: it makes the plain call itself (a tool named first, a master at
//! `http://` and an IPv4 address, a token, UTF-8 arguments) over raw system calls, prints a
//! successful answer and exits. Everything else goes, by `execve` with the same arguments, to
//! `agentos-shim-full` beside it (else `agentos`): before anything is sent, as if it had been
//! called itself; after, with the answer it got, in a memory file named by
//! `AGENTOS_SHIM_ANSWER_FD`, so that the call is never sent twice and every failure is worded
//! and coded by the one program that words them. It is built by `build.rs` with `rustc`
//! directly (Cargo has no per-binary panic strategy, and a program without `std` must abort).

#![no_std]
#![no_main]

#[path = "logic.rs"]
mod logic;

use core::arch::global_asm;

use logic::{Answer, Call, Out};

global_asm!(
    ".globl _start",
    "_start:",
    "xor ebp, ebp",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym entry,
);

/// The C library's string and memory functions that `core` calls.
mod mem {
    #[unsafe(no_mangle)]
    unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        for i in 0..n {
            unsafe { *dst.add(i) = *src.add(i) };
        }
        dst
    }

    #[unsafe(no_mangle)]
    unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        if (dst as usize) < (src as usize) {
            for i in 0..n {
                unsafe { *dst.add(i) = *src.add(i) };
            }
        } else {
            for i in (0..n).rev() {
                unsafe { *dst.add(i) = *src.add(i) };
            }
        }
        dst
    }

    #[unsafe(no_mangle)]
    unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
        for i in 0..n {
            unsafe { *dst.add(i) = c as u8 };
        }
        dst
    }

    #[unsafe(no_mangle)]
    unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        for i in 0..n {
            let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
            if x != y {
                return i32::from(x) - i32::from(y);
            }
        }
        0
    }

    /// Named by `core`'s unwinding tables, never called: this program aborts on a panic.
    #[unsafe(no_mangle)]
    extern "C" fn rust_eh_personality() {}

    #[unsafe(no_mangle)]
    unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        unsafe { memcmp(a, b, n) }
    }
}

/// System calls, each returning what the kernel does (a negative errno on failure).
mod sys {
    use core::arch::asm;

    pub unsafe fn call6(n: usize, a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> isize {
        let r: isize;
        unsafe {
            asm!("syscall", inlateout("rax") n as isize => r, in("rdi") a, in("rsi") b, in("rdx") c,
                in("r10") d, in("r8") e, in("r9") f, lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        r
    }

    pub fn call3(n: usize, a: usize, b: usize, c: usize) -> isize {
        unsafe { call6(n, a, b, c, 0, 0, 0) }
    }

    pub const READ: usize = 0;
    pub const WRITE: usize = 1;
    pub const CLOSE: usize = 3;
    pub const LSEEK: usize = 8;
    pub const MMAP: usize = 9;
    pub const RT_SIGACTION: usize = 13;
    pub const MREMAP: usize = 25;
    pub const GETPID: usize = 39;
    pub const SOCKET: usize = 41;
    pub const CONNECT: usize = 42;
    pub const SENDTO: usize = 44;
    pub const SETSOCKOPT: usize = 54;
    pub const EXECVE: usize = 59;
    pub const FCNTL: usize = 72;
    pub const CLOCK_GETTIME: usize = 228;
    pub const EXIT_GROUP: usize = 231;
    pub const OPENAT: usize = 257;
    pub const MKDIRAT: usize = 258;
    pub const UNLINKAT: usize = 263;
    pub const RENAMEAT: usize = 264;
    pub const READLINKAT: usize = 267;
    pub const MEMFD_CREATE: usize = 319;

    pub const AT_FDCWD: usize = -100isize as usize;
    pub const EINTR: isize = 4;
    pub const EAGAIN: isize = 11;
    pub const EEXIST: isize = 17;
    pub const ENOENT: isize = 2;
    pub const EINPROGRESS: isize = 115;

    pub fn exit(code: u8) -> ! {
        call3(EXIT_GROUP, usize::from(code), 0, 0);
        #[allow(clippy::empty_loop)]
        loop {}
    }

    /// `len` bytes of fresh zeroed memory, or `None`.
    pub fn alloc(len: usize) -> Option<&'static mut [u8]> {
        let len = len.max(1);
        // PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS.
        let p = unsafe { call6(MMAP, 0, len, 3, 0x22, usize::MAX, 0) };
        (p > 0).then(|| unsafe { core::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// `old` grown to `len` bytes (moved if need be), or `None`.
    pub fn grow(old: &'static mut [u8], len: usize) -> Option<&'static mut [u8]> {
        // MREMAP_MAYMOVE.
        let p = unsafe { call6(MREMAP, old.as_mut_ptr() as usize, old.len(), len, 1, 0, 0) };
        (p > 0).then(|| unsafe { core::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// Monotonic time in ms.
    pub fn now_ms() -> u64 {
        let mut ts = [0i64; 2];
        call3(CLOCK_GETTIME, 1, ts.as_mut_ptr() as usize, 0);
        ts[0] as u64 * 1000 + ts[1] as u64 / 1_000_000
    }

    /// Writes all of `bytes`; on failure, how many went out and the OS error's number.
    pub fn write_all(fd: usize, bytes: &[u8]) -> Result<(), (usize, isize)> {
        let mut done = 0;
        while done < bytes.len() {
            let n = call3(WRITE, fd, bytes[done..].as_ptr() as usize, bytes.len() - done);
            if n == -EINTR {
                continue;
            }
            if n <= 0 {
                return Err((done, if n == 0 { 5 } else { -n }));
            }
            done += n as usize;
        }
        Ok(())
    }
}

/// The process's arguments and environment as the kernel laid them out.
struct Process {
    argv: *const *const u8,
    argc: usize,
    envp: *const *const u8,
}

/// The bytes of a C string.
fn c_str(p: *const u8) -> &'static [u8] {
    let mut n = 0;
    // Read one by one as written (a loop the compiler sees as `strlen` would call it).
    while unsafe { p.add(n).read_volatile() } != 0 {
        n += 1;
    }
    unsafe { core::slice::from_raw_parts(p, n) }
}

impl Process {
    fn arg(&self, i: usize) -> &'static [u8] {
        c_str(unsafe { *self.argv.add(i) })
    }

    fn env_entries(&self) -> impl Iterator<Item = *const u8> + '_ {
        (0..).map(|i| unsafe { *self.envp.add(i) }).take_while(|p| !p.is_null())
    }

    /// The first value of `name` (as `getenv` finds it).
    fn env(&self, name: &[u8]) -> Option<&'static [u8]> {
        self.env_entries().map(c_str).find_map(|e| e.strip_prefix(name)?.strip_prefix(b"="))
    }

    /// `name`'s value when it is UTF-8; `Err` when it is set but is not (the whole shim reads
    /// it as unset, and is left to).
    fn env_text(&self, name: &[u8]) -> Result<Option<&'static [u8]>, ()> {
        match self.env(name) {
            Some(v) if core::str::from_utf8(v).is_err() => Err(()),
            v => Ok(v),
        }
    }
}

/// What is handed to `agentos-shim-full` along with the call, once it was sent.
enum Handed<'a> {
    /// The master's answer: status and body.
    Answer(u16, &'a [u8]),
    /// No whole answer came: an OS error's number.
    Os(isize),
    /// No whole answer came, for this reason.
    Said(&'static str),
    /// The answer (status and body) was printed in part, and printing it failed with this OS
    /// error: the whole shim words that, and prints none of it again.
    Printed(isize, u16, &'a [u8]),
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    sys::exit(101)
}

unsafe extern "C" fn entry(sp: *const usize) -> ! {
    let argc = unsafe { *sp };
    let argv = unsafe { sp.add(1) } as *const *const u8;
    let envp = unsafe { argv.add(argc + 1) };
    let p = Process { argv, argc, envp };
    // A reader that stops reading ends this process quietly, as for other tools (the SIG_IGN a
    // parent may leave is the one disposition `execve` keeps).
    let dfl = [0usize; 4];
    unsafe { sys::call6(sys::RT_SIGACTION, 13, dfl.as_ptr() as usize, 0, 8, 0, 0) };
    let outcome = prepare(&p).and_then(call);
    hand_over(&p, outcome)
}

/// What the call needs, found before anything is sent; `None` hands the whole call over.
struct Prepared {
    request: &'static [u8],
    master: logic::Master,
    seq: Option<(&'static [u8], Option<u64>)>,
}

fn prepare(p: &Process) -> Option<Prepared> {
    if p.argc < 2 {
        return None;
    }
    let toolkit = logic::toolkit_of(p.arg(0))?;
    let args_mem = sys::alloc((p.argc - 1) * core::mem::size_of::<&[u8]>())?;
    let slots = args_mem.as_mut_ptr() as *mut &[u8];
    for i in 0..p.argc - 1 {
        // SAFETY: fresh memory, aligned to a page, room for as many slices as arguments; each
        // is written before the slice below is made.
        unsafe { slots.add(i).write(p.arg(i + 1)) };
    }
    // SAFETY: every element was written above.
    let args: &[&[u8]] = unsafe { core::slice::from_raw_parts(slots, p.argc - 1) };
    if !logic::plain_call(args) {
        return None;
    }
    // A proxy is followed by the whole shim (`lean_http::usable`).
    if [&b"HTTP_PROXY"[..], b"http_proxy", b"ALL_PROXY", b"all_proxy"]
        .iter()
        .any(|k| p.env(k).is_some_and(|v| !v.is_empty()))
    {
        return None;
    }
    let url = p.env_text(b"AGENTOS_URL").ok()?.unwrap_or(b"http://127.0.0.1:7420");
    let master = logic::master_of(url)?;
    let model = p.env_text(b"AGENTOS_MODEL").ok()?.filter(|m| !m.is_empty());
    let token = token(p)?;
    let seq = seq_file(p, token)?;
    let call = Call {
        master: &master,
        toolkit,
        tool: args[0],
        args: &args[1..],
        model,
        token,
        min_seq: seq.and_then(|(_, seen)| seen),
    };
    let mem = sys::alloc(logic::request_room(&call))?;
    let mut out = Out::new(&mut *mem);
    logic::request(&mut out, &call);
    let len = out.written()?.len();
    let mem: &'static [u8] = mem;
    Some(Prepared { request: &mem[..len], master, seq })
}

/// `Target::token`: `AGENTOS_TOKEN`, else `<AGENTOS_DATA>/operator.token`, trimmed; `None` for
/// anything the whole shim words (no token, a control character, text that is not ASCII).
fn token(p: &Process) -> Option<&'static [u8]> {
    let raw = match p.env(b"AGENTOS_TOKEN") {
        Some(t) => t,
        None => {
            let data = p.env_text(b"AGENTOS_DATA").ok()?.unwrap_or(b"./.agentos");
            let mut path = [0u8; 4096];
            let mut out = Out::new(&mut path);
            logic::join(&mut out, data, b"operator.token\0");
            let len = out.written()?.len();
            match read_small(&path[..len]) {
                Small::Text(t) => t,
                Small::Missing | Small::TooBig => return None,
            }
        }
    };
    let t = logic::trim(raw);
    (raw.is_ascii() && logic::token_ok(t)).then_some(t)
}

/// The file `SeenSeq` keeps the token's last sequence in, and what it holds: `Some(None)` when
/// there is no such file to keep; `None` hands the call over.
#[allow(clippy::type_complexity)]
fn seq_file(p: &Process, token: &[u8]) -> Option<Option<(&'static [u8], Option<u64>)>> {
    let name = logic::seq_name(token);
    let mem = sys::alloc(8192)?;
    let mut out = Out::new(&mut *mem);
    if let Some(f) = p.env(b"AGENTOS_SEQ_FILE") {
        if !logic::plain_path(f) {
            return None;
        }
        out.put(f);
    } else if let Some(dir) = p.env(b"XDG_RUNTIME_DIR") {
        logic::join(&mut out, dir, b"agentos");
        out.put(b"/");
        out.put(&name);
    } else if let Some(home) = p.env(b"HOME") {
        logic::join(&mut out, home, b".cache/agentos");
        out.put(b"/");
        out.put(&name);
    } else {
        return Some(None);
    }
    let len = out.written()?.len();
    out.put(b"\0");
    out.written()?;
    let mem: &'static [u8] = mem;
    let seen = match read_small(&mem[..len + 1]) {
        Small::Missing => None,
        Small::Text(text) if text.is_ascii() => logic::parse_u64(logic::trim(text)),
        Small::Text(_) | Small::TooBig => return None,
    };
    Some(Some((&mem[..len], seen)))
}

/// A small file's whole text, as the whole shim reads it with `read_to_string`.
enum Small {
    /// It cannot be read.
    Missing,
    /// 4 KiB or more: left to the whole shim.
    TooBig,
    Text(&'static [u8]),
}

/// The file at `path` (which ends with NUL).
fn read_small(path: &[u8]) -> Small {
    // O_RDONLY | O_CLOEXEC.
    let fd = sys::call3(sys::OPENAT, sys::AT_FDCWD, path.as_ptr() as usize, 0o2000000);
    if fd < 0 {
        return Small::Missing;
    }
    let Some(mem) = sys::alloc(4096) else {
        sys::call3(sys::CLOSE, fd as usize, 0, 0);
        return Small::TooBig;
    };
    let mut len = 0;
    let read = loop {
        let n = sys::call3(sys::READ, fd as usize, mem[len..].as_mut_ptr() as usize, mem.len() - len);
        match n {
            0 => break Small::Text(&mem[..len]),
            n if n == -sys::EINTR => continue,
            n if n < 0 => break Small::Missing,
            n => len += n as usize,
        }
        if len == mem.len() {
            break Small::TooBig;
        }
    };
    sys::call3(sys::CLOSE, fd as usize, 0, 0);
    read
}

/// How long the whole exchange may take (`call::REQUEST_TIMEOUT`), and a connection to open
/// (`lean_http::CONNECT_TIMEOUT`).
const REQUEST_MS: u64 = 660_000;
const CONNECT_MS: u64 = 10_000;

fn timeout(fd: usize, option: usize, ms: u64) {
    let tv = [(ms / 1000) as i64, ((ms % 1000) * 1000) as i64];
    unsafe { sys::call6(sys::SETSOCKOPT, fd, 1, option, tv.as_ptr() as usize, 16, 0) };
}

const SO_RCVTIMEO: usize = 20;
const SO_SNDTIMEO: usize = 21;

/// Sends the call and reads its answer; prints a successful one and exits. What it returns is
/// handed over.
fn call(prep: Prepared) -> Option<Handed<'static>> {
    // AF_INET, SOCK_STREAM | SOCK_CLOEXEC.
    let fd = sys::call3(sys::SOCKET, 2, 1 | 0o2000000, 0);
    if fd < 0 {
        return Some(Handed::Os(-fd));
    }
    let fd = fd as usize;
    let mut addr = [0u8; 16];
    addr[0] = 2;
    addr[2..4].copy_from_slice(&prep.master.port.to_be_bytes());
    addr[4..8].copy_from_slice(&prep.master.ip);
    timeout(fd, SO_SNDTIMEO, CONNECT_MS);
    let c = sys::call3(sys::CONNECT, fd, addr.as_ptr() as usize, 16);
    if c == -sys::EINTR {
        // A connect stopped by a signal goes on in the kernel, and cannot be asked again: nothing
        // was sent, so the whole shim makes the call afresh.
        sys::call3(sys::CLOSE, fd, 0, 0);
        return None;
    }
    if c == -sys::EINPROGRESS || c == -sys::EAGAIN {
        return Some(Handed::Said("connection timed out"));
    }
    if c < 0 {
        return Some(Handed::Os(-c));
    }
    let one = 1i32;
    // IPPROTO_TCP, TCP_NODELAY.
    unsafe { sys::call6(sys::SETSOCKOPT, fd, 6, 1, &one as *const i32 as usize, 4, 0) };
    let deadline = sys::now_ms() + REQUEST_MS;
    let left = || deadline.checked_sub(sys::now_ms()).filter(|l| *l > 0);

    // A master may answer and close before taking the whole request: its answer, when it can
    // still be read, says more than the broken write (`lean_http::exchange`).
    let mut written: Result<(), isize> = Ok(());
    let mut rest = prep.request;
    timeout(fd, SO_SNDTIMEO, left().unwrap_or(1));
    while !rest.is_empty() {
        // MSG_NOSIGNAL: a reset connection is an error, not SIGPIPE.
        let n = unsafe { sys::call6(sys::SENDTO, fd, rest.as_ptr() as usize, rest.len(), 0x4000, 0, 0) };
        if n == -sys::EINTR {
            continue;
        }
        if n <= 0 {
            written = Err(if n == 0 { 5 } else { -n });
            break;
        }
        rest = &rest[n as usize..];
    }

    // The call was sent: from here on every failure is handed over as one, never as a call
    // still to make.
    const NO_MEMORY: Handed = Handed::Said("no memory left to read the answer");
    let Some(mut buf) = sys::alloc(64 << 10) else { return Some(NO_MEMORY) };
    let mut len = 0;
    let answer = loop {
        let Some(ms) = left() else { return Some(Handed::Said("no whole answer in time")) };
        timeout(fd, SO_RCVTIMEO, ms);
        if len == buf.len() {
            let bigger = buf.len() * 2;
            let Some(grown) = sys::grow(buf, bigger) else { return Some(NO_MEMORY) };
            buf = grown;
        }
        let n = sys::call3(sys::READ, fd, buf[len..].as_mut_ptr() as usize, buf.len() - len);
        if n == -sys::EINTR {
            continue;
        }
        if n == -sys::EAGAIN {
            return Some(written.err().map_or(Handed::Said("no whole answer in time"), Handed::Os));
        }
        if n < 0 {
            return Some(Handed::Os(written.err().unwrap_or(-n)));
        }
        let eof = n == 0;
        len += n as usize;
        // A chunked body is looked at once its last chunk may be there (`lean_http::exchange`).
        if !eof && logic::is_chunked(&buf[..len]) && !buf[..len].ends_with(b"\r\n\r\n") {
            continue;
        }
        match logic::complete(&mut buf[..len], eof) {
            Ok(Some(answer)) => break answer,
            Ok(None) if eof => {
                return Some(
                    written
                        .err()
                        .map_or(Handed::Said("the connection closed before the whole answer came"), Handed::Os),
                );
            }
            Ok(None) => {}
            Err(bad) => return Some(Handed::Said(bad)),
        }
    };
    sys::call3(sys::CLOSE, fd, 0, 0);
    let Answer { status, seq, body } = answer;
    if let (Some(seq), Some((file, seen))) = (seq, prep.seq) {
        note_seq(file, seen, seq);
    }
    let buf: &'static [u8] = buf;
    let body = &buf[body];
    // A successful answer is printed as it came when that is what the whole shim prints after
    // reading it back: `serde_json`'s own compact text of a value, as the master writes it.
    if (200..300).contains(&status) && logic::printed_as_is(body) {
        match print(body) {
            Ok(()) => sys::exit(0),
            // Nothing printed: the whole shim prints it, or words the failure.
            Err((0, _)) => {}
            Err((_, errno)) => return Some(Handed::Printed(errno, status, body)),
        }
    }
    Some(Handed::Answer(status, body))
}

/// Writes `body` and a line break to standard output; on failure, how much of it went out and
/// the OS error.
fn print(body: &[u8]) -> Result<(), (usize, isize)> {
    sys::write_all(1, body)?;
    sys::write_all(1, b"\n").map_err(|(done, errno)| (body.len() + done, errno))
}

/// `SeenSeq::note_seq`: keeps `seq` in `file` when it is past what was there, through a
/// temporary file renamed in place; every failure is silent.
fn note_seq(file: &[u8], seen: Option<u64>, seq: u64) {
    if seen.is_some_and(|s| s >= seq) {
        return;
    }
    let Some(slash) = file.iter().rposition(|b| *b == b'/') else {
        write_seq(b"", file, seq);
        return;
    };
    let dir = if slash == 0 { &file[..1] } else { &file[..slash] };
    let mut path = [0u8; 8192];
    let mut out = Out::new(&mut path);
    out.put(dir);
    out.put(b"\0");
    if out.written().is_none() || !make_dirs(&mut path, dir.len()) {
        return;
    }
    write_seq(dir, file, seq);
}

/// `create_dir_all` of the NUL-terminated `path[..len]`, making its parents first.
fn make_dirs(path: &mut [u8], len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let made = sys::call3(sys::MKDIRAT, sys::AT_FDCWD, path.as_ptr() as usize, 0o777);
    if made == 0 || made == -sys::EEXIST {
        return true;
    }
    if made != -sys::ENOENT {
        return false;
    }
    let Some(slash) = path[..len].iter().rposition(|b| *b == b'/') else { return false };
    if slash == 0 {
        return false;
    }
    path[slash] = 0;
    let parents = make_dirs(path, slash);
    path[slash] = b'/';
    parents && {
        let again = sys::call3(sys::MKDIRAT, sys::AT_FDCWD, path.as_ptr() as usize, 0o777);
        again == 0 || again == -sys::EEXIST
    }
}

fn write_seq(dir: &[u8], file: &[u8], seq: u64) {
    let mut tmp = [0u8; 8192];
    let mut t = Out::new(&mut tmp);
    logic::join(&mut t, dir, b".seq-");
    t.num(sys::call3(sys::GETPID, 0, 0, 0) as u64);
    t.put(b"\0");
    let mut target = [0u8; 8192];
    let mut f = Out::new(&mut target);
    f.put(file);
    f.put(b"\0");
    let (Some(tmp), Some(target)) = (t.written(), f.written()) else { return };
    // O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC.
    let fd = unsafe {
        sys::call6(sys::OPENAT, sys::AT_FDCWD, tmp.as_ptr() as usize, 0o1 | 0o100 | 0o1000 | 0o2000000, 0o666, 0, 0)
    };
    if fd < 0 {
        return;
    }
    let mut digits = [0u8; 20];
    let mut d = Out::new(&mut digits);
    d.num(seq);
    let wrote = sys::write_all(fd as usize, d.written().unwrap_or_default()).is_ok();
    sys::call3(sys::CLOSE, fd as usize, 0, 0);
    let renamed = wrote
        && unsafe {
            sys::call6(
                sys::RENAMEAT,
                sys::AT_FDCWD,
                tmp.as_ptr() as usize,
                sys::AT_FDCWD,
                target.as_ptr() as usize,
                0,
                0,
            )
        } == 0;
    if !renamed {
        sys::call3(sys::UNLINKAT, sys::AT_FDCWD, tmp.as_ptr() as usize, 0);
    }
}

/// Runs `agentos-shim-full` (else `agentos`) beside this program in its place, with the same
/// arguments, and with `handed` in a memory file when the call was sent.
fn hand_over(p: &Process, handed: Option<Handed>) -> ! {
    let mut exe = [0u8; 4096];
    let n = unsafe {
        sys::call6(
            sys::READLINKAT,
            sys::AT_FDCWD,
            c"/proc/self/exe".as_ptr() as usize,
            exe.as_mut_ptr() as usize,
            exe.len() - 32,
            0,
            0,
        )
    };
    let dir = if n > 0 {
        exe[..n as usize].iter().rposition(|b| *b == b'/').map_or(&exe[..0], |s| &exe[..s])
    } else {
        &exe[..0]
    };
    let dir = &exe[..dir.len()];

    let mut fd_var = [0u8; 64];
    let mut var = Out::new(&mut fd_var);
    if let Some(h) = &handed {
        let Some(fd) = answer_file(h) else {
            fail(&handed, b"no memory file could be made to hand its answer on");
        };
        var.put(b"AGENTOS_SHIM_ANSWER_FD=");
        var.num(fd as u64);
        var.put(b"\0");
    }
    // The environment, with this program's note first and any other note of that name left
    // out (so that a call handed over before it was sent is never taken for one that was).
    let count = p.env_entries().count();
    let Some(mem) = sys::alloc((count + 2) * 8) else { fail(&handed, b"no memory was left to hand it over") };
    let envp = mem.as_mut_ptr() as *mut *const u8;
    let mut i = 0;
    if handed.is_some() {
        unsafe { *envp.add(i) = fd_var.as_ptr() };
        i += 1;
    }
    for e in p.env_entries() {
        if !c_str(e).starts_with(b"AGENTOS_SHIM_ANSWER_FD=") {
            unsafe { *envp.add(i) = e };
            i += 1;
        }
    }
    unsafe { *envp.add(i) = core::ptr::null() };
    // Beside this program (where a link leads), else on `PATH` (a shim copied, not linked).
    let exec = |dir: &[u8], name: &[u8]| {
        let mut path = [0u8; 8192];
        let mut out = Out::new(&mut path);
        logic::join(&mut out, dir, name);
        out.put(b"\0");
        if out.written().is_some() {
            sys::call3(sys::EXECVE, path.as_ptr() as usize, p.argv as usize, envp as usize);
        }
    };
    // A call already sent goes only to the program beside this one: another found on `PATH` may
    // be of a version that does not read what is handed to it, and would send the call again.
    let path = if handed.is_some() { None } else { p.env(b"PATH") };
    let path_dirs = path.unwrap_or_default().split(|b| *b == b':').filter(|d| !d.is_empty());
    for (i, dir) in core::iter::once(dir).chain(path_dirs).enumerate() {
        if i > 0 || n > 0 {
            exec(dir, b"agentos-shim-full");
            exec(dir, b"agentos");
        }
    }
    fail(
        &handed,
        b"this call needs agentos-shim-full or the agentos binary, and neither is beside this one nor on PATH",
    )
}

/// One line on standard error when nothing can be handed over, and the exit: 7 (as for a
/// master out of reach) when nothing was sent, 1 when the call was.
fn fail(handed: &Option<Handed>, why: &[u8]) -> ! {
    let mut line = [0u8; 8192];
    let mut out = Out::new(&mut line);
    out.put(b"agentos-shim: ");
    match handed {
        None => {}
        Some(Handed::Answer(status, _)) => {
            out.put(b"the call was sent and answered with HTTP ");
            out.num(u64::from(*status));
            out.put(b", but ");
        }
        Some(Handed::Printed(..)) => out.put(b"the call was answered and its answer printed in part, but "),
        Some(_) => out.put(b"the call was sent and no whole answer came, but "),
    }
    out.put(why);
    out.put(b"\n");
    let _ = sys::write_all(2, out.written().unwrap_or(b"agentos-shim: cannot hand the call over\n"));
    sys::exit(if handed.is_none() { 7 } else { 1 })
}

/// The memory file that carries `handed`: `A <status>\n<body>`, `P <errno> <status>\n<body>`,
/// `O <errno>` or `S <reason>`.
fn answer_file(handed: &Handed) -> Option<isize> {
    let fd = sys::call3(sys::MEMFD_CREATE, c"agentos-answer".as_ptr() as usize, 0, 0);
    if fd < 0 {
        return None;
    }
    // With standard input, output or error closed the file would take its number, and be
    // taken for that stream: it is moved past them (F_DUPFD from 3), and the number given back.
    let fd = if fd < 3 {
        let moved = sys::call3(sys::FCNTL, fd as usize, 0, 3);
        sys::call3(sys::CLOSE, fd as usize, 0, 0);
        if moved < 0 {
            return None;
        }
        moved
    } else {
        fd
    };
    let mut head = [0u8; 256];
    let mut out = Out::new(&mut head);
    let body: &[u8] = match handed {
        Handed::Answer(status, body) => {
            out.put(b"A ");
            out.num(u64::from(*status));
            out.put(b"\n");
            body
        }
        Handed::Printed(errno, status, body) => {
            out.put(b"P ");
            out.num(*errno as u64);
            out.put(b" ");
            out.num(u64::from(*status));
            out.put(b"\n");
            body
        }
        Handed::Os(errno) => {
            out.put(b"O ");
            out.num(*errno as u64);
            b""
        }
        Handed::Said(reason) => {
            out.put(b"S ");
            reason.as_bytes()
        }
    };
    let ok = sys::write_all(fd as usize, out.written()?).is_ok() && sys::write_all(fd as usize, body).is_ok();
    (ok && sys::call3(sys::LSEEK, fd as usize, 0, 0) == 0).then_some(fd)
}
