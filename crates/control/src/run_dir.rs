//! The run folder: where the control sockets (and the node ledgers) live.
//!
//! A process under cudaw uses, in this order:
//! 1. `CUDAW_RUN_DIR`, when set: an absolute path to a private folder (created 0700 if
//!    missing; an existing one must be a real folder, owned by the user, writable by no one
//!    else). Anything else is refused: the operator chose it, and no other is tried.
//! 2. `$XDG_RUNTIME_DIR/cudaw`, when `XDG_RUNTIME_DIR` is set (and absolute).
//! 3. `/tmp/cudaw-UID`.
//! 4. When that belongs to another user (who may create it first) or is not private: a
//!    private `/tmp/cudaw-UID-XXXXXXXXXXXX` of the user's, an existing one reused, else a
//!    new one with a random name; with a warning naming the other owner.
//!
//! `cudaw-ckpt` ([`find_run_dirs`]) looks in every one of these that exists and is
//! private, so it finds a socket wherever the process had to put it.

use cudaw_files::{private_dir, DirError};
use std::path::{Path, PathBuf};

/// Where `/tmp` is (the parent of the default folders).
pub const TMP: &str = "/tmp";

/// The first place looked: `CUDAW_RUN_DIR`, else `$XDG_RUNTIME_DIR/cudaw`, else
/// `/tmp/cudaw-UID` (no check, nothing created: see [`open_run_dir`]).
pub fn run_dir(get: impl Fn(&str) -> Option<String>, uid: u32) -> PathBuf {
    if let Some(d) = get("CUDAW_RUN_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return Path::new(&d).join("cudaw");
    }
    PathBuf::from(format!("/tmp/cudaw-{uid}"))
}

/// [`run_dir`] from this process's environment.
pub fn run_dir_from_env(uid: u32) -> PathBuf {
    run_dir(|k| std::env::var(k).ok(), uid)
}

/// The folder a process uses, and what to warn about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedRunDir {
    /// The folder.
    pub path: PathBuf,
    /// Warnings for the log (a default folder taken by another user, a folder others may
    /// read).
    pub warnings: Vec<String>,
}

fn xdg(get: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    get("XDG_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .map(|p| p.join("cudaw"))
}

/// The user's own fallback folders in `tmp` (`cudaw-UID-*`, private), sorted.
fn fallbacks(tmp: &Path, uid: u32) -> Vec<PathBuf> {
    let prefix = format!("cudaw-{uid}-");
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .filter(|p| private_dir(p, uid, false).is_ok())
        .collect();
    v.sort();
    v
}

/// The run folder of a process of user `uid` (see the module's doc), created if missing.
/// `get` reads the environment; `tmp` is `/tmp` ([`TMP`]) but for tests.
pub fn open_run_dir(
    get: impl Fn(&str) -> Option<String>,
    uid: u32,
    tmp: &Path,
) -> Result<OpenedRunDir, String> {
    let mut warnings = Vec::new();
    if let Some(d) = get("CUDAW_RUN_DIR").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&d);
        return match private_dir(&p, uid, true) {
            Ok(note) => Ok(OpenedRunDir {
                path: p,
                warnings: note.into_iter().collect(),
            }),
            Err(e) => Err(format!("CUDAW_RUN_DIR={d}: {e}")),
        };
    }
    if let Some(p) = xdg(&get) {
        match private_dir(&p, uid, true) {
            Ok(note) => {
                return Ok(OpenedRunDir {
                    path: p,
                    warnings: note.into_iter().collect(),
                })
            }
            Err(e) => warnings.push(format!("not using $XDG_RUNTIME_DIR/cudaw: {e}")),
        }
    } else if let Some(v) = get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        warnings.push(format!(
            "XDG_RUNTIME_DIR={v} is not an absolute path; not using it"
        ));
    }
    let default = tmp.join(format!("cudaw-{uid}"));
    let why = match private_dir(&default, uid, true) {
        Ok(note) => {
            warnings.extend(note);
            return Ok(OpenedRunDir {
                path: default,
                warnings,
            });
        }
        Err(e) => e,
    };
    let taken = match &why {
        DirError::Owner { owner, .. } => format!(
            "{} belongs to another user (uid {owner}), who may have created it to take cudaw's sockets",
            default.display()
        ),
        e => e.to_string(),
    };
    let path = match fallbacks(tmp, uid).into_iter().next() {
        Some(p) => p,
        None => cudaw_files::create_unique_dir(tmp, &format!("cudaw-{uid}-"))
            .map_err(|e| format!("{taken}; and no private folder could be made instead: {e}"))?,
    };
    warnings.push(format!(
        "{taken}; using the private folder {} instead (cudaw-ckpt looks there too)",
        path.display()
    ));
    Ok(OpenedRunDir { path, warnings })
}

