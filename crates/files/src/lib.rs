//! How cudaw writes and reads files, the one way everywhere (checkpoint images, timelines,
//! the kernel counts, the run folder), so that a process running as root or another user
//! cannot be made to write through a link, block on a FIFO or replace a device node.
//!
//! **Writing** ([`NewFile`]): the file is created beside the target, in the target's folder
//! (opened once, so the name cannot be redirected meanwhile), under an unpredictable name
//! (`.NAME.PID-RANDOM.tmp`) with `O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600;
//! written, synced (`fsync`), then renamed over the target. A target that exists and is not
//! a regular file (a folder, a symbolic link, a FIFO, a socket, a device node) is refused,
//! before anything is written and again just before the rename; the temporary is removed on
//! any failure (and when the [`NewFile`] is dropped without [`NewFile::commit`]).
//!
//! **Reading** ([`open_input`], [`check_input`]): opened `O_RDONLY | O_NONBLOCK |
//! O_CLOEXEC | O_NOCTTY` (and `O_NOFOLLOW` unless the caller runs as the requester
//! himself), checked to be a regular file with `fstat` before any byte is read, then
//! switched back to blocking: a FIFO or a device is refused at once instead of hanging
//! `open()` or `read()`.
//!
//! **Folders** ([`private_dir`], [`create_unique_dir`]): a folder cudaw keeps sockets and
//! ledgers in must be absolute, a real folder (not a link), owned by the user, writable by
//! no one else; the folders cudaw creates are 0700.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

mod streamed;
pub use streamed::{Streamed, WRITEBACK_WINDOW};

/// What a path names, as messages say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    Regular,
    /// A folder.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A FIFO (named pipe).
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else.
    Unknown,
}

impl Kind {
    /// The kind of a `st_mode`.
    pub fn of_mode(mode: u32) -> Kind {
        match FileType::from_raw_mode(mode as _) {
            FileType::RegularFile => Kind::Regular,
            FileType::Directory => Kind::Directory,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
            FileType::CharacterDevice => Kind::CharDevice,
            FileType::BlockDevice => Kind::BlockDevice,
            FileType::Unknown => Kind::Unknown,
        }
    }

    /// `a FIFO (named pipe)`, `a character device`, ...
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Regular => "a regular file",
            Kind::Directory => "a folder",
            Kind::Symlink => "a symbolic link",
            Kind::Fifo => "a FIFO (named pipe)",
            Kind::Socket => "a socket",
            Kind::CharDevice => "a character device",
            Kind::BlockDevice => "a block device",
            Kind::Unknown => "a special file",
        }
    }
}

/// Why a file could not be written or read. The message names the path, what was being
/// done, and what was found.
#[derive(Debug)]
pub enum FileError {
    /// The path names something other than a regular file.
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: Kind,
        /// `replace` (a target to write) or `read` (an input).
        doing: &'static str,
    },
    /// The system refused.
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done (`creating`, `opening`, ...).
        doing: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The path names no file (`/`, `..`, empty).
    NoFileName {
        /// The path.
        path: PathBuf,
    },
}

impl FileError {
    /// The I/O error's kind, for an [`FileError::Io`].
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            FileError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::NotRegular {
                path,
                kind: Kind::Symlink,
                doing,
            } => write!(
                f,
                "refusing to {doing} {}: it is a symbolic link, not a regular file (name the file itself)",
                path.display()
            ),
            FileError::NotRegular {
                path,
                kind: Kind::Directory,
                doing,
            } => write!(
                f,
                "refusing to {doing} {}: it is a folder, not a regular file (name a file)",
                path.display()
            ),
            FileError::NotRegular { path, kind, doing } => write!(
                f,
                "refusing to {doing} {}: it is {}, not a regular file",
                path.display(),
                kind.describe()
            ),
            FileError::Io {
                path,
                doing,
                source,
            } => write!(f, "{doing} {}: {source}", path.display()),
            FileError::NoFileName { path } => write!(f, "{} names no file", path.display()),
        }
    }
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FileError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err(path: &Path, doing: &'static str, e: Errno) -> FileError {
    FileError::Io {
        path: path.to_path_buf(),
        doing,
        source: e.into(),
    }
}

/// 64 unpredictable bits (from `getrandom`; the time and the PID if that fails).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) {
        Ok(8) => u64::from_le_bytes(b),
        _ => {
            use std::hash::BuildHasher;
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            std::collections::hash_map::RandomState::new().hash_one((t, std::process::id()))
        }
    }
}

/// The folder a path's file lives in (`.` for a bare name) and the file's name.
fn split(path: &Path) -> Result<(PathBuf, OsString), FileError> {
    let name = path
        .file_name()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FileError::NoFileName {
            path: path.to_path_buf(),
        })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name.to_os_string()))
}

