use super::*;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn mkfifo(p: &Path) {
    rfs::mknodat(CWD, p, FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn a_new_file_is_private_and_replaces_a_regular_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.json");
    std::fs::write(&p, "old").unwrap();
    let other = d.path().join("other-link");
    std::fs::hard_link(&p, &other).unwrap();
    write_file(&p, |mut f| f.write_all(b"new")).unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
    // The other name of the old file still names the old bytes.
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "old");
    assert!(leftovers(d.path()).is_empty());
}

#[test]
fn a_path_without_a_file_name_is_refused() {
    let e = NewFile::create(Path::new("")).unwrap_err();
    assert!(matches!(e, FileError::NoFileName { .. }), "{e}");
    let e = NewFile::create(Path::new("/")).unwrap_err();
    assert!(matches!(e, FileError::NoFileName { .. }), "{e}");
}

#[test]
fn targets_that_are_not_regular_files_are_refused_and_stay() {
    let d = tempfile::tempdir().unwrap();
    let secret = d.path().join("secret");
    std::fs::write(&secret, "root only").unwrap();
    let link = d.path().join("link.json");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let fifo = d.path().join("fifo.json");
    mkfifo(&fifo);
    let sub = d.path().join("folder");
    std::fs::create_dir(&sub).unwrap();
    let sock = d.path().join("s.sock");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    for (p, kind, word) in [
        (&link, Kind::Symlink, "symbolic link"),
        (&fifo, Kind::Fifo, "FIFO"),
        (&sub, Kind::Directory, "folder"),
        (&sock, Kind::Socket, "socket"),
    ] {
        let e = write_file(p, |mut f| f.write_all(b"x")).unwrap_err();
        match &e {
            FileError::NotRegular { kind: k, path, .. } => {
                assert_eq!((*k, path.as_path()), (kind, p.as_path()))
            }
            other => panic!("{p:?}: {other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains(word) && msg.contains(&*p.to_string_lossy()),
            "{msg}"
        );
        // Still there, still what it was.
        assert_eq!(
            Kind::of_mode(std::fs::symlink_metadata(p).unwrap().mode()),
            kind
        );
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");
    assert!(leftovers(d.path()).is_empty());
    assert_eq!(
        check_output(&fifo).unwrap_err().to_string(),
        format!(
            "refusing to replace {}: it is a FIFO (named pipe), not a regular file",
            fifo.display()
        )
    );
}

#[test]
fn a_device_node_is_never_replaced() {
    let e = NewFile::create(Path::new("/dev/null")).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::NotRegular {
                kind: Kind::CharDevice,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "refusing to replace /dev/null: it is a character device, not a regular file"
    );
    let m = std::fs::symlink_metadata("/dev/null").unwrap();
    assert_eq!(Kind::of_mode(m.mode()), Kind::CharDevice);
}

#[test]
fn a_failed_or_abandoned_write_leaves_no_temporary_and_the_target_as_it_was() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("img");
    std::fs::write(&p, "before").unwrap();
    let e = write_file(&p, |mut f| {
        f.write_all(b"half")?;
        Err::<(), _>(io::Error::other("disk on fire"))
    })
    .unwrap_err();
    assert!(e.to_string().contains("disk on fire"), "{e}");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "before");
    assert!(leftovers(d.path()).is_empty());
    let f = NewFile::create(&p).unwrap();
    let tmp = f.temporary();
    assert!(tmp.exists());
    assert_eq!(std::fs::metadata(&tmp).unwrap().mode() & 0o777, 0o600);
    drop(f);
    assert!(!tmp.exists());
}

#[test]
fn temporary_names_are_unpredictable() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.json");
    let a = NewFile::create(&p).unwrap();
    let b = NewFile::create(&p).unwrap();
    assert_ne!(a.temporary(), b.temporary());
    let name = a
        .temporary()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let prefix = format!(".t.json.{}-", std::process::id());
    assert!(
        name.starts_with(&prefix) && name.ends_with(".tmp"),
        "{name}"
    );
    assert_eq!(name.len(), prefix.len() + 16 + 4, "{name}");
}

#[test]
fn a_target_swapped_for_a_fifo_before_the_rename_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.json");
    let mut f = NewFile::create(&p).unwrap();
    let tmp = f.temporary();
    (&f.file).write_all(b"x").unwrap();
    mkfifo(&p);
    let e = std::mem::replace(&mut f, NewFile::create(&d.path().join("u")).unwrap())
        .commit()
        .unwrap_err();
    assert!(
        matches!(
            e,
            FileError::NotRegular {
                kind: Kind::Fifo,
                ..
            }
        ),
        "{e}"
    );
    assert!(!tmp.exists());
    drop(f);
    assert!(leftovers(d.path()).is_empty());
}

#[test]
fn commit_returns_the_file_under_its_name() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("img");
    let f = NewFile::create(&p).unwrap();
    (&f.file).write_all(b"hello").unwrap();
    let mut f = f.commit().unwrap();
    use std::io::Seek;
    f.seek(io::SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello");
    assert!(leftovers(d.path()).is_empty());
}