/// The folders a client of user `uid` looks for sockets in, in [`open_run_dir`]'s order:
/// only `CUDAW_RUN_DIR` when set (which must be absolute), else those of the others that
/// exist, are the user's and are private (a default folder another user made is never
/// looked into).
pub fn find_run_dirs(
    get: impl Fn(&str) -> Option<String>,
    uid: u32,
    tmp: &Path,
) -> Result<Vec<PathBuf>, String> {
    // An explicit folder is taken as named (it may be another user's: its socket then
    // refuses us, with the reason); the socket's peer is checked on connecting.
    if let Some(d) = get("CUDAW_RUN_DIR").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&d);
        if !p.is_absolute() {
            return Err(format!(
                "CUDAW_RUN_DIR={d}: {}",
                DirError::NotAbsolute { path: p }
            ));
        }
        return Ok(vec![p]);
    }
    let mut v: Vec<PathBuf> = xdg(&get).into_iter().collect();
    v.push(tmp.join(format!("cudaw-{uid}")));
    v.retain(|p| private_dir(p, uid, false).is_ok());
    v.extend(fallbacks(tmp, uid));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn env(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn an_explicit_run_folder_must_be_absolute_and_private() {
        let uid = cudaw_files::euid();
        let d = tempfile::tempdir().unwrap();
        let e =
            open_run_dir(env(vec![("CUDAW_RUN_DIR", "run".into())]), uid, d.path()).unwrap_err();
        assert_eq!(
            e,
            "CUDAW_RUN_DIR=run: run is not an absolute path (expected a private folder such as /run/user/UID/cudaw)"
        );
        assert!(find_run_dirs(env(vec![("CUDAW_RUN_DIR", "run".into())]), uid, d.path()).is_err());
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open_run_dir(
            env(vec![("CUDAW_RUN_DIR", open.to_string_lossy().into())]),
            uid,
            d.path(),
        )
        .unwrap_err();
        assert!(e.contains("writable by its group or others"), "{e}");
        // /etc: another user's folder (root's own, written by root alone, is used with a
        // warning that it holds other files). Nothing is created there.
        if uid != 0 {
            let e = open_run_dir(env(vec![("CUDAW_RUN_DIR", "/etc".into())]), uid, d.path())
                .unwrap_err();
            assert!(e.contains("belongs to uid 0"), "{e}");
        }
        let run = d.path().join("a/run");
        let got = open_run_dir(
            env(vec![("CUDAW_RUN_DIR", run.to_string_lossy().into())]),
            uid,
            d.path(),
        )
        .unwrap();
        assert_eq!(got.path, run);
        assert_eq!(
            std::fs::metadata(&run).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn the_default_folder_taken_by_another_user_falls_back_to_a_private_one() {
        let uid = cudaw_files::euid();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        // "Another user": a folder that is not private stands for one owned by someone
        // else when not root (chown needs root).
        let default = tmp.path().join(format!("cudaw-{uid}"));
        std::fs::create_dir(&default).unwrap();
        if uid == 0 {
            rustix::fs::chown(&default, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        } else {
            std::fs::set_permissions(&default, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let got = open_run_dir(env(vec![]), uid, tmp.path()).unwrap();
        assert_ne!(got.path, default);
        let name = got.path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(&format!("cudaw-{uid}-")), "{name}");
        assert_eq!(got.warnings.len(), 1, "{:?}", got.warnings);
        if uid == 0 {
            assert!(
                got.warnings[0].contains("belongs to another user (uid 65534)"),
                "{:?}",
                got.warnings
            );
        }
        // Reused by the next process; found by the client.
        let again = open_run_dir(env(vec![]), uid, tmp.path()).unwrap();
        assert_eq!(again.path, got.path);
        assert_eq!(
            find_run_dirs(env(vec![]), uid, tmp.path()).unwrap(),
            vec![got.path.clone()]
        );
    }

    #[test]
    fn xdg_first_then_tmp() {
        let uid = cudaw_files::euid();
        let tmp = tempfile::tempdir().unwrap();
        let xdg = tmp.path().join("xdg");
        std::fs::create_dir(&xdg).unwrap();
        std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
        let got = open_run_dir(
            env(vec![("XDG_RUNTIME_DIR", xdg.to_string_lossy().into())]),
            uid,
            tmp.path(),
        )
        .unwrap();
        assert_eq!(got.path, xdg.join("cudaw"));
        let got = open_run_dir(env(vec![]), uid, tmp.path()).unwrap();
        assert_eq!(got.path, tmp.path().join(format!("cudaw-{uid}")));
        assert_eq!(
            find_run_dirs(
                env(vec![("XDG_RUNTIME_DIR", xdg.to_string_lossy().into())]),
                uid,
                tmp.path()
            )
            .unwrap(),
            vec![xdg.join("cudaw"), tmp.path().join(format!("cudaw-{uid}"))]
        );
    }
}
