//! The batch's JSON-lines report: one [`FileResult`] line per input as it ends, then
//! one `{"summary": ...}` line.

use super::result::{FileResult, Summary};
use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A report being written. Lines come from every worker; the first write error is
/// kept (the batch goes on: its outputs do not depend on the report) and told by
/// [`LineReport::finish`].
pub struct LineReport {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
    error: Mutex<Option<String>>,
}

impl LineReport {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> Result<LineReport> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(LineReport {
            path: path.to_path_buf(),
            out: Mutex::new(BufWriter::new(f)),
            error: Mutex::new(None),
        })
    }

    /// One input's line.
    pub fn input(&self, r: &FileResult) {
        self.line(&serde_json::to_string(r).unwrap_or_default());
    }

    /// The last line.
    pub fn summary(&self, s: &Summary) {
        self.line(&serde_json::json!({ "summary": s }).to_string());
    }

    fn line(&self, line: &str) {
        let Ok(mut w) = self.out.lock() else {
            return;
        };
        // Flushed line by line: an interrupted batch leaves a usable report.
        if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush())
            && let Ok(mut slot) = self.error.lock()
        {
            slot.get_or_insert_with(|| e.to_string());
        }
    }

    /// The first write that failed, as `PATH: cannot write the report: ERROR`.
    pub fn finish(self) -> Option<String> {
        let e = self.error.into_inner().ok().flatten()?;
        Some(format!(
            "{}: cannot write the report: {e}",
            self.path.display()
        ))
    }
}
