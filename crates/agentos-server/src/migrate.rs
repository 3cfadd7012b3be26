//! Moving a single-machine installation into the distributed one: `agentos export --data DIR`
//! writes the data folder's log, blobs and open jobs to one file; `agentos import --database
//! URL --blobs s3://…` puts them into PostgreSQL and the object store, verifying every blob on
//! the way in and out.
//!
//! The file is JSON lines: a header, every blob (base64), every event with its sequence number,
//! every open direct job, and an end line with the counts, so a cut file is told from a whole
//! one. The secrets key is never in it: secrets stay in the log encrypted, and every master is
//! given the source's key file.

use std::collections::HashSet;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use agentos_core::job::CommandToken;
use agentos_core::sha256_hex;
use agentos_core::urn::BlobUrn;
use agentos_store::pg_job_queue::NewJobRow;
use agentos_store::{
    BlobStore, EventLog, FsBlobStore, JobStore, NewEvent, PgEventLog, PgJobQueue, S3BlobStore, SharedJobs,
    SqliteEventLog, SqliteJobStore, VerifyBlobStore,
};

/// The format's version, in the header.
const VERSION: u32 = 1;
/// Events appended per statement on import.
const BATCH: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] agentos_store::StoreError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> MigrateError {
    let context = context.into();
    move |source| MigrateError::Io { context, source }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header {
    agentos_export: u32,
    source: String,
    events: u64,
    blobs: u64,
    jobs: u64,
}

#[derive(Serialize, Deserialize, PartialEq, Eq, Debug)]
#[serde(deny_unknown_fields)]
struct EventLine {
    seq: u64,
    model: String,
    #[serde(rename = "type")]
    kind: String,
    key: String,
    payload: String,
    principal: String,
    time: i64,
    v: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobLine {
    job_id: String,
    model: String,
    invoker: String,
    token: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Counts {
    events: u64,
    blobs: u64,
    jobs: u64,
}

/// One line of the file.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum Line {
    Blob { urn: String, base64: String },
    Event(EventLine),
    Job(JobLine),
    End(Counts),
}

/// What an export or import did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub events: u64,
    pub blobs: u64,
    pub jobs: u64,
    /// Import only: events the database held already (an import resumed after a stop).
    pub events_present: u64,
}

/// Writes the data folder `data` to `out` (created with mode 0600, written whole or not at all).
/// The folder's master must be stopped: its LOCK is taken for the time of the export.
pub async fn export(data: &Path, out: &Path) -> Result<Moved, MigrateError> {
    use std::os::unix::fs::OpenOptionsExt;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .open(data.join("LOCK"))
        .map_err(io(format!("{} is not a master's data folder (no LOCK file)", data.display())))?;
    if lock.try_lock().is_err() {
        return Err(MigrateError::Refused(format!(
            "a master is running on {}: stop it first, so the export reads a log nobody writes",
            data.display()
        )));
    }
    if !data.join("events.db").exists() {
        return Err(MigrateError::Refused(format!("{} holds no event log (events.db)", data.display())));
    }
    let log = SqliteEventLog::open(&data.join("events.db"))?;
    let blobs = FsBlobStore::open(data.join("blobs"))?;
    let jobs = SqliteJobStore::open(&data.join("jobs.db"))?.all().await?;
    let urns = blobs.list()?;
    let last = log.last_seq().await?;

    let out = &export_target(out)?;
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".agentos-export-")
        .tempfile_in(dir)
        .map_err(io(format!("creating a file in {}", dir.display())))?;
    let mut w = BufWriter::new(tmp.as_file());
    let write = |w: &mut BufWriter<&std::fs::File>, line: &dyn erased::Line| -> Result<(), MigrateError> {
        line.write_to(w).map_err(io(format!("writing {}", out.display())))
    };
    let header = Header {
        agentos_export: VERSION,
        source: std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf()).display().to_string(),
        events: last,
        blobs: urns.len() as u64,
        jobs: jobs.len() as u64,
    };
    write(&mut w, &header)?;
    let checked = VerifyBlobStore::new(Arc::new(FsBlobStore::open(data.join("blobs"))?));
    let b64 = base64::engine::general_purpose::STANDARD;
    for urn in &urns {
        // Read and checked against its digest: a damaged blob stops the export.
        let bytes = checked
            .get_checked(urn, None)
            .await
            .map_err(|e| MigrateError::Refused(format!("blob {urn} cannot be exported: {e}; nothing was written")))?;
        write(&mut w, &Line::Blob { urn: urn.to_string(), base64: b64.encode(&bytes) })?;
    }
    let mut after = 0;
    while after < last {
        let page = log.read_after(after, 1000).await?;
        if page.is_empty() {
            break;
        }
        for rec in page {
            if rec.seq != after + 1 {
                return Err(MigrateError::Refused(format!(
                    "the log has no event {} (it goes from {after} to {}); nothing was written",
                    after + 1,
                    rec.seq
                )));
            }
            after = rec.seq;
            let e = rec.event;
            let line = EventLine {
                seq: rec.seq,
                model: e.model,
                kind: e.kind,
                key: e.key,
                payload: e.payload,
                principal: e.principal,
                time: e.time,
                v: e.schema,
            };
            write(&mut w, &Line::Event(line))?;
        }
    }
    for j in &jobs {
        let line = JobLine {
            job_id: j.job_id.clone(),
            model: j.model.clone(),
            invoker: j.invoker.clone(),
            token: j.token.clone(),
        };
        write(&mut w, &Line::Job(line))?;
    }
    let counts = Counts { events: after, blobs: urns.len() as u64, jobs: jobs.len() as u64 };
    write(&mut w, &Line::End(counts))?;
    w.flush().map_err(io(format!("writing {}", out.display())))?;
    drop(w);
    tmp.as_file().sync_all().map_err(io(format!("syncing {}", out.display())))?;
    tmp.persist(out)
        .map_err(|e| MigrateError::Io { context: format!("writing {}", out.display()), source: e.error })?;
    drop(lock);
    Ok(Moved { events: after, blobs: urns.len() as u64, jobs: jobs.len() as u64, events_present: 0 })
}

