//! The one error type of the core: a kind that decides the status a caller sees, and a message that says what was wrong and what to do.

use std::fmt;

/// What went wrong, in terms a caller can act on. The server maps each kind to one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input is malformed or breaks a rule (400).
    BadInput,
    /// The input is larger than allowed (413).
    TooLarge,
    /// The caller may not do this (403).
    Forbidden,
    /// The thing asked for does not exist (404).
    NotFound,
    /// The request conflicts with what exists (409).
    Conflict,
    /// Nobody could do the work in time, e.g. no executor took a job (504).
    Unavailable,
    /// The master's storage (a shared database or object store) cannot be reached now, or is
    /// too contended; nothing was changed and the request may be retried (503).
    StorageDown,
    /// The tool ran and failed (422).
    ToolFailed,
    /// Too many requests of this caller at once (429).
    TooMany,
    /// Stored data failed its integrity check (500: a real fault, never served).
    Corrupt,
    /// Anything else that is the platform's fault (500).
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreError {
    pub kind: ErrorKind,
    /// A short machine-readable code, e.g. `invalid_id`.
    pub code: &'static str,
    pub message: String,
    /// What the service behind a tool answered when the answer is the failure (an http
    /// operation's status outside 2xx): `{status, contentType, headers, body}`, redacted, for a
    /// caller to act on (a validation error's details). Boxed: most errors carry none.
    pub response: Option<Box<serde_json::Value>>,
}

impl CoreError {
    pub fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> Self {
        CoreError { kind, code, message: message.into(), response: None }
    }
    /// The same error, carrying the service's answer.
    pub fn with_response(mut self, response: serde_json::Value) -> Self {
        self.response = Some(Box::new(response));
        self
    }
    pub fn bad_input(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadInput, code, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, "not_found", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, "forbidden", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, "conflict", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, "internal", message)
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CoreError {}
