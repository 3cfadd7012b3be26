//! JSON-RPC messages one a line, as MCP's stdio transport carries them, read with a bound: the
//! relay's stdin (`agentos mcp`) and a command MCP server's stdout read alike.

use agentos_core::message_id::IdScan;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Lines of `R`, each at most `max` bytes: a longer one is skipped to its end, its bytes looked
/// through for its message's id on their way ([`IdScan`]), so that it can still be answered.
pub struct BoundedLines<R> {
    read: BufReader<R>,
    max: usize,
    /// The line being read; a read cancelled halfway leaves its part here for the next.
    pub line: Vec<u8>,
    /// The line being read is past `max`: what its id is, as far as it went by.
    pub too_long: Option<IdScan>,
}

impl<R: AsyncRead + Unpin> BoundedLines<R> {
    pub fn new(read: R, max: usize) -> Self {
        BoundedLines { read: BufReader::new(read), max, line: Vec::new(), too_long: None }
    }

    /// Reads to the end of the next line; `false` at the end of the input. Cancel-safe: bytes
    /// are moved into `line` (or scanned) and consumed with no await between.
    pub async fn read_line(&mut self) -> std::io::Result<bool> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(false);
            }
            let (take, ends) = match available.iter().position(|b| *b == b'\n') {
                Some(at) => (at + 1, true),
                None => (available.len(), false),
            };
            if self.too_long.is_none() && self.line.len() + take > self.max + 1 {
                let mut scan = IdScan::default();
                scan.feed(&self.line);
                self.too_long = Some(scan);
                self.line.clear();
            }
            if let Some(scan) = &mut self.too_long {
                scan.feed(&available[..take]);
            } else {
                self.line.extend_from_slice(&available[..take]);
            }
            self.read.consume(take);
            if ends {
                return Ok(true);
            }
        }
    }
}