/// Refuses a target that exists and is not a regular file.
fn check_target(dir: &OwnedFd, name: &OsStr, path: &Path) -> Result<(), FileError> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match Kind::of_mode(st.st_mode) {
            Kind::Regular => Ok(()),
            kind => Err(FileError::NotRegular {
                path: path.to_path_buf(),
                kind,
                doing: "replace",
            }),
        },
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(io_err(path, "looking at", e)),
    }
}

/// Checks, without creating anything, that `path` could be written by [`NewFile`]: its
/// folder exists and is a folder, and the path is absent or a regular file. (For early,
/// clear errors; [`NewFile::create`] checks again.)
pub fn check_output(path: &Path) -> Result<(), FileError> {
    let (dir, name) = split(path)?;
    let fd = rfs::open(
        &dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(&dir, "opening the folder", e))?;
    check_target(&fd, &name, path)
}

/// The temporary beside a target, removed when dropped unless renamed.
struct Temporary {
    dir: OwnedFd,
    dir_path: PathBuf,
    name: OsString,
    /// Renamed, or to be kept.
    renamed: bool,
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = rfs::unlinkat(&self.dir, &self.name, AtFlags::empty());
        }
    }
}

/// A file being written beside its target: created exclusive, no-follow, 0600, under an
/// unpredictable name; [`NewFile::commit`] syncs it and renames it over the target.
/// Dropped without commit, the temporary is removed.
pub struct NewFile {
    tmp: Temporary,
    target: OsString,
    path: PathBuf,
    file: File,
}

impl fmt::Debug for NewFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewFile")
            .field("path", &self.path)
            .field("temporary", &self.temporary())
            .finish_non_exhaustive()
    }
}

