// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]
#![allow(dead_code)]
pub mod attacks;
pub mod fixtures;
pub mod metrics;
pub mod process;
pub mod server;

/// Raises this process's open-file limit towards `wanted` (up to the hard limit); returns it.
pub fn raise_fd_limit(wanted: u64) -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    limit.rlim_cur = limit.rlim_max.min(wanted);
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    limit.rlim_cur
}
