//! The `diffrl` binary.

use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: tensor ops allocate and free megabyte buffers at every
/// step, which glibc hands back to the kernel and faults in again; a BC step of the CPU VLA
/// config runs about 1.2x faster (docs/vla.md, "Speed against PyTorch").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match diffrl_cli::run_cli(std::env::args_os(), &mut stdout) {
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