/// Writing a line: the header or a [`Line`], as one line of JSON.
mod erased {
    pub trait Line {
        fn write_to(&self, w: &mut dyn std::io::Write) -> std::io::Result<()>;
    }
    impl<T: serde::Serialize> Line for T {
        fn write_to(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
            serde_json::to_writer(&mut *w, self).map_err(std::io::Error::other)?;
            w.write_all(b"\n")
        }
    }
}

/// Longest header line read; an export's is about a hundred bytes and a path.
const HEADER_MAX: u64 = 64 * 1024;

/// Reads an export line by line, checking each: the header, each blob against its digest, the
/// events numbered 1, 2, 3 …, and the end line's counts. A file without its end line, or with
/// lines after it, ends in an error.
struct ExportReader {
    file: PathBuf,
    lines: std::io::Lines<std::io::BufReader<std::fs::File>>,
    header: Header,
    n: usize,
    counts: (u64, u64, u64),
    ended: bool,
}

impl ExportReader {
    fn open(file: &Path) -> Result<ExportReader, MigrateError> {
        let f = std::fs::File::open(file).map_err(io(format!("opening {}", file.display())))?;
        let mut reader = std::io::BufReader::new(f);
        // The header is a short line; reading it is bounded, so that a file that is not an
        // export (`/dev/zero`, a binary with no line break) is refused at once instead of read
        // into memory whole.
        let mut first = String::new();
        let read = (&mut reader)
            .take(HEADER_MAX + 1)
            .read_line(&mut first)
            .map_err(|e| bad(file, 1, format!("not an agentos export header ({e}); make one with `agentos export`")))?;
        if read == 0 {
            return Err(bad(file, 1, "the file is empty".into()));
        }
        if read as u64 > HEADER_MAX {
            return Err(bad(
                file,
                1,
                format!(
                    "not an agentos export header (longer than {HEADER_MAX} bytes); make one with `agentos export`"
                ),
            ));
        }
        let lines = reader.lines();
        let header: Header = serde_json::from_str(&first)
            .map_err(|e| bad(file, 1, format!("not an agentos export header ({e}); make one with `agentos export`")))?;
        if header.agentos_export != VERSION {
            return Err(bad(
                file,
                1,
                format!("export format {} is not {VERSION}, the one this agentos reads", header.agentos_export),
            ));
        }
        Ok(ExportReader { file: file.to_path_buf(), lines, header, n: 1, counts: (0, 0, 0), ended: false })
    }

