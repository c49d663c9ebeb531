//! Running a child process whose kernel refuses some syscalls, as a container runtime's
//! default seccomp profile or a hardened host does, and a test thread whose kernel fails one
//! call on demand.
//!
//! This module owns the seccomp filters a test installs: in a child between `fork` and `exec`
//! ([`refuse_syscalls`]), or on one thread of its own ([`fail_on_this_thread`]). It never
//! filters the process's other threads.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// One BPF statement (a load or a return).
fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

/// A jump: `jt` instructions ahead when the accumulator equals `k`, else `jf`.
fn jump_eq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

/// Installs `prog` on the calling thread (after `PR_SET_NO_NEW_PRIVS`, so no privilege is
/// needed). Two `prctl` calls and nothing else: async-signal-safe, no allocation, so a forked
/// child may call it before `exec`.
fn install(prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with these options reads nothing but `fprog`, which points at `prog`; both
    // live across the calls. The filter applies to the calling thread only (no TSYNC flag).
    let installed = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const libc::sock_fprog,
            ) == 0
    };
    if installed {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes `cmd`'s child fail each of `syscalls` with `EPERM` (a seccomp filter installed
/// between fork and exec, with `PR_SET_NO_NEW_PRIVS`, so no privilege is needed).
pub fn refuse_syscalls(cmd: &mut Command, syscalls: &[libc::c_long]) {
    // The program is built here, in the parent: the child between fork and exec must not
    // allocate.
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    // Load the syscall number.
    let mut prog = vec![stmt(load, 0)];
    let n = syscalls.len() as u8;
    for (i, &nr) in syscalls.iter().enumerate() {
        prog.push(jump_eq(nr as u32, n - i as u8, 0)); // to the EPERM return
    }
    prog.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    prog.push(stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32));
    // SAFETY: the closure runs in the forked child before exec and calls only `install`
    // (two prctl calls, no allocation); `prog` was built above and moved in.
    unsafe {
        cmd.pre_exec(move || install(&prog));
    }
}

/// Runs the calling test binary again in a child whose kernel refuses `syscalls` (EPERM),
/// without `AIO_REQUIRE_ALL_BACKENDS`, skipping the tests whose names contain `skip` (the
/// caller's own); asserts that it passes with at least `min_skipped` tests saying
/// `skipped:`, and returns its output. What a suite does where a container's profile refuses
/// its kernel interface.
pub fn suite_passes_refusing(syscalls: &[libc::c_long], skip: &str, min_skipped: usize) -> String {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args(["--skip", skip, "--test-threads=2", "--nocapture"])
        .env_remove("AIO_REQUIRE_ALL_BACKENDS");
    refuse_syscalls(&mut cmd, syscalls);
    let out = cmd.output().expect("the suite in a child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let skipped = text.lines().filter(|l| l.starts_with("skipped: ")).count();
    assert!(
        skipped >= min_skipped,
        "every test skipped, saying why: {text}"
    );
    text
}

/// Makes the calling thread's `syscall` fail with `errno` whenever each `(argument number,
/// value)` of `when` holds (the argument's low 32 bits equal the value), for the rest of the
/// thread's life: a fault a test cannot get from the kernel on demand (`EAGAIN` from
/// `io_submit`, `EINTR` from a submitting `io_uring_enter`), chosen by arguments the engine
/// under test sets (the count of requests in one call, the enter's flags).
///
/// A seccomp filter of this thread alone (installed without `SECCOMP_FILTER_FLAG_TSYNC`, so
/// the process's other threads, the test harness's included, are not filtered); it also sets
/// the thread's `no_new_privs`. Neither can be undone: call it on a thread the test spawns for
/// the purpose, and keep the engine's drop (which runs there too if an assertion fails) clear
/// of the fault. Filters stack, so a thread may call it once per fault.
pub fn fail_on_this_thread(
    syscall: libc::c_long,
    when: &[(usize, u32)],
    errno: i32,
) -> std::io::Result<()> {
    // `struct seccomp_data`: nr (4 bytes), arch (4), instruction pointer (8), args (6 x 8).
    let low_word = if cfg!(target_endian = "big") { 4 } else { 0 };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    // Each check loads a word and jumps to the last instruction (allow) when it differs.
    let offsets = std::iter::once((0, syscall as u32)).chain(when.iter().map(|&(arg, value)| {
        assert!(arg < 6, "a syscall has six arguments");
        (16 + 8 * arg as u32 + low_word, value)
    }));
    let checks = 1 + when.len();
    let mut prog = Vec::with_capacity(2 * checks + 2);
    for (index, (offset, value)) in offsets.enumerate() {
        let later = checks - index - 1;
        prog.push(stmt(load, offset));
        // Past the later checks and the errno return.
        prog.push(jump_eq(value, 0, (2 * later + 1) as u8));
    }
    prog.push(stmt(ret, libc::SECCOMP_RET_ERRNO | errno as u32));
    prog.push(stmt(ret, libc::SECCOMP_RET_ALLOW));
    install(&prog)
}
