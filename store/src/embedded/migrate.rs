//! Converting a data directory of the earlier layout (SQLite, `tailrace.db`) at its first
//! open, so an operator upgrading tailrace loses nothing.
//!
//! The new layout is written beside the old one, in `.conversion/`: every capped document at
//! the position it had (feeds' checkpoints and clients' resume ids hold positions), the change
//! log with its sequence numbers (they are resume tokens), the keyed documents with their last
//! write times (retention counts from them), the feeds' checkpoints and the collections with
//! their limits and indexes. Only once it is all written and synced does it move into place,
//! the catalog last (its presence says the conversion is complete), and the SQLite files move
//! into `sqlite-backup/`, kept for the operator to delete. A conversion cut short (a crash, a
//! full disk) leaves the old files as they were and starts again at the next open.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

use super::catalog;
use super::fs::{Fs, RealFs, remove_tree};
use super::journal::{self, IoStats};
use super::maint::{self, Maint, Task};
use super::recover;
use super::schema::DB_FILE;
use super::writer::{Hub, Kv, Links, Writer};
use super::{EmbeddedOptions, Tuning};
use crate::{CappedSpec, ChangeOp, Document, Result, StoreError};

/// Where the new layout is written before it moves into place.
const WORK_DIR: &str = ".conversion";
/// Where the SQLite files go once converted.
pub(crate) const BACKUP_DIR: &str = "sqlite-backup";
/// Rows read per query.
const CHUNK: i64 = 1000;

/// Whether `dir` holds the earlier layout and no converted one.
pub(crate) fn needed(fs: &dyn Fs, dir: &Path) -> bool {
    dir.join(DB_FILE).exists() && !fs.exists(&dir.join(catalog::FILE))
}

/// After a conversion completed but before its SQLite files were moved or its work directory
/// removed (a crash in between): finishes that now.
pub(crate) fn tidy(fs: &dyn Fs, dir: &Path) {
    if !fs.exists(&dir.join(catalog::FILE)) {
        return;
    }
    if dir.join(DB_FILE).exists() {
        let _ = backup(dir);
    }
    let work = dir.join(WORK_DIR);
    if fs.exists(&work) || work.exists() {
        let _ = remove_work(fs, &work);
    }
}

/// Removes the work directory: what it holds on `fs`, and the tree's real files.
fn remove_work(fs: &dyn Fs, work: &Path) -> Result<()> {
    remove_tree(fs, work)
        .map_err(|e| journal::io_error(format!("removing {}", work.display()), e))?;
    match std::fs::remove_dir_all(work) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(journal::io_error(format!("removing {}", work.display()), e))
        }
        _ => Ok(()),
    }
}

fn conv_err(what: impl std::fmt::Display) -> StoreError {
    StoreError::Engine {
        engine: "embedded",
        message: format!("converting the SQLite data directory: {what}"),
    }
}