#[test]
fn inputs_must_be_regular_files_and_a_fifo_does_not_block() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("img");
    std::fs::write(&img, "bytes").unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&img, &link).unwrap();
    let fifo = d.path().join("fifo");
    mkfifo(&fifo);
    // Followed by a requester, refused by a server.
    let mut s = String::new();
    open_input(&link, Follow::Yes)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "bytes");
    let e = open_input(&link, Follow::No).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::NotRegular {
                kind: Kind::Symlink,
                ..
            }
        ),
        "{e}"
    );
    for follow in [Follow::No, Follow::Yes] {
        let e = open_input(&fifo, follow).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "refusing to read {}: it is a FIFO (named pipe), not a regular file",
                fifo.display()
            )
        );
        let e = open_input(Path::new("/dev/null"), follow).unwrap_err();
        assert!(
            matches!(
                e,
                FileError::NotRegular {
                    kind: Kind::CharDevice,
                    ..
                }
            ),
            "{e}"
        );
        let e = open_input(d.path(), follow).unwrap_err();
        assert!(
            matches!(
                e,
                FileError::NotRegular {
                    kind: Kind::Directory,
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = open_input(&d.path().join("absent"), Follow::No).unwrap_err();
    assert_eq!(e.io_kind(), Some(io::ErrorKind::NotFound));
    // A FIFO opened by someone else (a client passing the descriptor) is refused too,
    // and a regular file's descriptor comes back blocking.
    let f = rfs::open(&fifo, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).unwrap();
    assert!(check_input(&f, &fifo).is_err());
    let f = rfs::open(&img, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()).unwrap();
    check_input(&f, &img).unwrap();
    assert!(!rfs::fcntl_getfl(&f).unwrap().contains(OFlags::NONBLOCK));
}

#[test]
fn private_folders() {
    let uid = euid();
    let d = tempfile::tempdir().unwrap();
    let e = private_dir(Path::new("run"), uid, true).unwrap_err();
    assert!(matches!(e, DirError::NotAbsolute { .. }), "{e}");
    assert!(!Path::new("run").exists());
    // Created 0700, parents too.
    let p = d.path().join("a/b/run");
    assert_eq!(private_dir(&p, uid, true).unwrap(), None);
    for q in [d.path().join("a"), d.path().join("a/b"), p.clone()] {
        assert_eq!(
            std::fs::metadata(&q).unwrap().mode() & 0o777,
            0o700,
            "{q:?}"
        );
    }
    // Not created when asked not to.
    let absent = d.path().join("absent");
    assert!(private_dir(&absent, uid, false).is_err());
    assert!(!absent.exists());
    // Readable by others: used, with a note; writable by others: refused.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(p.join("123.sock"), "").unwrap();
    // cudaw-ckpt's lock beside a released process's socket is cudaw's too.
    std::fs::write(p.join("123.release-lock"), "").unwrap();
    assert!(private_dir(&p, uid, true)
        .unwrap()
        .unwrap()
        .contains("chmod 700"));
    // Refused when it holds other files too (/etc, a home folder).
    std::fs::write(p.join("passwd"), "").unwrap();
    let e = private_dir(&p, uid, true).unwrap_err();
    assert!(
        e.to_string()
            .contains("holds files that are not cudaw's (such as passwd); refusing to use it"),
        "{e}"
    );
    std::fs::remove_file(p.join("passwd")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = private_dir(&p, uid, true).unwrap_err();
    assert!(
        e.to_string()
            .contains("writable by its group or others (mode 0777"),
        "{e}"
    );
    // A link to a folder is refused.
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&p, &link).unwrap();
    let e = private_dir(&link, uid, true).unwrap_err();
    assert!(
        matches!(
            e,
            DirError::NotADirectory {
                kind: Kind::Symlink,
                ..
            }
        ),
        "{e}"
    );
    // Another user's folder (as root only: chown needs it).
    let theirs = d.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    if uid == 0 {
        rfs::chown(&theirs, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        let e = private_dir(&theirs, uid, true).unwrap_err();
        assert_eq!(e.other_owner(), Some(65534));
    } else {
        let e = private_dir(&theirs, 0, false).unwrap_err();
        assert_eq!(e.other_owner(), Some(uid));
    }
    // Inside a folder others may write into, without the sticky bit: refused.
    let open = d.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = private_dir(&open.join("run"), uid, true).unwrap_err();
    assert!(matches!(e, DirError::Writable { .. }), "{e}");
    assert!(!open.join("run").exists());
    // A sticky one (as /tmp) is fine.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    private_dir(&open.join("run"), uid, true).unwrap();
    let u = create_unique_dir(&open, "cudaw-1-").unwrap();
    assert!(u
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("cudaw-1-"));
    assert_eq!(std::fs::metadata(&u).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn a_kept_temporary_stays_when_the_commit_fails() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("img");
    let mut f = NewFile::create(&p).unwrap();
    let tmp = f.temporary();
    f.keep();
    mkfifo(&p);
    assert!(f.commit().is_err());
    assert!(tmp.exists());
}
