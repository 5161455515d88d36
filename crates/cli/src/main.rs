//! The `diffrl` binary.

use std::io::Write;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: tensor ops allocate and free megabyte buffers at every
/// step, which glibc hands back to the kernel and faults in again; a BC step of the CPU VLA
/// config runs about 1.2x faster (docs/vla.md, "Speed against PyTorch").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`, 15 in mimalloc 3's (and 2's) `mi_option_t`, which libmimalloc-sys
/// declares but does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// mimalloc hands freed memory back to the kernel after a delay; a training step then touches
/// it again, and the kernel zeroes each 2 MiB huge page anew: on GRPO of the roundabout's joint
/// planner 2.7 s of 16 s were kernel time, 0.4 s without purging, at the same peak memory
/// (docs/run.md, "Memory the allocator keeps"). So nothing is handed back before exit, unless
/// MIMALLOC_PURGE_DELAY says otherwise.
#[allow(unsafe_code)] // the one unsafe call below
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mimalloc reads its options when it purges; setting one is allowed at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// Standard output that remembers whether its reader went away, so that `diffrl sim ... --json |
/// head` ends quietly, as `cat` piped to `head` does, instead of reporting the closed pipe as
/// an error of the command.
struct Stdout<W> {
    inner: W,
    closed: bool,
}

impl<W: Write> Stdout<W> {
    fn note<T>(&mut self, r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r
            && e.kind() == std::io::ErrorKind::BrokenPipe
        {
            self.closed = true;
        }
        r
    }
}

impl<W: Write> Write for Stdout<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = self.inner.write(buf);
        self.note(r)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let r = self.inner.flush();
        self.note(r)
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let mut stdout = Stdout {
        inner: std::io::stdout().lock(),
        closed: false,
    };
    let result = diffrl_cli::run_cli(std::env::args_os(), &mut stdout);
    // The reader of our output closed it (`| head`): nothing is left to tell it.
    if stdout.closed {
        return ExitCode::SUCCESS;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // clap renders its own help/usage/version messages.
            if let Some(c) = e.downcast_ref::<clap::Error>() {
                let _ = c.print();
                return if c.use_stderr() {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
