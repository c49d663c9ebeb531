//! The daemon (stub while it is written).

/// Runs the daemon with command-line arguments (without the program name); returns the exit
/// code: 0 after SIGINT/SIGTERM, 2 for bad arguments, 1 for a failure.
pub fn main_from_args(args: Vec<String>) -> i32 {
    let _ = args;
    1
}
