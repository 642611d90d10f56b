//! The configuration file, watched: the daemon polls its modification time, length and
//! inode every second ([`ConfigFile::poll`]) and parses it again when one changed. A file
//! that does not parse is refused with its line and reason, and the last good
//! configuration stays in force; only the first load's failure stops the daemon.

use cudaw_sched::{Config, ConfigError};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Parses a configuration's text (`cudaw_sched::Config::parse`).
pub type Parse = fn(&str) -> Result<Config, ConfigError>;

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Signature {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

/// The watched file and the configuration in force.
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    parse: Parse,
    seen: Option<Signature>,
    config: Config,
    loaded: SystemTime,
    error: Option<String>,
}

/// What a [`ConfigFile::poll`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A new configuration is in force.
    Reloaded,
    /// The file changed but is refused (the message names the file, the line and the
    /// reason); the last good configuration stays in force.
    Refused(String),
}

impl ConfigFile {
    /// Reads and parses `path`; the error names the file and, for a bad one, the line and
    /// the reason.
    pub fn load(path: &Path, parse: Parse) -> Result<ConfigFile, String> {
        let (seen, config) = read(path, parse)?;
        Ok(ConfigFile {
            path: path.to_path_buf(),
            parse,
            seen: Some(seen),
            config,
            loaded: SystemTime::now(),
            error: None,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// When the configuration in force was loaded.
    pub fn loaded(&self) -> SystemTime {
        self.loaded
    }

    /// Why the file as it is now is refused, if it is.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Looks at the file; parses it again if it changed.
    pub fn poll(&mut self) -> Option<Change> {
        let now = signature(&self.path).ok();
        if now.is_some() && now == self.seen {
            return None;
        }
        if now.is_none() && self.error.is_some() && self.seen.is_none() {
            // Still missing: said already.
            return None;
        }
        self.seen = now;
        match read(&self.path, self.parse) {
            Ok((seen, config)) => {
                self.seen = Some(seen);
                let was_refused = self.error.take().is_some();
                if config == self.config && !was_refused {
                    // Touched or rewritten with the same meaning.
                    return None;
                }
                self.config = config;
                self.loaded = SystemTime::now();
                Some(Change::Reloaded)
            }
            Err(e) => {
                let msg = format!("{e}; keeping the configuration loaded before");
                self.error = Some(msg.clone());
                Some(Change::Refused(msg))
            }
        }
    }
}

fn signature(path: &Path) -> std::io::Result<Signature> {
    let m = std::fs::metadata(path)?;
    Ok(Signature {
        modified: m.modified().ok(),
        len: m.len(),
        ino: m.ino(),
    })
}

/// The file's signature and configuration, or why not.
fn read(path: &Path, parse: Parse) -> Result<(Signature, Config), String> {
    let seen = signature(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((seen, config))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// A stand-in for `Config::parse` while the policy's parser is being written: `quantum
    /// = N` (milliseconds) lines, `#` comments; anything else is refused with its line.
    pub(crate) fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            match line
                .strip_prefix("quantum =")
                .and_then(|v| v.trim().parse::<u64>().ok())
            {
                Some(ms) => c.quantum = Duration::from_millis(ms),
                None => {
                    return Err(ConfigError {
                        line: i + 1,
                        message: format!("expected `quantum = MS`, found {line:?}"),
                    })
                }
            }
        }
        Ok(c)
    }

    /// Writes `text` so that the watcher sees a change even within one clock tick (the
    /// length differs, or a new inode).
    fn rewrite(path: &Path, text: &str) {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_change_is_applied_and_a_bad_file_keeps_the_last_good_one() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node.toml");
        std::fs::write(&p, "quantum = 30\n").unwrap();
        let mut f = ConfigFile::load(&p, parse).unwrap();
        assert_eq!(f.config().quantum, Duration::from_millis(30));
        assert_eq!(f.poll(), None, "nothing changed");

        rewrite(&p, "# tuned\nquantum = 40\n");
        assert_eq!(f.poll(), Some(Change::Reloaded));
        assert_eq!(f.config().quantum, Duration::from_millis(40));
        assert_eq!(f.error(), None);

        rewrite(&p, "quantum = 40\n\nquantum = soon\n");
        let Some(Change::Refused(msg)) = f.poll() else {
            panic!("a bad file must be refused")
        };
        assert!(msg.contains("line 3: expected `quantum = MS`"), "{msg}");
        assert!(msg.contains(&p.display().to_string()), "{msg}");
        assert!(
            msg.ends_with("keeping the configuration loaded before"),
            "{msg}"
        );
        assert_eq!(f.config().quantum, Duration::from_millis(40));
        assert_eq!(f.error(), Some(msg.as_str()));
        assert_eq!(f.poll(), None, "refused once, not every second");

        // The same good text as before the bad edit: in force again, the error gone.
        rewrite(&p, "quantum = 40\n");
        assert_eq!(f.poll(), Some(Change::Reloaded));
        assert_eq!(f.error(), None);
    }

    #[test]
    fn a_missing_file_is_refused_once_and_its_return_applied() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node.toml");
        std::fs::write(&p, "quantum = 30\n").unwrap();
        let mut f = ConfigFile::load(&p, parse).unwrap();
        std::fs::remove_file(&p).unwrap();
        let Some(Change::Refused(msg)) = f.poll() else {
            panic!("a removed file must be said")
        };
        assert!(msg.contains("No such file"), "{msg}");
        assert_eq!(f.poll(), None);
        assert_eq!(f.config().quantum, Duration::from_millis(30));
        std::fs::write(&p, "quantum = 35\n").unwrap();
        assert_eq!(f.poll(), Some(Change::Reloaded));
        assert_eq!(f.config().quantum, Duration::from_millis(35));
    }

    #[test]
    fn the_first_load_fails_with_the_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("node.toml");
        std::fs::write(&p, "bogus\n").unwrap();
        let e = ConfigFile::load(&p, parse).unwrap_err();
        assert!(
            e.ends_with("line 1: expected `quantum = MS`, found \"bogus\""),
            "{e}"
        );
        let e = ConfigFile::load(&d.path().join("none.toml"), parse).unwrap_err();
        assert!(e.contains("none.toml: No such file"), "{e}");
    }
}
