//! Capability flags: a permission string read positionally as `rwxhludcts` plus `m`.

use std::fmt;
use std::str::FromStr;

use crate::CoreError;

/// One capability. The discriminant is the flag's position in [`Flags::LETTERS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    Read = 0,
    Write,
    Execute,
    Http,
    Logs,
    User,
    Docker,
    Coordinate,
    ToolNets,
    Scripts,
    Mcp,
}

impl Flag {
    pub const ALL: [Flag; 11] = [
        Flag::Read,
        Flag::Write,
        Flag::Execute,
        Flag::Http,
        Flag::Logs,
        Flag::User,
        Flag::Docker,
        Flag::Coordinate,
        Flag::ToolNets,
        Flag::Scripts,
        Flag::Mcp,
    ];
    pub fn letter(self) -> char {
        Flags::LETTERS.as_bytes()[self as usize] as char
    }
    pub fn word(self) -> &'static str {
        match self {
            Flag::Read => "read",
            Flag::Write => "write",
            Flag::Execute => "execute",
            Flag::Http => "http",
            Flag::Logs => "logs",
            Flag::User => "user",
            Flag::Docker => "docker",
            Flag::Coordinate => "coordinate",
            Flag::ToolNets => "tool nets",
            Flag::Scripts => "scripts",
            Flag::Mcp => "mcp",
        }
    }
}

/// A set of flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Flags(u16);

impl Flags {
    /// The positional order of the permission string.
    pub const LETTERS: &'static str = "rwxhludctsm";

    pub const fn empty() -> Self {
        Flags(0)
    }
    pub const fn all() -> Self {
        Flags((1 << 11) - 1)
    }
    pub fn has(self, f: Flag) -> bool {
        self.0 & (1 << f as u16) != 0
    }
    pub fn with(self, f: Flag) -> Self {
        Flags(self.0 | (1 << f as u16))
    }
    pub fn any_of(self, flags: &[Flag]) -> bool {
        flags.iter().any(|f| self.has(*f))
    }
    /// The flags both sets hold.
    pub fn intersect(self, other: Flags) -> Self {
        Flags(self.0 & other.0)
    }
}

impl fmt::Display for Flags {
    /// The full positional form, e.g. `r-x------s-`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for flag in Flag::ALL {
            let c = if self.has(flag) { flag.letter() } else { '-' };
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl FromStr for Flags {
    type Err = CoreError;

    /// Accepts a prefix of the letters (`rwx`) or a positional string with `-` gaps (`r-x------s`).
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let explain = |why: String| {
            CoreError::bad_input(
                "invalid_flags",
                format!(
                    "invalid flags {s:?}: {why}; flags are positional in the order {} (read, write, execute, http, logs, user, docker, coordinate, tool nets, scripts, mcp), written as a prefix like \"rwx\" or with '-' gaps like \"r-x------s\"",
                    Flags::LETTERS
                ),
            )
        };
        if s.is_empty() {
            return Err(explain("the string is empty (use '-' for no flags)".into()));
        }
        if s.chars().count() > Flags::LETTERS.len() {
            return Err(explain(format!(
                "it has {} characters, at most {} are allowed",
                s.chars().count(),
                Flags::LETTERS.len()
            )));
        }
        let mut flags = Flags::empty();
        for (i, c) in s.chars().enumerate() {
            let flag = Flag::ALL[i];
            if c == '-' {
                continue;
            }
            if c != flag.letter() {
                return Err(explain(format!(
                    "position {} must be '{}' ({}) or '-', got {c:?}",
                    i + 1,
                    flag.letter(),
                    flag.word()
                )));
            }
            flags = flags.with(flag);
        }
        Ok(flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Option<&str>) {
        let got = input.parse::<Flags>().map(|f| f.to_string()).ok();
        assert_eq!(got.as_deref(), expected, "input {input:?}");
    }

    #[test]
    fn parses_prefix_and_positional_forms() {
        check("rwx", Some("rwx--------"));
        check("r-x------s", Some("r-x------s-"));
        check("rwxhludctsm", Some("rwxhludctsm"));
        check("---------s", Some("---------s-"));
        check("-", Some("-----------"));
        check("rwt", None);
        check("x", None);
        check("", None);
        check("rwxhludctsmm", None);
        check("RWX", None);
    }

    #[test]
    fn refusal_explains_the_position() {
        let err = "rwt".parse::<Flags>().unwrap_err();
        assert!(err.message.contains("position 3 must be 'x'"), "{}", err.message);
    }
}
