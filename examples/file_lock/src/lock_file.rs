//! One lock file: taking it, reading it, giving it back. Plain `std::fs`, no async.
//!
//! A lock file is created with `create_new`, so of two processes only one can create it; the
//! creator then numbers the acquisition from a counter file beside it (only the holder of the
//! lock writes the counter, so the numbers rise) and writes its record:
//!
//! ```text
//! <holder>\n<index>\n<length of value>\n<value>
//! ```
//!
//! Between the create and the write, the file is empty: readers see [`Lock::BeingWritten`] and
//! look again later. Giving the lease back deletes the file, if it still holds our record.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use lease_core::Error;

/// Who holds a lock file, as its record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) holder: String,
    pub(crate) index: u64,
    pub(crate) value: Vec<u8>,
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes =
            format!("{}\n{}\n{}\n", self.holder, self.index, self.value.len()).into_bytes();
        bytes.extend_from_slice(&self.value);
        bytes
    }

    /// The record in `bytes`, or `None` if they are not a whole record (one being written).
    fn decode(bytes: &[u8]) -> Option<Record> {
        let mut rest = bytes;
        let mut line = || {
            let end = rest.iter().position(|&b| b == b'\n')?;
            let text = std::str::from_utf8(&rest[..end]).ok()?;
            rest = &rest[end + 1..];
            Some(text)
        };
        let holder = line()?.to_owned();
        let index = line()?.parse().ok()?;
        let length: usize = line()?.parse().ok()?;
        (rest.len() == length).then(|| Record {
            holder,
            index,
            value: rest.to_vec(),
        })
    }
}

/// What a lock file shows.
#[derive(Debug)]
pub(crate) enum Lock {
    /// There is no lock file.
    Free,
    /// Held, by the record's holder.
    Held(Record),
    /// Created, its record not (wholly) written yet.
    BeingWritten,
}

/// Reads the lock file at `path`.
pub(crate) fn look(path: &Path) -> io::Result<Lock> {
    match fs::read(path) {
        Ok(bytes) => Ok(Record::decode(&bytes).map_or(Lock::BeingWritten, Lock::Held)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Lock::Free),
        Err(error) => Err(error),
    }
}

/// Takes the lock file at `path` for `holder` if nobody holds it, numbering the acquisition
/// from the counter file `counter`. `None` if it is held.
pub(crate) fn take(
    path: &Path,
    counter: &Path,
    holder: &str,
    value: &[u8],
) -> io::Result<Option<Record>> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut file = match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
        Err(error) => return Err(error),
    };
    let written = (|| {
        let record = Record {
            holder: holder.to_owned(),
            index: next_index(counter, holder)?,
            value: value.to_vec(),
        };
        file.write_all(&record.encode())?;
        Ok(record)
    })();
    if written.is_err() {
        // Not taken after all: leave the lock free for the next contender.
        let _ = fs::remove_file(path);
    }
    written.map(Some)
}

/// Deletes the lock file at `path` if it holds `record`. Whether it did.
///
/// A read and a delete, not one step: another process that deletes our file and creates its own
/// in between would lose its lock. Only an operator deletes a held lock, so that takes an
/// operator and a contender racing within microseconds; a backend that must rule it out renames
/// the file aside before checking it.
pub(crate) fn remove_if_held_by(path: &Path, record: &[u8]) -> io::Result<bool> {
    match fs::read(path) {
        Ok(bytes) if bytes == record => {}
        Ok(_) => return Ok(false),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    }
    remove(path)
}

/// Deletes the lock file at `path`, whoever holds it (an operator's action). Whether there was one.
pub(crate) fn remove(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// The next number from the counter file, which only the holder of its lock writes. Written
/// aside and renamed into place, so a reader never sees half a number.
fn next_index(counter: &Path, holder: &str) -> io::Result<u64> {
    let last = match fs::read_to_string(counter) {
        Ok(text) => text.trim().parse().unwrap_or(0),
        Err(error) if error.kind() == io::ErrorKind::NotFound => 0,
        Err(error) => return Err(error),
    };
    let next = last + 1;
    let aside = counter.with_extension(format!("{holder}.tmp"));
    fs::write(&aside, next.to_string())?;
    fs::rename(&aside, counter)?;
    Ok(next)
}

/// Whether the directory `dir` (a semaphore's) has a slot's lock file, `.slot-<n>.lock`; `false`
/// if there is no such directory.
pub(crate) fn any_slot_file(dir: &Path) -> io::Result<bool> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".slot-") && name.ends_with(".lock") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Creates the file at `path` with `contents`; `false` if it exists.
pub(crate) fn create_with(path: &Path, contents: &str) -> io::Result<bool> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(mut file) => file.write_all(contents.as_bytes()).map(|()| true),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(error),
    }
}

/// A file operation that failed, as the contract's error for a backend's own failures.
pub(crate) fn io_error(operation: &str, path: &Path, error: &std::io::Error) -> Error {
    Error::Backend {
        backend: "file lock",
        operation: format!("{operation} {}", path.display()),
        message: error.to_string(),
        transient: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_partial_one_does_not() {
        let record = Record {
            holder: "h".into(),
            index: 7,
            value: b"a\nb".to_vec(),
        };
        let bytes = record.encode();
        assert_eq!(Record::decode(&bytes), Some(record));
        assert_eq!(Record::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Record::decode(b""), None);
    }
}