    /// The next line, checked; a blob comes with its decoded bytes. `None` after the end line.
    fn next_line(&mut self) -> Result<Option<(Line, Vec<u8>)>, MigrateError> {
        let Some(line) = self.lines.next() else {
            if self.ended {
                return Ok(None);
            }
            let (events, blobs, _) = self.counts;
            return Err(MigrateError::Refused(format!(
                "{} has no end line: the export was cut short ({events} events, {blobs} blobs read); export again",
                self.file.display()
            )));
        };
        self.n += 1;
        let (n, file) = (self.n, self.file.clone());
        let line = line.map_err(io(format!("reading {}", file.display())))?;
        if self.ended {
            return Err(bad(&file, n, "lines after the end line".into()));
        }
        let parsed: Line = serde_json::from_str(&line).map_err(|e| bad(&file, n, format!("{e}")))?;
        let (events, blobs, jobs) = &mut self.counts;
        let mut bytes = Vec::new();
        match &parsed {
            Line::Blob { urn, base64 } => {
                let u: BlobUrn = urn.parse().map_err(|e| bad(&file, n, format!("{e}")))?;
                bytes = base64::engine::general_purpose::STANDARD
                    .decode(base64)
                    .map_err(|e| bad(&file, n, format!("blob {urn}: {e}")))?;
                if sha256_hex(&bytes) != u.sha256() {
                    return Err(bad(&file, n, format!("blob {urn} does not hash to its name: the file was changed")));
                }
                *blobs += 1;
            }
            Line::Event(e) => {
                if e.seq != *events + 1 {
                    return Err(bad(&file, n, format!("event {} where event {} was due", e.seq, *events + 1)));
                }
                *events += 1;
            }
            Line::Job(_) => *jobs += 1,
            Line::End(c) => {
                let h = &self.header;
                if (c.events, c.blobs, c.jobs) != (*events, *blobs, *jobs)
                    || (h.events, h.blobs, h.jobs) != (*events, *blobs, *jobs)
                {
                    return Err(bad(
                        &file,
                        n,
                        format!(
                            "the counts do not match: the header says {} events, {} blobs, {} jobs; the file holds {events}, {blobs}, {jobs}",
                            h.events, h.blobs, h.jobs
                        ),
                    ));
                }
                self.ended = true;
            }
        }
        Ok(Some((parsed, bytes)))
    }
}

fn bad(file: &Path, n: usize, why: String) -> MigrateError {
    MigrateError::Refused(format!("{} line {n}: {why}", file.display()))
}