impl NewFile {
    /// Creates the temporary beside `path` (opened for reading and writing). Refuses a
    /// `path` that exists and is not a regular file.
    pub fn create(path: &Path) -> Result<NewFile, FileError> {
        let (dir_path, target) = split(path)?;
        // A real descriptor to sync the folder after the rename; `O_PATH` (search
        // permission only) when the folder cannot be read.
        let dir = rfs::open(
            &dir_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .or_else(|e| {
            if e == Errno::ACCESS {
                rfs::open(
                    &dir_path,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            } else {
                Err(e)
            }
        })
        .map_err(|e| match e {
            Errno::NOTDIR => FileError::Io {
                path: dir_path.clone(),
                doing: "writing into",
                source: io::Error::other("not a folder"),
            },
            e => io_err(&dir_path, "opening the folder", e),
        })?;
        check_target(&dir, &target, path)?;
        // `.NAME.PID-RANDOM.tmp`, the name shortened to fit a file name's 255 bytes.
        let shown = &target.as_bytes()[..target.len().min(200)];
        let mut last = Errno::EXIST;
        for _ in 0..16 {
            let mut name = b".".to_vec();
            name.extend_from_slice(shown);
            name.extend_from_slice(
                format!(".{}-{:016x}.tmp", std::process::id(), random_u64()).as_bytes(),
            );
            let name = OsString::from_vec(name);
            match rfs::openat(
                &dir,
                &name,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => {
                    return Ok(NewFile {
                        tmp: Temporary {
                            dir,
                            dir_path,
                            name,
                            renamed: false,
                        },
                        target,
                        path: path.to_path_buf(),
                        file: File::from(fd),
                    })
                }
                Err(Errno::EXIST) => continue,
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        Err(FileError::Io {
            path: path.to_path_buf(),
            doing: "creating a temporary file beside",
            source: last.into(),
        })
    }

    /// The open temporary.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The target.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the temporary is, until committed.
    pub fn temporary(&self) -> PathBuf {
        self.tmp.dir_path.join(&self.tmp.name)
    }

    /// Keeps the temporary even if this is dropped without a commit or the commit fails
    /// (when another process holds it as the only copy of something).
    pub fn keep(&mut self) {
        self.tmp.renamed = true;
    }

    /// Syncs the file, checks the target again (absent or a regular file), renames the
    /// temporary over it and syncs the folder. Returns the file, open for reading and
    /// writing, now under the target's name.
    pub fn commit(mut self) -> Result<File, FileError> {
        self.file.sync_all().map_err(|source| FileError::Io {
            path: self.path.clone(),
            doing: "writing (fsync)",
            source,
        })?;
        check_target(&self.tmp.dir, &self.target, &self.path)?;
        rfs::renameat(&self.tmp.dir, &self.tmp.name, &self.tmp.dir, &self.target)
            .map_err(|e| io_err(&self.path, "renaming the temporary file to", e))?;
        self.tmp.renamed = true;
        // The rename is durable once the folder is synced (not possible through O_PATH).
        let _ = rfs::fsync(&self.tmp.dir);
        Ok(self.file)
    }
}

/// Writes `path` through a [`NewFile`]: `write` fills the temporary, which is then synced
/// and renamed over `path`. On any failure the temporary is removed and `path` is as it
/// was.
pub fn write_file<T>(
    path: &Path,
    write: impl FnOnce(&File) -> io::Result<T>,
) -> Result<T, FileError> {
    let f = NewFile::create(path)?;
    let v = write(f.file()).map_err(|source| FileError::Io {
        path: path.to_path_buf(),
        doing: "writing",
        source,
    })?;
    f.commit()?;
    Ok(v)
}

/// Checks that an open file is a regular file, and makes its reads blocking again (an
/// input opened, here or by a client that passed the descriptor, with `O_NONBLOCK`).
pub fn check_input(file: impl AsFd, path: &Path) -> Result<(), FileError> {
    let st = rfs::fstat(&file).map_err(|e| io_err(path, "looking at", e))?;
    match Kind::of_mode(st.st_mode) {
        Kind::Regular => {}
        kind => {
            return Err(FileError::NotRegular {
                path: path.to_path_buf(),
                kind,
                doing: "read",
            })
        }
    }
    let fl = rfs::fcntl_getfl(&file).map_err(|e| io_err(path, "reading the flags of", e))?;
    if fl.contains(OFlags::NONBLOCK) {
        rfs::fcntl_setfl(&file, fl - OFlags::NONBLOCK)
            .map_err(|e| io_err(path, "setting the flags of", e))?;
    }
    Ok(())
}

/// Whether [`open_input`] follows a symbolic link in the last component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Refuse a link: the opener acts for someone else (a process serving a request).
    No,
    /// Follow it: the opener is the requester himself (a command-line client).
    Yes,
}

/// Opens an input for reading: regular files only, never blocking in `open()` on a FIFO,
/// checked before a byte is read.
pub fn open_input(path: &Path, follow: Follow) -> Result<File, FileError> {
    let stat_flags = match follow {
        Follow::No => AtFlags::SYMLINK_NOFOLLOW,
        Follow::Yes => AtFlags::empty(),
    };
    // Look first: a device is refused before opening it can have any effect.
    match rfs::statat(CWD, path, stat_flags) {
        Ok(st) => match Kind::of_mode(st.st_mode) {
            Kind::Regular => {}
            kind => {
                return Err(FileError::NotRegular {
                    path: path.to_path_buf(),
                    kind,
                    doing: "read",
                })
            }
        },
        Err(e) => return Err(io_err(path, "opening", e)),
    }
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    if follow == Follow::No {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rfs::open(path, flags, Mode::empty()).map_err(|e| match e {
        // Replaced by a link since it was looked at.
        Errno::LOOP if follow == Follow::No => FileError::NotRegular {
            path: path.to_path_buf(),
            kind: Kind::Symlink,
            doing: "read",
        },
        e => io_err(path, "opening", e),
    })?;
    check_input(&fd, path)?;
    Ok(File::from(fd))
}

/// Why a folder may not hold cudaw's sockets and ledgers.
#[derive(Debug)]
pub enum DirError {
    /// The path is relative.
    NotAbsolute {
        /// The path.
        path: PathBuf,
    },
    /// It is not a folder (a link, a file, ...).
    NotADirectory {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: Kind,
    },
    /// It belongs to another user.
    Owner {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The user it should belong to.
        uid: u32,
    },
    /// Others than its owner may write into it.
    Writable {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Others may read it, and it holds files that are not cudaw's (`/etc`, a home
    /// folder): not a folder of cudaw's own.
    Shared {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// One of the other files.
        other: String,
    },
    /// The system refused.
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        doing: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl DirError {
    /// The other user, when the folder is someone else's.
    pub fn other_owner(&self) -> Option<u32> {
        match self {
            DirError::Owner { owner, .. } => Some(*owner),
            _ => None,
        }
    }
}

impl fmt::Display for DirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirError::NotAbsolute { path } => write!(
                f,
                "{} is not an absolute path (expected a private folder such as /run/user/UID/cudaw)",
                path.display()
            ),
            DirError::NotADirectory { path, kind } => write!(
                f,
                "{} is {}, not a folder; refusing to use it",
                path.display(),
                kind.describe()
            ),
            DirError::Owner { path, owner, uid } => write!(
                f,
                "{} belongs to uid {owner}, not to uid {uid}; refusing to use it",
                path.display()
            ),
            DirError::Writable { path, mode } => write!(
                f,
                "{} is writable by its group or others (mode {mode:04o}, expected 0700); refusing to use it (chmod 700 {})",
                path.display(),
                path.display()
            ),
            DirError::Shared { path, mode, other } => write!(
                f,
                "{} may be read by others (mode {mode:04o}) and holds files that are not cudaw's (such as {other}); refusing to use it: give cudaw a private folder of its own (mkdir -m 700 DIR)",
                path.display()
            ),
            DirError::Io {
                path,
                doing,
                source,
            } => write!(f, "{doing} {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for DirError {}

/// Checks an existing folder: a real folder, owned by `uid`, writable by no one else.
/// Returns a note when its group or others may read or search it (louder when it holds
/// files that are not cudaw's).
fn check_private(path: &Path, uid: u32) -> Result<Option<String>, DirError> {
    let st = rfs::statat(CWD, path, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| DirError::Io {
        path: path.to_path_buf(),
        doing: "looking at",
        source: e.into(),
    })?;
    let kind = Kind::of_mode(st.st_mode);
    if kind != Kind::Directory {
        return Err(DirError::NotADirectory {
            path: path.to_path_buf(),
            kind,
        });
    }
    if st.st_uid != uid {
        return Err(DirError::Owner {
            path: path.to_path_buf(),
            owner: st.st_uid,
            uid,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(DirError::Writable {
            path: path.to_path_buf(),
            mode,
        });
    }
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    // Readable by others and holding other files (/etc, a home folder): not cudaw's own
    // folder, refused. Readable but cudaw's alone: used, with a warning.
    if let Some(other) = foreign_entry(path) {
        return Err(DirError::Shared {
            path: path.to_path_buf(),
            mode,
            other,
        });
    }
    Ok(Some(format!(
        "{} may be read by its group or others (mode {mode:04o}); chmod 700 it to keep the sockets' names private",
        path.display()
    )))
}

/// An entry of `dir` that is not cudaw's (a socket `PID.sock`, a ledger, a hidden
/// temporary or lock file, `cudaw-ckpt`'s `PID.release-lock`), if any.
fn foreign_entry(dir: &Path) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with('.')
            || name.ends_with(".sock")
            || name.ends_with(".release-lock")
            || name.contains(".ledger");
        (!ours).then_some(name)
    })
}

/// Makes sure `path` is a private folder of `uid`: absolute; created 0700 if missing (with
/// any missing parent, 0700 too) when `create`; a real folder (not a link), owned by
/// `uid`, writable by no one else; every existing parent owned by `uid` or root and, when
/// others may write into it, sticky (as `/tmp`). Returns a note to log when the folder's
/// group or others may read it.
pub fn private_dir(path: &Path, uid: u32, create: bool) -> Result<Option<String>, DirError> {
    if !path.is_absolute() {
        return Err(DirError::NotAbsolute {
            path: path.to_path_buf(),
        });
    }
    let ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    for a in ancestors.iter().rev() {
        match rfs::stat(*a) {
            Ok(st) => {
                if st.st_uid != uid && st.st_uid != 0 {
                    return Err(DirError::Owner {
                        path: a.to_path_buf(),
                        owner: st.st_uid,
                        uid,
                    });
                }
                let mode = st.st_mode & 0o7777;
                if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                    return Err(DirError::Writable {
                        path: a.to_path_buf(),
                        mode,
                    });
                }
            }
            Err(Errno::NOENT) if create => match rfs::mkdir(*a, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => {
                    return Err(DirError::Io {
                        path: a.to_path_buf(),
                        doing: "creating",
                        source: e.into(),
                    })
                }
            },
            Err(e) => {
                return Err(DirError::Io {
                    path: a.to_path_buf(),
                    doing: "looking at",
                    source: e.into(),
                })
            }
        }
    }
    if create {
        match rfs::mkdir(path, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(DirError::Io {
                    path: path.to_path_buf(),
                    doing: "creating",
                    source: e.into(),
                })
            }
        }
    }
    check_private(path, uid)
}

/// Creates a new private folder `PARENT/PREFIX` followed by random hex digits (0700);
/// returns its path.
pub fn create_unique_dir(parent: &Path, prefix: &str) -> Result<PathBuf, DirError> {
    let mut last = Errno::EXIST;
    for _ in 0..16 {
        let p = parent.join(format!("{prefix}{:012x}", random_u64() >> 16));
        match rfs::mkdir(&p, Mode::from_raw_mode(0o700)) {
            Ok(()) => return Ok(p),
            Err(Errno::EXIST) => continue,
            Err(e) => {
                last = e;
                break;
            }
        }
    }
    Err(DirError::Io {
        path: parent.join(format!("{prefix}*")),
        doing: "creating",
        source: last.into(),
    })
}

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests;
