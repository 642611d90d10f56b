//! Where a process's trace goes: the timeline file's name (`CUDAW_TRACE_FILE`, `%p` for
//! the PID) and the process's name in it.

use std::path::{Path, PathBuf};

/// The timeline file of process `pid`: `configured` (`CUDAW_TRACE_FILE`, `%p` in it standing
/// for the PID, so that the processes a program starts, which inherit the variable, write
/// files of their own), or `cudaw-PID.trace.json` in the working folder.
pub fn trace_file_for(configured: Option<&Path>, pid: u32) -> PathBuf {
    match configured {
        Some(p) => {
            let text = p.to_string_lossy();
            if text.contains("%p") {
                PathBuf::from(text.replace("%p", &pid.to_string()))
            } else {
                p.to_path_buf()
            }
        }
        None => PathBuf::from(format!("cudaw-{pid}.trace.json")),
    }
}

/// This process's name in the timeline: its executable's file name, else `process`.
pub fn process_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_file_names() {
        assert_eq!(
            trace_file_for(None, 42),
            PathBuf::from("cudaw-42.trace.json")
        );
        assert_eq!(
            trace_file_for(Some(Path::new("/tmp/run.json")), 42),
            PathBuf::from("/tmp/run.json")
        );
        assert_eq!(
            trace_file_for(Some(Path::new("/tmp/run-%p-%p.json")), 42),
            PathBuf::from("/tmp/run-42-42.json")
        );
    }

    #[test]
    fn process_name_is_the_executable() {
        let exe = std::env::current_exe().unwrap();
        assert_eq!(
            process_name(),
            exe.file_name().unwrap().to_string_lossy().into_owned()
        );
    }
}
