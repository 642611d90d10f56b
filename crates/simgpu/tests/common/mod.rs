//! What the cross-process simgpu tests share: children of the test binary that run one
//! role each with their own environment (simgpu reads the machine once per process), and a
//! guard that kills them.

use std::process::{Child, Command, Stdio};

/// A child of this binary running the test `child` as `role` (in the variable `role_var`),
/// with `env` on top of this environment less simgpu's machine variables, its standard
/// input `stdin`.
pub fn spawn_child(role_var: &str, role: &str, env: &[(&str, &str)], stdin: Stdio) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(role_var, role)
        .env_remove("SIMGPU_DEVICES")
        .env_remove("SIMGPU_MEM")
        .env_remove("SIMGPU_CHECKPOINT")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("starting the child")
}

/// Kills the children on drop, so that a failing test leaves none behind.
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