/// The field of an index column of the earlier layout (`ix_` + the field, `_` written `_u`
/// and `.` written `_d`).
fn column_field(col: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = col.strip_prefix("ix_")?.chars();
    while let Some(c) = chars.next() {
        match c {
            '_' => match chars.next()? {
                'u' => out.push('_'),
                'd' => out.push('.'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// Logs progress every few seconds.
struct Progress {
    what: String,
    total: i64,
    done: i64,
    last: Instant,
}

impl Progress {
    fn new(what: String, total: i64) -> Self {
        tracing::info!(rows = total, "converting {what}");
        Progress {
            what,
            total,
            done: 0,
            last: Instant::now(),
        }
    }

    fn add(&mut self, n: usize) {
        self.done += n as i64;
        if self.last.elapsed() >= Duration::from_secs(2) {
            self.last = Instant::now();
            tracing::info!(
                done = self.done,
                of = self.total,
                "converting {}: {}%",
                self.what,
                self.done * 100 / self.total.max(1)
            );
        }
    }
}

/// Converts the SQLite layout in `dir` (see the module's doc). The journal and the catalog
/// are written through `fs`; the tree and the SQLite files are real files whatever `fs` is.
pub(crate) fn from_sqlite(
    fs: &Arc<dyn Fs>,
    dir: &Path,
    options: &EmbeddedOptions,
    tuning: &Tuning,
) -> Result<()> {
    let started = Instant::now();
    tracing::info!(
        dir = %dir.display(),
        "this data directory holds the SQLite layout of an earlier tailrace; converting it (the old files are kept in {BACKUP_DIR}/)"
    );
    let work = dir.join(WORK_DIR);
    remove_work(&**fs, &work)?;
    fs.create_dir_all(&work)
        .map_err(|e| journal::io_error(format!("creating {}", work.display()), e))?;
    let converted = convert(fs, dir, &work, options, tuning);
    if let Err(e) = converted {
        let _ = remove_work(&**fs, &work);
        return Err(conv_err(format!(
            "{e}; the SQLite files are unchanged, and the conversion starts again at the next start"
        )));
    }
    // Into place, file by file (what an earlier attempt cut short moved is replaced), each
    // directory synced; then the catalog, whose presence says the conversion is complete;
    // then the old files into the backup directory.
    let journal_to = dir.join(journal::DIR);
    let journal_from = work.join(journal::DIR);
    let moved = (|| {
        remove_tree(&**fs, &journal_to)?;
        fs.create_dir_all(&journal_to)?;
        for name in fs.list(&journal_from)? {
            fs.rename(&journal_from.join(&name), &journal_to.join(&name))?;
        }
        fs.sync_dir(&journal_to)?;
        let tree_to = dir.join(recover::TREE_DIR);
        if tree_to.exists() {
            std::fs::remove_dir_all(&tree_to)?;
        }
        std::fs::rename(work.join(recover::TREE_DIR), &tree_to)?;
        // The tree is a real directory whatever `fs` is: its move synced on the real disk.
        RealFs.sync_dir(dir)?;
        fs.sync_dir(dir)?;
        fs.rename(&work.join(catalog::FILE), &dir.join(catalog::FILE))?;
        fs.sync_dir(dir)
    })();
    moved.map_err(|e| journal::io_error("moving the converted layout into place", e))?;
    remove_work(&**fs, &work)?;
    let backup = backup(dir)?;
    tracing::info!(
        seconds = started.elapsed().as_secs_f64(),
        backup = %backup.display(),
        "conversion done; the SQLite files are in the backup directory and may be deleted"
    );
    Ok(())
}

/// Moves the SQLite files (real files) into the backup directory; returns it.
fn backup(dir: &Path) -> Result<PathBuf> {
    let mut to = dir.join(BACKUP_DIR);
    if to.join(DB_FILE).exists() {
        to = dir.join(format!(
            "{BACKUP_DIR}-{}",
            crate::clock::now_us() / 1_000_000
        ));
    }
    std::fs::create_dir_all(&to)
        .map_err(|e| journal::io_error(format!("creating {}", to.display()), e))?;
    for suffix in ["", "-wal", "-shm"] {
        let name = format!("{DB_FILE}{suffix}");
        let from = dir.join(&name);
        if from.exists() {
            std::fs::rename(&from, to.join(&name))
                .map_err(|e| journal::io_error(format!("moving {}", from.display()), e))?;
        }
    }
    journal::fsync_dir(&RealFs, dir)?;
    Ok(to)
}

fn convert(
    fs: &Arc<dyn Fs>,
    dir: &Path,
    work: &Path,
    options: &EmbeddedOptions,
    tuning: &Tuning,
) -> Result<()> {
    let db = Connection::open(dir.join(DB_FILE))?;
    db.busy_timeout(Duration::from_secs(5))?;
    let stats = Arc::new(IoStats::default());
    let recovered = recover::open(fs.clone(), work, tuning.segment_bytes, stats)?;
    let tree = recovered.tree.clone();
    let shared = recovered.shared.clone();
    let catalog = recovered.catalog.clone();
    let hub = Hub::new(1, 0);
    let (maint_tx, maint_rx) = std::sync::mpsc::channel();
    let links = Links {
        hub,
        newest_op: Arc::new(AtomicU64::new(0)),
        maint: maint_tx,
        rotate_asked: Arc::new(AtomicBool::new(false)),
    };
    // The conversion writes without reading: no filter to build.
    let mut writer = Writer::new(recovered, links, tuning.memtable_bytes, 0)?;
    let maint = Maint {
        fs: fs.clone(),
        dir: work.to_path_buf(),
        tree,
        shared,
        catalog,
        snapshots: Arc::new(maint::Snapshots::default()),
        rotate_asked: Arc::new(AtomicBool::new(false)),
        oplog_max: options.oplog_max_entries,
        submit: Box::new(|_, _| false),
        spilled: None,
        values: maint::ValuesDue::default(),
    };
    // What the writer asks of the maintenance thread, done here, in turn.
    let drain = |m: &Maint| -> Result<()> {
        while let Ok(task) = maint_rx.try_recv() {
            match task {
                Task::Flush => m.flush()?,
                Task::WriteIndex {
                    path,
                    summary,
                    entries,
                    indexes,
                } => m.write_index(path, &summary, &entries, &indexes)?,
                // Segments written here get their values files as they finish.
                Task::Check | Task::WriteValues => {}
            }
        }
        Ok(())
    };

    // Collections.
    let colls: Vec<(String, String, Option<i64>, Option<i64>)> = db
        .prepare("SELECT name, kind, max_docs, max_bytes FROM collections ORDER BY name")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, kind, max_docs, max_bytes) in &colls {
        if kind == "capped" {
            let table = format!("capped_{name}");
            let indexes: Vec<String> = db
                .prepare("SELECT name FROM pragma_table_info(?1)")?
                .query_map([&table], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?
                .iter()
                .filter_map(|c| column_field(c))
                .collect();
            let spec = CappedSpec {
                max_docs: max_docs.unwrap_or(i64::MAX).max(1) as u64,
                max_bytes: max_bytes.unwrap_or(i64::MAX).max(1) as u64,
                indexes,
            };
            writer.create_capped(name, &spec)?;
        } else {
            writer.create_keyed(name)?;
        }
    }

    // Capped documents, one record per original commit (their commit time), at their
    // positions.
    for (name, kind, _, _) in &colls {
        if kind != "capped" {
            continue;
        }
        let table = format!("capped_{name}");
        let total: i64 =
            db.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
        let mut progress = Progress::new(format!("capped collection {name}"), total);
        let mut after = 0i64;
        loop {
            let rows: Vec<(i64, String, i64)> = db
                .prepare_cached(&format!(
                    "SELECT pos, body, ts FROM {table} WHERE pos > ?1 ORDER BY pos LIMIT ?2"
                ))?
                .query_map(params![after, CHUNK], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let Some(last) = rows.last() else { break };
            after = last.0;
            progress.add(rows.len());
            let mut run: Vec<(Document, String)> = Vec::new();
            let (mut first, mut ts) = (0i64, 0i64);
            for (pos, body, row_ts) in rows {
                let contiguous = !run.is_empty() && pos == first + run.len() as i64 && row_ts == ts;
                if !contiguous && !run.is_empty() {
                    writer.import_capped(name, first as u64, std::mem::take(&mut run), ts)?;
                }
                if run.is_empty() {
                    first = pos;
                    ts = row_ts;
                }
                run.push((serde_json::from_str(&body)?, body));
            }
            if !run.is_empty() {
                writer.import_capped(name, first as u64, run, ts)?;
            }
            drain(&maint)?;
        }
    }

    // The change log, with its sequence numbers.
    let total: i64 = db.query_row("SELECT COUNT(*) FROM oplog", [], |r| r.get(0))?;
    let mut progress = Progress::new("the change log".into(), total);
    let mut after = 0i64;
    type Row = (
        i64,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        i64,
    );
    let image = |json: Option<String>, ts: i64| -> Result<Option<Kv>> {
        json.map(|j| {
            Ok(Kv {
                doc: Arc::new(serde_json::from_str(&j)?),
                json: Arc::from(j.as_str()),
                ts,
            })
        })
        .transpose()
    };
    loop {
        let rows: Vec<Row> = db
            .prepare_cached(
                "SELECT seq, coll, op, key, before, after, ts FROM oplog WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?
            .query_map(params![after, CHUNK], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        progress.add(rows.len());
        let mut run = Vec::new();
        let (mut first, mut ts) = (0i64, 0i64);
        for (seq, coll, op, key, before, after_image, row_ts) in rows {
            let contiguous = !run.is_empty() && seq == first + run.len() as i64 && row_ts == ts;
            if !contiguous && !run.is_empty() {
                writer.import_changes(first as u64, ts, std::mem::take(&mut run))?;
            }
            if run.is_empty() {
                first = seq;
                ts = row_ts;
            }
            let op: ChangeOp = op.parse().map_err(conv_err)?;
            run.push((
                op,
                coll,
                key,
                image(before, row_ts)?,
                image(after_image, row_ts)?,
            ));
        }
        if !run.is_empty() {
            writer.import_changes(first as u64, ts, run)?;
        }
        drain(&maint)?;
    }
    // Both sequences go on where the old ones would have: a feed's token or a client's
    // position never lies ahead of the store.
    let sequences: Vec<(String, i64)> = db
        .prepare("SELECT name, seq FROM sqlite_sequence")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (table, seq) in &sequences {
        if table == "oplog" {
            writer.continue_changes_at(*seq as u64 + 1)?;
        } else if let Some(coll) = table.strip_prefix("capped_") {
            writer.continue_positions_at(coll, *seq as u64 + 1)?;
        }
    }

    // Keyed documents as they are, with their write times.
    let has_ts: bool = db
        .prepare("SELECT 1 FROM pragma_table_info('kv') WHERE name = 'ts'")?
        .exists([])?;
    let total: i64 = db.query_row("SELECT COUNT(*) FROM kv", [], |r| r.get(0))?;
    let mut progress = Progress::new("keyed collections".into(), total);
    let now = crate::clock::now_us();
    let mut last: Option<(String, String)> = None;
    loop {
        let sql = format!(
            "SELECT coll, key, body, {} FROM kv WHERE (coll, key) > (?1, ?2) ORDER BY coll, key LIMIT ?3",
            if has_ts { "ts" } else { "0" }
        );
        let (c, k) = last.clone().unwrap_or_default();
        let rows: Vec<(String, String, String, i64)> = db
            .prepare_cached(&sql)?
            .query_map(params![c, k, CHUNK], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let Some(l) = rows.last() else { break };
        last = Some((l.0.clone(), l.1.clone()));
        progress.add(rows.len());
        for (coll, key, body, ts) in rows {
            writer.import_kv(&coll, &key, &body, if ts > 0 { ts } else { now });
        }
        // Flushed as it fills: millions of keys would otherwise sit in one memtable.
        if writer.seal_if_full() {
            drain(&maint)?;
        }
    }
    let checkpoints: Vec<(String, String)> = db
        .prepare("SELECT feed, body FROM checkpoints")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (feed, body) in &checkpoints {
        writer.import_checkpoint(feed, body);
    }

    // Everything durable: the journal synced, the keyed state in tables.
    writer.sync_journal()?;
    writer.seal_memtable();
    drain(&maint)?;
    drop(writer);
    tracing::debug!(
        collections = colls.len(),
        checkpoints = checkpoints.len(),
        "conversion written"
    );
    Ok(())
}
