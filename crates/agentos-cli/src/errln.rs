//! `errln!`: `eprintln!` for the command-line programs' own messages, minus the panic when
//! standard error cannot take the line (`2>/dev/full`, a closed descriptor). The message is
//! lost either way; what matters is that the command still ends with its own exit code (2 for
//! a usage error, 7 for an unreachable master, …) rather than a panic's 101.

macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