/// Puts the export `file` into the database at `database` and the object store at `blobs`.
/// The file is checked whole before anything is written. An import stopped half way is run
/// again: the events the database holds are compared with the file's and the rest follow; a
/// database holding another log is refused.
pub async fn import(file: &Path, database: &str, blobs: &str) -> Result<Moved, MigrateError> {
    // First pass: the whole file is checked; nothing is written.
    let mut finished_jobs = HashSet::new();
    let mut reader = ExportReader::open(file)?;
    while let Some((line, _)) = reader.next_line()? {
        if let Line::Event(e) = &line
            && e.kind == "JobFinished"
        {
            finished_jobs.insert(e.key.clone());
        }
    }
    let total = reader.header.events;
    let store: Arc<dyn BlobStore> = Arc::new(S3BlobStore::open(blobs)?);
    let checked = VerifyBlobStore::new(store.clone());
    let log = Arc::new(PgEventLog::open(database).await?);
    let queue = PgJobQueue::open(database).await?;
    let present = log.last_seq().await?;
    if present > total {
        return Err(MigrateError::Refused(format!(
            "the database holds {present} events, more than the export's {total}: import goes into an empty database (or one an import of this file stopped in)"
        )));
    }

    // Second pass: blobs first (the export writes them first), so no event names a blob not
    // there yet; then events; then jobs.
    let mut moved = Moved { events_present: present, ..Moved::default() };
    let mut batch: Vec<NewEvent> = Vec::new();
    let mut after = present;
    let mut reader = ExportReader::open(file)?;
    while let Some((line, bytes)) = reader.next_line()? {
        match line {
            Line::Blob { urn, .. } => {
                let u: BlobUrn = urn.parse().map_err(|e| MigrateError::Refused(format!("{e}")))?;
                store.put(&u, &bytes).await?;
                // Read back from the store and checked again.
                checked.get_checked(&u, Some(bytes.len() as u64)).await?;
                moved.blobs += 1;
            }
            Line::Event(e) => {
                if e.seq <= present {
                    if e.seq == present {
                        compare_with_stored(&log, &e).await?;
                    }
                    continue;
                }
                batch.push(NewEvent {
                    model: e.model,
                    kind: e.kind,
                    key: e.key,
                    payload: e.payload,
                    principal: e.principal,
                    time: e.time,
                    schema: e.v,
                });
                if batch.len() >= BATCH {
                    after = append(&log, after, std::mem::take(&mut batch)).await?;
                }
                moved.events += 1;
            }
            Line::Job(j) => {
                if !batch.is_empty() {
                    after = append(&log, after, std::mem::take(&mut batch)).await?;
                }
                if finished_jobs.contains(&format!("job:{}", j.job_id)) || queue.open_job(&j.job_id).await?.is_some() {
                    continue;
                }
                let token: CommandToken = serde_json::from_str(&j.token)
                    .map_err(|e| MigrateError::Refused(format!("job {}: its token does not read: {e}", j.job_id)))?;
                let body = agentos_engine::jobs::shared_row_body(token)
                    .map_err(|e| MigrateError::Refused(format!("job {}: {e}", j.job_id)))?;
                let row = NewJobRow {
                    job_id: j.job_id,
                    model: j.model,
                    target: None,
                    invoker: Some(j.invoker),
                    owner: "import".into(),
                    body,
                    sealed: false,
                };
                queue.insert(row).await?;
                moved.jobs += 1;
            }
            Line::End(_) => {}
        }
    }
    if !batch.is_empty() {
        append(&log, after, batch).await?;
    }
    Ok(moved)
}

async fn append(log: &Arc<PgEventLog>, after: u64, events: Vec<NewEvent>) -> Result<u64, MigrateError> {
    let n = events.len() as u64;
    let l = log.clone();
    tokio::task::spawn_blocking(move || l.append_blocking(after, events))
        .await
        .map_err(|e| MigrateError::Refused(format!("the append task failed: {e}")))??;
    Ok(after + n)
}

/// The database's event `e.seq` must be the file's: else the database holds another log.
async fn compare_with_stored(log: &PgEventLog, e: &EventLine) -> Result<(), MigrateError> {
    let stored = log.read_after(e.seq - 1, 1).await?;
    let same = stored.first().is_some_and(|r| {
        r.seq == e.seq
            && r.event.kind == e.kind
            && r.event.key == e.key
            && r.event.payload == e.payload
            && r.event.time == e.time
    });
    if same {
        Ok(())
    } else {
        Err(MigrateError::Refused(format!(
            "the database holds a log that is not this export's (event {} differs): import goes into an empty database",
            e.seq
        )))
    }
}

