//! Finding the processes under cudaw: every `PID.sock` in the run folders.
//!
//! By default the folders are those `cudaw-ckpt status` looks in for the daemon's user
//! (`CUDAW_RUN_DIR` alone when set, else `$XDG_RUNTIME_DIR/cudaw`, `/tmp/cudaw-UID` and
//! the user's private `/tmp/cudaw-UID-*`); as root, also every user's:
//! `/run/user/*/cudaw` and `/tmp/cudaw-*`. `--run-dir` names the folders instead. A socket
//! is taken for its process only once the process itself answers on it (the client checks
//! the socket's peer).

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The run folders this daemon manages, each locked (`flock` on the folder itself, no
/// file made): two daemons never manage the same processes. A folder another daemon holds
/// is left to it.
#[derive(Default)]
pub struct DirLocks {
    /// Folder → its lock, and the folder's (device, inode) when locked.
    held: BTreeMap<PathBuf, (std::fs::File, (u64, u64))>,
    refused: std::collections::BTreeSet<PathBuf>,
}

impl DirLocks {
    /// Of `dirs`, those this daemon holds (locking the new ones); and those another
    /// daemon holds that were not refused before (to say once). Folders no longer listed
    /// are let go.
    pub fn keep(&mut self, dirs: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<PathBuf>) {
        // Gone, or made again since (another inode: the lock is on the old one).
        let id = |d: &Path| {
            std::fs::metadata(d).ok().map(|m| {
                (
                    std::os::unix::fs::MetadataExt::dev(&m),
                    std::os::unix::fs::MetadataExt::ino(&m),
                )
            })
        };
        self.held
            .retain(|d, (_, was)| dirs.contains(d) && id(d) == Some(*was));
        self.refused.retain(|d| dirs.contains(d));
        let (mut ours, mut newly_refused) = (Vec::new(), Vec::new());
        for d in dirs {
            if self.held.contains_key(&d) {
                ours.push(d);
                continue;
            }
            let Ok(f) = std::fs::File::open(&d) else {
                continue;
            };
            let Ok(m) = f.metadata() else { continue };
            let ino = (
                std::os::unix::fs::MetadataExt::dev(&m),
                std::os::unix::fs::MetadataExt::ino(&m),
            );
            match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    self.refused.remove(&d);
                    self.held.insert(d.clone(), (f, ino));
                    ours.push(d);
                }
                Err(_) => {
                    if self.refused.insert(d.clone()) {
                        newly_refused.push(d);
                    }
                }
            }
        }
        (ours, newly_refused)
    }
}

/// The folders to look in: `explicit` when given, else the defaults (see the module's
/// doc) as they exist now.
pub fn run_dirs(explicit: &[PathBuf], uid: u32) -> Vec<PathBuf> {
    if !explicit.is_empty() {
        return explicit.to_vec();
    }
    let mut dirs = cudaw_control::find_run_dirs(
        |k| std::env::var(k).ok(),
        uid,
        Path::new(cudaw_control::TMP),
    )
    .unwrap_or_default();
    if uid == 0 && std::env::var_os("CUDAW_RUN_DIR").is_none_or(|v| v.is_empty()) {
        dirs.extend(everyones(
            Path::new("/run/user"),
            Path::new(cudaw_control::TMP),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// Every user's run folders: `RUN_USER/*/cudaw` and `TMP/cudaw-*` that are real folders.
fn everyones(run_user: &Path, tmp: &Path) -> Vec<PathBuf> {
    let is_dir = |p: &PathBuf| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    let mut users: Vec<PathBuf> = std::fs::read_dir(run_user)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("cudaw"))
        .filter(is_dir)
        .collect();
    users.sort();
    let mut tmps: Vec<PathBuf> = std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cudaw-"))
        .map(|e| e.path())
        .filter(is_dir)
        .collect();
    tmps.sort();
    users.extend(tmps);
    users
}

/// The processes' sockets in `dirs`: PID → socket (the first folder naming a PID wins).
pub fn scan(dirs: &[PathBuf]) -> BTreeMap<u32, PathBuf> {
    let mut found = BTreeMap::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(cudaw_control::pid_of_socket) else {
                continue;
            };
            if e.file_type().is_ok_and(|t| t.is_socket()) {
                found.entry(pid).or_insert_with(|| e.path());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_run_folder_is_managed_by_one_daemon_at_a_time() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        let mut first = DirLocks::default();
        assert_eq!(first.keep(dirs.clone()), (dirs.clone(), vec![]));
        // A second daemon: both folders are the first's, said once.
        let mut second = DirLocks::default();
        assert_eq!(second.keep(dirs.clone()), (vec![], dirs.clone()));
        assert_eq!(second.keep(dirs.clone()), (vec![], vec![]));
        // The first lets one go (no longer listed): the second takes it.
        assert_eq!(
            first.keep(vec![dirs[0].clone()]),
            (vec![dirs[0].clone()], vec![])
        );
        assert_eq!(second.keep(dirs.clone()), (vec![dirs[1].clone()], vec![]));
        // The first ends: the second takes the other too.
        drop(first);
        assert_eq!(second.keep(dirs.clone()), (dirs.clone(), vec![]));
        // A folder made again (another inode) is locked again, not left on the old one.
        std::fs::remove_dir(&dirs[0]).unwrap();
        std::fs::create_dir(&dirs[0]).unwrap();
        assert_eq!(second.keep(dirs.clone()), (dirs.clone(), vec![]));
        let mut third = DirLocks::default();
        assert_eq!(third.keep(dirs.clone()), (vec![], dirs));
    }

    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn sockets_are_found_by_their_pid() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let _l1 = UnixListener::bind(a.path().join("12.sock")).unwrap();
        let _l2 = UnixListener::bind(b.path().join("12.sock")).unwrap();
        let _l3 = UnixListener::bind(b.path().join("40.sock")).unwrap();
        // Not processes' sockets: the daemon's own, a plain file, a lock.
        let _l4 = UnixListener::bind(b.path().join("node.sock")).unwrap();
        std::fs::write(b.path().join("41.sock"), "").unwrap();
        std::fs::write(b.path().join("40.release-lock"), "").unwrap();
        let dirs = [
            a.path().to_path_buf(),
            b.path().to_path_buf(),
            "/nonexistent".into(),
        ];
        let found = scan(&dirs);
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![12, 40]);
        assert_eq!(found[&12], a.path().join("12.sock"));
    }

    #[test]
    fn every_users_folders() {
        let run = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        for d in ["1000/cudaw", "1001"] {
            std::fs::create_dir_all(run.path().join(d)).unwrap();
        }
        for d in ["cudaw-1000", "cudaw-0-abc", "other"] {
            std::fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        std::fs::write(tmp.path().join("cudaw-file"), "").unwrap();
        let got = everyones(run.path(), tmp.path());
        let want = [
            run.path().join("1000/cudaw"),
            tmp.path().join("cudaw-0-abc"),
            tmp.path().join("cudaw-1000"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn explicit_folders_replace_the_defaults() {
        let d = vec![PathBuf::from("/x"), PathBuf::from("/y")];
        assert_eq!(run_dirs(&d, 0), d);
    }
}
