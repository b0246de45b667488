//! What the backend tests share.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The process `cmd` starts gets SIGKILL when the thread that started it (this test) dies,
/// even if the test is killed before its clean-up runs.
pub fn die_with_this_test(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}