/// Where the export is written: it is written whole beside `out` and renamed onto it, which
/// replaces whatever was there. A regular file is replaced (an earlier export); a link to one is
/// followed, so that the link stays and its file gets the export; anything else (a folder, a
/// device such as `/dev/null` or `/dev/full`, a pipe) is refused before anything is read, never
/// replaced: the rename used to put a file in a device's place.
fn export_target(out: &Path) -> Result<PathBuf, MigrateError> {
    match std::fs::metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(out.to_path_buf()),
        Err(e) => Err(MigrateError::Io { context: format!("reading {}", out.display()), source: e }),
        Ok(m) if m.is_file() => std::fs::canonicalize(out)
            .map_err(|e| MigrateError::Io { context: format!("resolving {}", out.display()), source: e }),
        Ok(_) => Err(MigrateError::Refused(format!(
            "{} is not a regular file: the export is written to a file of its own; give --out a new file's path (or an earlier export's, which it replaces)",
            out.display()
        ))),
    }
}

/// Where `agentos export` writes when no `--out` is given.
pub fn default_export_file(data: &Path) -> PathBuf {
    let name = data.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "agentos".into());
    PathBuf::from(format!("{name}.agentos-export.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stopped master's data folder: its LOCK file and an empty event log.
    fn stopped_master(root: &Path) -> PathBuf {
        let data = root.join("data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("LOCK"), b"").unwrap();
        SqliteEventLog::open(&data.join("events.db")).unwrap();
        data
    }

    #[test]
    fn a_file_that_is_not_an_export_is_refused_at_its_first_line_without_reading_it_whole() {
        let root = tempfile::tempdir().unwrap();
        // No line break in 1 MiB (as `/dev/zero` never has one): read up to the header's bound,
        // then refused.
        let binary = root.path().join("binary");
        std::fs::write(&binary, vec![0u8; 1 << 20]).unwrap();
        let err = ExportReader::open(&binary).err().unwrap();
        assert!(err.to_string().contains("longer than 65536 bytes"), "{err}");
        let empty = root.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(ExportReader::open(&empty).err().unwrap().to_string().contains("the file is empty"));
    }

    #[tokio::test]
    async fn an_export_onto_a_folder_or_a_pipe_is_refused_and_a_link_keeps_its_place() {
        let root = tempfile::tempdir().unwrap();
        let data = stopped_master(root.path());
        // A named pipe stands for any file that is not a regular one (a device such as
        // /dev/full was replaced by a regular file holding the export).
        let pipe = root.path().join("pipe");
        let c = std::ffi::CString::new(pipe.to_str().unwrap()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let folder = root.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        for out in [&pipe, &folder] {
            let err = export(&data, out).await.unwrap_err();
            assert!(err.to_string().contains("is not a regular file"), "{err}");
        }
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&pipe).unwrap().file_type().is_fifo(), "the pipe was replaced");
        assert!(folder.is_dir());
        let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 3, "no file was left behind: {left:?}");

        // A link to an earlier export: the file it leads to gets the new export.
        let earlier = root.path().join("earlier.jsonl");
        std::fs::write(&earlier, b"old").unwrap();
        let link = root.path().join("latest.jsonl");
        std::os::unix::fs::symlink(&earlier, &link).unwrap();
        export(&data, &link).await.unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
        assert!(std::fs::read_to_string(&earlier).unwrap().starts_with("{\"agentosExport\""));
        // A new path and a regular file are written as before.
        export(&data, &root.path().join("new.jsonl")).await.unwrap();
        export(&data, &earlier).await.unwrap();
        // And what was written reads back to its end line.
        let mut reader = ExportReader::open(&earlier).unwrap();
        while reader.next_line().unwrap().is_some() {}
    }
}
